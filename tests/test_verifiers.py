"""verifiers 0.4 environments as agent programs (trl_env.adapters.verifiers), run the way verifiers runs them.

The environments are real: a taskset and a multi-turn env built here (tests/vf_reply_tasks.py,
tests/vf_dialogue_tasks.py) and verifiers' own bundled OpenEnv taskset against the OpenEnv echo server of
experiment/examples. Their harness is verifiers' ``null`` chat program (a uv script, in verifiers' subprocess
runtime); verifiers runs in .venv-verifiers (scripts/install.sh), since its mcp 2 pin breaks OpenEnv in .venv.
The model is the real vLLM CPU server's OpenAI endpoint, then the gateway. Every reward is checked against the rubric
recomputed from verifiers' record of the episode, and every answer against the server itself (a seeded replay, or the
gateway's rows against what the server answered).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest

from trl_env import ConfigError, EnvError
from trl_env.adapters import verifiers as vf_adapter
from trl_env.adapters.verifiers import VerifiersProgram
from trl_env.agents.run import AgentRun

TESTS = Path(__file__).resolve().parent
EXAMPLES = TESTS.parent / "experiment" / "examples"
VF_PYTHON = TESTS.parent / ".venv-verifiers" / "bin" / "python"
SAMPLING = {"temperature": 1.0, "seed": 1234, "max_tokens": 12}  # seeded: the server answers a replay alike

sys.path.insert(0, str(TESTS))
import vf_rubrics  # noqa: E402  # the rubrics of vf_reply_tasks / vf_dialogue_tasks, which import verifiers


@pytest.fixture(scope="module")
def vf_python() -> str:
    if not VF_PYTHON.exists():
        message = f"no verifiers venv at {VF_PYTHON}: run `bash scripts/install.sh`"
        if os.environ.get("TRL_ENV_REQUIRE_VLLM") == "1":  # CI: the heavy venvs must be there
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return str(VF_PYTHON)


def program(vf_python, taskset, tmp_path, **options) -> VerifiersProgram:
    return VerifiersProgram.from_taskset(taskset, python=vf_python, import_paths=[TESTS], sampling=SAMPLING,
                                         episodes=tmp_path / "episodes.jsonl", **options)  # fmt: skip


def agent_run(server, seed, key: str = "EMPTY") -> AgentRun:
    return AgentRun(task=seed, seed=seed, base_url=server.base_url + "/v1", api_key=key, model=server.model)


def episodes(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]


def conversation(trace: dict) -> list[dict]:
    """The trace's messages (its nodes form one chain here), as the wire sends them."""
    return [{k: v for k, v in node["message"].items() if v is not None} for node in trace["nodes"]]


