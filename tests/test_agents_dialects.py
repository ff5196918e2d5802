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


CHAT_TOOLS = [  # an OpenAI function tool, as a client sends it (transformers' schema adds a "return" no wire carries)
    {"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")}}
    for t in tool_schemas([add])
]
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


# -- parity: the same conversation through each dialect gives identical rows ------------------------------------


def chat_tool_program(run):
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": f"task {run.seed}"}]
    for _ in range(4):
        message = (
            client.chat.completions.create(model=run.model, messages=messages, tools=CHAT_TOOLS).choices[0].message
        )
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float("The answer is 42" in (message.content or ""))
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": str(add(**json.loads(call.function.arguments)))}
            )
    return 0.0


def responses_tool_program(run):
    client = run.openai(max_retries=0)
    items = [{"role": "user", "content": f"task {run.seed}"}]
    for _ in range(4):
        answer = client.responses.create(model=run.model, input=items, tools=RESPONSES_TOOLS)
        items += [o.model_dump(exclude_none=True) for o in answer.output]
        calls = [o for o in answer.output if o.type == "function_call"]
        if not calls:
            return float("The answer is 42" in answer.output_text)
        for c in calls:
            items.append(
                {"type": "function_call_output", "call_id": c.call_id, "output": str(add(**json.loads(c.arguments)))}
            )
    return 0.0


def anthropic_tool_program(run):
    client = run.anthropic(max_retries=0)
    messages = [{"role": "user", "content": f"task {run.seed}"}]
    for _ in range(4):
        answer = client.messages.create(model=run.model, max_tokens=4096, messages=messages, tools=ANTHROPIC_TOOLS)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
        uses = [b for b in answer.content if b.type == "tool_use"]
        if not uses:
            return float("The answer is 42" in "".join(b.text for b in answer.content if b.type == "text"))
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": str(add(**u.input))} for u in uses]
        messages.append({"role": "user", "content": results})
    return 0.0


def tool_script(tokenizer, processor, thought):
    """Turn 0 calls add(40, 2) and turn 1 add(1, 2), as the template renders such replies; turn 2 answers."""
    fmt = processor.format

    def rendered(arguments):
        function = {"name": "add", "arguments": json.dumps(arguments) if fmt.args_as_text else arguments}
        message = {"role": "assistant", "content": thought, "tool_calls": [{"id": "call_0", "type": "function",
                                                                            "function": function}]}  # fmt: skip
        probe = [{"role": "user", "content": "probe"}]
        kwargs = {"tools": fmt.tools, "tokenize": False, **fmt.template_kwargs}
        prompt = tokenizer.apply_chat_template(probe, add_generation_prompt=True, **kwargs)
        reply = tokenizer.apply_chat_template([*probe, message], **kwargs)[len(prompt) :]
        return reply[: reply.find(fmt.call_stop) + len(fmt.call_stop)]

    replies = [rendered({"a": 40, "b": 2}), rendered({"a": 1, "b": 2})]
    final = (thought + "\n\n" if thought else "") + "The answer is 42" + processor.stop_strings[0]
    return lambda k, p: replies[k] if k < 2 else final


@pytest.mark.parametrize(
    ("name", "thought"),
    [
        ("pypi:qwen2_5", ""),  # ChatML
        ("pypi:qwen3", "<think>\nadding\n</think>"),  # Qwen 3 with reasoning and tools
        ("trl:deepseekv3", ""),  # a tool template TRL's environment_factory cannot parse (arguments as text)
    ],
)
def test_the_same_conversation_in_every_dialect_gives_identical_rows(name, thought):
    from agents_support import rows_of

    from trl_env.render.tools.processor import ToolProcessor

    tokenizer = load_tokenizer(name)
    processor = ToolProcessor.from_tokenizer(tokenizer, [add])
    script = tool_script(tokenizer, processor, thought)
    marker = "<|im_start|>assistant" if "qwen" in name else (lambda p: p.count(processor.format.call_marker))
    rows = {}
    for program in (chat_tool_program, responses_tool_program, anthropic_tool_program):
        generator = PromptReplyGenerator(tokenizer, script, marker=marker)
        rollouts = batch_rollout(["7", "8"], agent_env_factory(program), processor, tokenizer, generator,
                                 history="deployed")  # fmt: skip
        for r in rollouts:
            assert r.ending is Ending.ENV_DONE and r.reward == 1.0 and len(r.turns) == 3, (program, r.error)
        rows[program.__name__] = rows_of(rollouts)
    assert rows["responses_tool_program"] == rows["chat_tool_program"]
    assert rows["anthropic_tool_program"] == rows["chat_tool_program"]


# -- hostile clients, per dialect: refused in the dialect's error shape, nothing recorded -------------------------


