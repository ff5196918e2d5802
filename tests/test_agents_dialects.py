"""The Responses and Anthropic Messages dialects with their real SDKs: ``openai``'s ``client.responses`` (sync, async,
streamed) and ``anthropic``'s ``messages.create`` / ``messages.stream``, with tools and reasoning, against the gateway
and a scripted generator on the real Qwen 3 tokenizer."""

from __future__ import annotations

import json

import openai
import pytest
from agents_support import PromptReplyGenerator

from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.render.tools.format import tool_schemas
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

anthropic = pytest.importorskip("anthropic")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


CHAT_TOOLS = tool_schemas([add])
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
ANTHROPIC_TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (t["function"] for t in CHAT_TOOLS)
]


def qwen3_script(k, prompt):
    """Turn 0 thinks and calls add(40, 2); turn 1 answers in text."""
    if k == 0:
        call = json.dumps({"name": "add", "arguments": {"a": 40, "b": 2}})
        return f"<think>\nI should add.\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    return "<think>\nDone.\n</think>\n\nThe answer is 42<|im_end|>"


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("pypi:qwen3")


def run(tokenizer, program, seeds=("s",), script=qwen3_script, gateway=None, **kwargs):
    generator = PromptReplyGenerator(tokenizer, script)
    rollouts = batch_rollout(list(seeds), agent_env_factory(program, gateway=gateway), from_tokenizer(tokenizer),
                             tokenizer, generator, history="deployed", **kwargs)  # fmt: skip
    return rollouts, generator


def responses_program(seen, *, stream=False, chain=False):
    def program(run):
        client = run.openai(max_retries=0)
        items = [{"role": "user", "content": "What is 40 + 2?"}]
        first = _create(client, run, items, stream, include=["message.output_text.logprobs"])
        seen["first"] = first
        calls = [o for o in first.output if o.type == "function_call"]
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": str(add(**json.loads(c.arguments)))}
                   for c in calls]  # fmt: skip
        if chain:  # the gateway keeps the episode's responses
            second = _create(client, run, outputs, stream, previous_response_id=first.id)
        else:
            second = _create(client, run, items + [o.model_dump(exclude_none=True) for o in first.output] + outputs,
                             stream)  # fmt: skip
        seen["second"] = second
        return float(second.output_text == "The answer is 42")

    return program