def replay(server, messages: list[dict]) -> str:
    """What the vLLM server answers to ``messages`` (with the episodes' seeded sampling)."""
    body = json.dumps({"model": server.model, "messages": messages, **SAMPLING}).encode()
    request = urllib.request.Request(
        server.base_url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def assert_answers_are_the_servers(server, messages: list[dict]) -> list[str]:
    """Each assistant message of ``messages`` is the server's answer to the messages before it."""
    replies = [m.get("content", "") for m in messages if m["role"] == "assistant"]
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            assert message.get("content", "") == replay(server, messages[:i]), f"message {i} is not the server's answer"
    assert replies, "the harness made no model call"
    return replies


# ---------------------------------------------------------------------------------------- configuration


def test_an_interpreter_without_verifiers_is_a_config_error_naming_the_install():
    with pytest.raises(ConfigError, match=r"pip install 'trl-env\[verifiers\]'"):
        VerifiersProgram.from_taskset("vf_reply_tasks", python=sys.executable if not _has_verifiers() else "/bin/true")


def _has_verifiers() -> bool:
    import importlib.util

    return importlib.util.find_spec("verifiers") is not None


def test_missing_uv_is_a_config_error(vf_python, monkeypatch):
    monkeypatch.setattr(vf_adapter.shutil, "which", lambda name, path=None: None if name == "uv" else name)
    with pytest.raises(ConfigError, match="uv"):
        VerifiersProgram.from_taskset("vf_reply_tasks", python=vf_python)


def test_a_taskset_verifiers_cannot_load_fails_at_construction_with_verifiers_reason(vf_python, tmp_path):
    with pytest.raises(ConfigError, match="no_such_taskset.*not found"):
        program(vf_python, "no_such_taskset", tmp_path)


def test_a_dataset_larger_than_the_taskset_is_refused_naming_its_size(vf_python, tmp_path):
    reply = program(vf_python, "vf_reply_tasks", tmp_path)  # 3 tasks
    try:
        assert reply.tasks == len(vf_rubrics.QUESTIONS) == 3
        with pytest.raises(ConfigError, match=r"dataset\(256\).*has 3 tasks.*dataset\(3\)"):
            reply.dataset(256)  # was 256 rows, 253 of them episodes failing with "the taskset has no task 3"
        with pytest.raises(ConfigError, match=r"has 3 tasks"):
            reply.dataset(2, start=2)
        assert reply.dataset()["prompt"] == ["0", "1", "2"]
        assert reply.dataset(2, start=1)["prompt"] == ["1", "2"]
    finally:
        reply.close()


# ---------------------------------------------------------------------------------------- the real vLLM server


def test_taskset_built_here_scores_the_servers_replies_with_its_own_rubric(vf_python, vllm_server, tmp_path):
    reply = program(vf_python, "vf_reply_tasks", tmp_path)
    try:

        async def together():  # two episodes at once, by position and by name; then a seed naming no task
            return await asyncio.gather(reply(agent_run(vllm_server, "0")), reply(agent_run(vllm_server, "q2")))

        rewards = dict(zip(["q0", "q2"], asyncio.run(together()), strict=True))
        with pytest.raises(EnvError, match="names no task"):
            asyncio.run(reply(agent_run(vllm_server, "q9")))
        unreachable = AgentRun(task="0", seed="0", base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
        with pytest.raises(EnvError, match="ProviderError"):  # verifiers' own account of the failed episode
            asyncio.run(reply(unreachable))
    finally:
        reply.close()
    for episode in episodes(tmp_path)[:2]:  # the unreachable endpoint's episode is recorded last, without an answer
        (trace,) = episode["traces"]
        name = episode["task"]["data"]["name"]
        messages = conversation(trace)
        assert messages[0] == {"role": "user", "content": vf_rubrics.QUESTIONS[int(name[1])]}
        (answer,) = assert_answers_are_the_servers(vllm_server, messages)
        assert (
            rewards[name]
            == pytest.approx(vf_rubrics.reply_score(answer.strip()))  # verifiers' Trace.last_reply is stripped
            == pytest.approx(trace["rewards"]["reply_score"]["score"])
        )
        assert trace["calls"][0]["endpoint"] == "/chat/completions" and trace["calls"][0]["model"] == vllm_server.model


def test_multi_turn_env_built_here_plays_every_turn_through_the_endpoint(vf_python, vllm_server, tmp_path):
    dialogue = program(vf_python, "vf_dialogue_tasks", tmp_path)
    try:
        reward = asyncio.run(dialogue(agent_run(vllm_server, "0")))
    finally:
        dialogue.close()
    ((trace,),) = [episode["traces"] for episode in episodes(tmp_path)]
    replies = trace["info"]["replies"]
    assert len(replies) == vf_rubrics.TURNS == len(trace["calls"])
    messages = conversation(trace)
    assert [m["content"] for m in messages if m["role"] == "user"] == [f"Say: {w}" for w in vf_rubrics.WORDS[:3]]
    assert [answer.strip() for answer in assert_answers_are_the_servers(vllm_server, messages)] == replies  # stripped
    assert reward == pytest.approx(vf_rubrics.dialogue_score(replies))


def test_bundled_openenv_taskset_rewards_are_what_the_openenv_server_reported(vf_python, vllm_server, tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    import openenv_echo

    log = tmp_path / "echo.jsonl"
    base_url, proc = openenv_echo.start_server(max_sessions=2, log=str(log))
    try:
        openenv_echo.wait_ready(base_url, proc)
        echo = program(vf_python, {"id": "openenv", "base_url": base_url}, tmp_path, max_turns=3)
        try:
            reward = asyncio.run(echo(agent_run(vllm_server, "0")))
        finally:
            echo.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    steps = [record for record in map(json.loads, log.read_text().splitlines()) if record["event"] == "step"]
    assert steps, "the model's replies never reached the OpenEnv server as actions"
    assert reward == pytest.approx(sum(step["reward"] for step in steps))
    ((trace,),) = [episode["traces"] for episode in episodes(tmp_path)]
    sent = [m["content"].strip() for m in conversation(trace) if m["role"] == "assistant"]
    assert [step["action"] for step in steps] == sent[: len(steps)]


# ---------------------------------------------------------------------------------------- through the gateway


def test_multi_turn_env_through_the_gateway_rows_token_exact_and_rewards_the_rubrics(vf_python, vllm_server, tmp_path):
    from agents_support import model_spans
    from async_support import Recorder
    from transformers import AutoTokenizer

    from trl_env import Budgets, VLLMServerGenerator, batch_rollout
    from trl_env.agents import agent_env_factory
    from trl_env.render.processors import from_tokenizer
    from trl_env.testing.templates import trl_templates

    tok = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]
    recorder = Recorder()
    gen = VLLMServerGenerator(vllm_server.base_url, model=vllm_server.model_dir, post=recorder, temperature=1.0)
    dialogue = VerifiersProgram.from_taskset("vf_dialogue_tasks", python=vf_python, import_paths=[TESTS],
                                             episodes=tmp_path / "episodes.jsonl")  # fmt: skip
    try:
        rollouts = batch_rollout(["0", "0", "say-words"], agent_env_factory(dialogue), from_tokenizer(tok), tok, gen,
                                 budgets=Budgets(max_turns=4, max_new_tokens=12), parse_truncated_turns=True,
                                 history="deployed", env_timeout=180)  # fmt: skip
    finally:
        dialogue.close()
    assert all(r.ending.value != "error" for r in rollouts), [r.error for r in rollouts]
    records = episodes(tmp_path)
    replies = [record["traces"][0]["info"]["replies"] for record in records]
    assert sorted(r.reward for r in rollouts) == pytest.approx(sorted(map(vf_rubrics.dialogue_score, replies)))
    answered, sent = recorder.answered()
    for r in rollouts:
        assert len(r.turns) == vf_rubrics.TURNS == r.info["env"]["agent_calls"]
        for row in r.rows:
            for start, end in model_spans(row):
                context = tuple(row.prompt_ids + row.completion_ids[:start])
                sampled = (row.completion_ids[start:end], row.logprobs[start:end])
                assert any((ids, lps) == sampled for ids, lps, _ in answered[context]), (r.seed, start)
            assert all(row.logprobs[i] == 0.0 for i, m in enumerate(row.env_mask) if not m)
    assert len(sent) == sum(len(r.turns) for r in rollouts)  # every server answer is a turn of one episode
    # what the agent was answered is what was sampled, less the token that ended the turn (in the turn's text, not in
    # the reply's content)
    ends = (*from_tokenizer(tok).stop_strings, tok.eos_token)
    said = sorted(_less_end(turn.text, ends).strip() for r in rollouts for turn in r.turns)
    assert said == sorted(reply for episode_replies in replies for reply in episode_replies)


def _less_end(text: str, ends: tuple[str, ...]) -> str:
    """``text`` without the one end-of-turn string it ends with, if any."""
    return next((text[: -len(end)] for end in ends if end and text.endswith(end)), text)


# ---------------------------------------------------------------------------------------- the docs' offline example


def test_the_docs_offline_example_trains_as_written(vf_python, monkeypatch):
    import re

    page = (TESTS.parent / "docs" / "verifiers.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "openenv_echo" in b]
    monkeypatch.chdir(TESTS.parent)  # the block runs from the repository's root, as the page says
    monkeypatch.setattr(sys, "path", list(sys.path))  # the block puts experiment/examples on it
    namespace: dict = {}
    made = not (TESTS.parent / "out").exists()  # the block's output_dir="out": removed after, if this test made it
    try:
        exec(compile(block, "docs/verifiers.md", "exec"), namespace)  # python=".venv-verifiers/bin/python", relative
    finally:
        if made:
            shutil.rmtree(TESTS.parent / "out", ignore_errors=True)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    steps = [logs for logs in trainer.state.log_history if "env/ending_error_rate" in logs]
    assert steps and all(logs["env/ending_error_rate"] == 0 for logs in steps), steps  # every episode scored
    assert namespace["program"].tasks == 4