@pytest.fixture(scope="module")
def small_gateway():
    from trl_env.agents import Gateway

    g = Gateway(max_body=20_000, read_timeout_s=2.0)
    yield g
    g.shutdown()


def post(run, path, body, *, key=None, raw=None):
    import httpx

    headers = {"Authorization": f"Bearer {key or run.api_key}", "content-type": "application/json"}
    if path == "/messages":
        headers = {
            "x-api-key": key or run.api_key,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        }
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{run.base_url}{path}", content=content, headers=headers, timeout=60)


HOSTILE = {
    "/responses": [
        (b"{not json", 400),
        ({"model": "m", "input": [{"type": "image_generation_call", "id": "x"}]}, 400),  # an unknown item type
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400),
        ({"model": "m", "input": [{"role": "user", "content": "hi"},
                                  {"type": "function_call_output", "call_id": "call_9", "output": "1"}]}, 400),
        ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, 400),
        ({"model": "m", "input": "hi", "background": True}, 400),
        ({"model": "m", "input": "x" * 30_000}, 413),
    ],
    "/messages": [
        (b"{not json", 400),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 400),  # no max_tokens
        ({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "audio", "x": 1}]}]}, 400),
        ({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_9", "content": "1"}]}]}, 400),
        ({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400),
        ({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x" * 30_000}]}, 413),
    ],
}  # fmt: skip


def shape(path, response):
    body = response.json()
    if path == "/messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return body["error"]["type"]
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["code"] or body["error"]["type"]


@pytest.mark.parametrize("path", ["/responses", "/messages"])
def test_hostile_calls_are_refused_in_the_dialects_shape_and_record_nothing(qwen3, small_gateway, path):
    kept = {}
    valid = (
        {"model": "m", "input": "hi"} if path == "/responses" else
        {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    )  # fmt: skip

    def first(run):
        kept["run"] = run
        kept["first"] = post(run, path, valid).json()
        return 1.0

    (done,), _ = run(qwen3, first, gateway=small_gateway, script=lambda k, p: qwen3_script(1, p))
    assert done.reward == 1.0, done.error
    rows_before = [(r.prompt_ids, r.completion_ids) for r in done.rows]
    seen = []

    def second(run):
        for body, status in HOSTILE[path]:
            raw = body if isinstance(body, bytes) else None
            answer = post(run, path, body, raw=raw)
            seen.append((answer.status_code, status, shape(path, answer)))
        answer = post(run, path, valid, key="trlenv-guessed")
        seen.append((answer.status_code, 401, shape(path, answer)))
        answer = post(kept["run"], path, valid)  # the ended episode's key
        seen.append((answer.status_code, 409, shape(path, answer)))
        if path == "/responses":  # the other episode's response: not this episode's to continue
            answer = post(run, path, {"model": "m", "input": "more", "previous_response_id": kept["first"]["id"]})
            seen.append((answer.status_code, 400, shape(path, answer)))
        return float(post(run, path, valid).status_code == 200)

    (other,), generator = run(qwen3, second, gateway=small_gateway, script=lambda k, p: qwen3_script(1, p))
    assert other.reward == 1.0, other.error
    assert [(got, want) for got, want, _ in seen] == [(want, want) for _, want, _ in seen], seen
    assert len(generator.requests) == 1 and len(other.turns) == 1  # only the valid call was sampled
    assert [(r.prompt_ids, r.completion_ids) for r in done.rows] == rows_before
    kinds = {kind for _, _, kind in seen}
    if path == "/messages":
        assert kinds == {"invalid_request_error", "request_too_large", "authentication_error"}
    else:
        assert "previous_response_not_found" in kinds and "episode_ended" in kinds


def test_previous_response_id_continues_within_an_episode_and_store_false_keeps_nothing(qwen3):
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        kept = client.responses.create(model=run.model, input="hi")
        unkept = client.responses.create(model=run.model, input="hi", store=False)
        more = client.responses.create(model=run.model, input="more", previous_response_id=kept.id)
        try:
            client.responses.create(model=run.model, input="more", previous_response_id=unkept.id)
        except openai.BadRequestError as e:
            seen.append(e.body["code"])
        seen.append(more.previous_response_id == kept.id)
        return 1.0

    (rollout,), generator = run(qwen3, program, script=lambda k, p: qwen3_script(1, p))
    assert rollout.reward == 1.0, rollout.error
    assert seen == ["previous_response_not_found", True] and len(generator.requests) == 3
    first, third = qwen3.decode(generator.requests[0]), qwen3.decode(generator.requests[2])
    assert third.startswith(first) and third.rstrip().endswith("more<|im_end|>\n<|im_start|>assistant")