def _create(client, run, items, stream, **kwargs):
    if not stream:
        return client.responses.create(model=run.model, input=items, tools=RESPONSES_TOOLS, **kwargs)
    with client.responses.stream(model=run.model, input=items, tools=RESPONSES_TOOLS, **kwargs) as events:
        kinds = [event.type for event in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        return events.get_final_response()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chain", [False, True])
def test_responses_sync_with_tools_reasoning_logprobs_usage_and_previous_response_id(qwen3, stream, chain):
    seen = {}
    (rollout,), generator = run(qwen3, responses_program(seen, stream=stream, chain=chain))
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    first = seen["first"]
    assert [o.type for o in first.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = first.output
    assert reasoning.content[0].text == "I should add."
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_0", "add", {"a": 40, "b": 2})
    out = generator.outputs[0]
    assert [t.logprob for t in message.content[0].logprobs] == out.logprobs
    assert b"".join(bytes(t.bytes) for t in message.content[0].logprobs) == qwen3.decode(out.token_ids).encode()
    assert first.usage.output_tokens == len(out.token_ids) and first.usage.input_tokens == len(generator.requests[0])
    assert first.status == "completed" and seen["second"].output_text == "The answer is 42"
    # both calls were rendered as one conversation: the second extends the first's row
    assert len(rollout.rows) == 1 and len(generator.requests) == 2
    assert generator.requests[1][: len(generator.requests[0])] == generator.requests[0]


def test_responses_async_client_streams_with_create(qwen3):
    kinds = []

    async def program(run):
        client = run.async_openai(max_retries=0)
        stream = await client.responses.create(model=run.model, input="What is 40 + 2?", tools=RESPONSES_TOOLS,
                                               stream=True)  # fmt: skip
        final = None
        async for event in stream:
            kinds.append(event.type)
            final = getattr(event, "response", final)
        call = next(o for o in final.output if o.type == "function_call")
        second = await client.responses.create(model=run.model, previous_response_id=final.id, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"}])  # fmt: skip
        return float(second.output_text == "The answer is 42")

    (rollout,), _ = run(qwen3, program)
    assert rollout.reward == 1.0, rollout.error
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.done" in kinds


def anthropic_program(seen, *, stream=False):
    def program(run):
        client = run.anthropic(max_retries=0)
        messages = [{"role": "user", "content": "What is 40 + 2?"}]
        kwargs = {"model": run.model, "max_tokens": 200, "tools": ANTHROPIC_TOOLS, "system": "You add.",
                  "thinking": {"type": "enabled", "budget_tokens": 100}}  # fmt: skip
        for _ in range(3):
            if stream:
                with client.messages.stream(messages=messages, **kwargs) as events:
                    kinds = [event.type for event in events]
                    answer = events.get_final_message()
                seen.setdefault("kinds", []).append(kinds)
            else:
                answer = client.messages.create(messages=messages, **kwargs)
            seen.setdefault("answers", []).append(answer)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
            uses = [b for b in answer.content if b.type == "tool_use"]
            if not uses:
                return float(answer.content[-1].text == "The answer is 42")
            results = [{"type": "tool_result", "tool_use_id": u.id, "content": str(add(**u.input))} for u in uses]
            messages.append({"role": "user", "content": results})
        return 0.0

    return program


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_with_tools_and_thinking(qwen3, stream):
    seen = {}
    (rollout,), generator = run(qwen3, anthropic_program(seen, stream=stream))
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    first, second = seen["answers"]
    assert [b.type for b in first.content] == ["thinking", "tool_use"] and first.stop_reason == "tool_use"
    assert first.content[0].thinking == "I should add."
    assert (first.content[1].id, first.content[1].name, first.content[1].input) == ("call_0", "add", {"a": 40, "b": 2})
    assert [b.type for b in second.content] == ["thinking", "text"] and second.stop_reason == "end_turn"
    assert first.usage.output_tokens == len(generator.outputs[0].token_ids)
    assert first.usage.input_tokens == len(generator.requests[0])
    assert len(rollout.rows) == 1 and generator.requests[1][: len(generator.requests[0])] == generator.requests[0]
    prompt = qwen3.decode(generator.requests[0])
    assert prompt.startswith("<|im_start|>system\nYou add.") and '"name": "add"' in prompt
    if stream:
        assert seen["kinds"][0][0] == "message_start" and seen["kinds"][0][-1] == "message_stop"


def test_anthropic_async_client(qwen3):
    async def program(run):
        client = run.async_anthropic(max_retries=0)
        answer = await client.messages.create(model=run.model, max_tokens=50, messages=[
            {"role": "user", "content": "hi"}])  # fmt: skip
        return float(answer.content[-1].text == "The answer is 42")

    (rollout,), _ = run(qwen3, program, script=lambda k, p: qwen3_script(1, p))
    assert rollout.reward == 1.0, rollout.error


def test_the_sdks_reach_the_http_endpoint_too(qwen3):
    """Clients built on the URL (another process's view): the same answers over loopback HTTP."""

    def program(run):
        client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0)
        first = client.responses.create(model=run.model, input="What is 40 + 2?", tools=RESPONSES_TOOLS, stream=True)
        final = [e for e in first if e.type == "response.completed"][0].response
        call = next(o for o in final.output if o.type == "function_call")
        other = anthropic.Anthropic(base_url=run.root_url, api_key=run.api_key, max_retries=0)
        answer = other.messages.create(model=run.model, max_tokens=50, tools=ANTHROPIC_TOOLS, messages=[
            {"role": "user", "content": "What is 40 + 2?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call.call_id, "name": "add",
                                               "input": json.loads(call.arguments)}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.call_id, "content": "42"}]},
        ])  # fmt: skip
        return float(answer.content[-1].text == "The answer is 42")

    (rollout,), _ = run(qwen3, program, gateway=None)
    assert rollout.reward == 1.0, rollout.error
