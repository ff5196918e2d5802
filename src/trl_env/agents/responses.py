"""The OpenAI Responses dialect (``POST /v1/responses``): a parser to the one ``ChatCall`` and a writer of its answer.

Input items become the chat messages a chat pipeline would send (the OpenAI Agents SDK's ``Converter.items_to_messages``
merges an answer's reasoning, message and function calls into one assistant turn, as here); the answer is the chat
wire's message (``answered_message``) written as ``reasoning`` / ``message`` / ``function_call`` output items, whole or
as the event sequence ``openai.lib.streaming.responses`` accumulates. The episode keeps its answered responses for
``previous_response_id`` (``memory``: the session's). Shapes: ``openai.types.responses.Response`` and its events.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from trl_env.agents.wire import (
    ChatCall,
    WireError,
    answered_message,
    check_tool_results,
    dumps,
    logprob_content,
)
from trl_env.render.chat import Reply

__all__ = ["answer_body", "parse_request"]

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_INCLUDE_LOGPROBS = "message.output_text.logprobs"
_REFUSED = {
    "background": "the gateway answers each call while it waits: background responses are not kept",
    "conversation": "the gateway keeps no conversations: send the whole input, or previous_response_id",
    "prompt": "stored prompt templates are not served: send the input",
}
"""Fields the gateway refuses when set (400, param the field)."""


def _bad(message: str, param: str) -> WireError:
    return WireError(400, message, param=param)


def parse_request(body: bytes, memory: MutableMapping[str, Any]) -> ChatCall:
    """Read a Responses request into the one ``ChatCall`` (chat messages, chat tools, chat ``tool_choice``).

    ``memory`` is the episode's (``Session.memory``): it holds the responses ``previous_response_id`` may name.

    Raises:
        WireError: 400 naming the field (``param``): malformed, an unknown item or part type, a non-function tool, a
            tool result for a call no earlier turn made, a ``previous_response_id`` this episode did not answer.
    """
    try:
        data = json.loads(body)
    except ValueError as e:
        raise _bad(f"the body is not JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object", "body")
    for name, why in _REFUSED.items():
        if data.get(name):
            raise _bad(f"{name}={data[name]!r}: {why}", name)
    previous = data.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        stored = memory.get("responses", {}).get(previous) if isinstance(previous, str) else None
        if stored is None:  # another episode's, an unstored one, or none at all: the same answer
            raise WireError(
                400,
                f"previous_response_id={previous!r}: no response of this episode has that id",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = [dict(m) for m in stored]
    raw = data.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list) and (raw or history):
        items = raw
    else:
        raise _bad("'input' must be a string or a non-empty list of items", "input")
    new = _messages(items)
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("'instructions' must be a string", "instructions")
    head = [{"role": "system", "content": instructions}] if instructions else []
    messages = head + history + new  # instructions are not carried over from previous_response_id (OpenAI's rule)
    if not any(m["role"] != "system" for m in messages):
        raise _bad("the input has no user, assistant or tool turn", "input")
    check_tool_results(messages, "input")
    tools = _tools(data.get("tools"))
    choice = _tool_choice(data.get("tool_choice"), {t["function"]["name"] for t in tools})
    cap = data.get("max_output_tokens")
    if cap is not None and not (isinstance(cap, int) and not isinstance(cap, bool) and cap > 0):
        raise _bad(f"max_output_tokens={cap!r}: must be a positive integer", "max_output_tokens")
    _check_range(data, "temperature", 0.0, 2.0)
    _check_range(data, "top_p", 0.0, 1.0, positive=True)
    top = data.get("top_logprobs") or 0
    if not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= 20):
        raise _bad(f"top_logprobs={top!r}: must be an integer from 0 to 20", "top_logprobs")
    include = data.get("include") or []
    if not (isinstance(include, list) and all(isinstance(i, str) for i in include)):
        raise _bad("'include' must be a list of strings", "include")
    text = _mapping(data.get("text"))
    text_format = _mapping(text.get("format")) or {"type": "text"}
    reasoning = _mapping(data.get("reasoning"))
    asked = {  # in the chat route's names: one record (info["env"]["agent_sampling"]) for every dialect
        "temperature": data.get("temperature"),
        "top_p": data.get("top_p"),
        "max_tokens": cap,
        "tool_choice": data.get("tool_choice"),
        "parallel_tool_calls": data.get("parallel_tool_calls"),
        "top_logprobs": data.get("top_logprobs"),
        "response_format": None if text_format.get("type") == "text" else text_format,
        "reasoning_effort": reasoning.get("effort"),
        "max_tool_calls": data.get("max_tool_calls"),
    }
    context = {
        "store": data.get("store") is not False,
        "history": messages[len(head) :],
        "echo": {
            "instructions": instructions,
            "previous_response_id": previous,
            "tools": list(data.get("tools") or []),
            "tool_choice": data.get("tool_choice") or "auto",
            "parallel_tool_calls": data.get("parallel_tool_calls") is not False,
            "temperature": data.get("temperature"),
            "top_p": data.get("top_p"),
            "max_output_tokens": cap,
            "store": data.get("store") is not False,
            "text": {"format": text_format},
            "metadata": data.get("metadata") or {},
            "truncation": "disabled",
        },
    }
    return ChatCall(
        messages=messages,
        tools=[] if choice == "none" else tools,  # as the chat route: a call written anyway stays text
        model=str(data.get("model") or ""),
        tool_choice=choice,
        stream=bool(data.get("stream")),
        logprobs=_INCLUDE_LOGPROBS in include or top > 0,
        top_logprobs=top,
        sampling={k: v for k, v in asked.items() if v is not None},
        max_tokens=cap,
        dialect="responses",
        context=context,
    )


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _check_range(data: Mapping[str, Any], name: str, low: float, high: float, positive: bool = False) -> None:
    value = data.get(name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is not None and not (number and low <= value <= high and (value > 0 or not positive)):
        raise _bad(f"{name}={value!r}: must be a number in [{low}, {high}]" + (" above 0" if positive else ""), name)


def _text(content: Any, param: str) -> str:
    """A content value's text: a string, or text parts joined; any other part (an image, a file) is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of parts", param)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise _bad(
                f"content part type {kind!r}: the gateway renders text parts only ({', '.join(_TEXT_PARTS)})",
                f"{param}[{k}]",
            )
    return "".join(texts)


def _messages(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages: an answer's reasoning, message and function calls join one assistant turn."""
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant turn the next reasoning / message / call may still join
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad("an input item must be an object", param)
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role in ("user", "system", "developer"):
            out.append({"role": "user" if role == "user" else "system", "content": _text(item.get("content"), param)})
            turn = None
        elif kind == "message" and role == "assistant":
            text = _text(item.get("content"), f"{param}.content")
            if turn is None or turn["content"] or turn.get("tool_calls"):
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            turn["content"] = text
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = _text(parts, f"{param}.content")
            if turn is None or turn["content"] or turn.get("tool_calls") or "reasoning_content" in turn:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            turn["reasoning_content"] = text
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(arguments, str) and isinstance(call_id, str)):
                raise _bad("a function_call item needs string 'call_id', 'name' and 'arguments'", param)
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad("a function_call_output item needs a string 'call_id'", param)
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), param)})
            turn = None
        elif kind == "message":
            raise _bad(f"message role {role!r}: use user, system, developer or assistant", f"{param}.role")
        else:
            raise _bad(
                f"input item type {kind!r}: the gateway takes message, reasoning, function_call and "
                "function_call_output items",
                f"{param}.type",
            )
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as the chat wire sends them (``strict`` kept, as a chat pipeline keeps it); others refused."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of function tools", "tools")
    out = []
    for k, tool in enumerate(tools):
        if not (isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(tool.get("name"), str)):
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise _bad(
                f"tools[{k}] (type {kind!r}): the gateway serves function tools ({{'type': 'function', "
                "'name': ...}); hosted tools run on OpenAI's servers",
                f"tools[{k}]",
            )
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, names: set[str]) -> str | dict[str, Any]:
    if choice is None or choice in ("auto", "none", "required"):
        return choice or "auto"
    name = choice.get("name") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    if name not in names:
        raise _bad(
            f"tool_choice={choice!r}: use 'auto', 'none', 'required' or {{'type': 'function', 'name': <one "
            "of the tools>}}",
            "tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def answer_body(
    reply: Reply, call: ChatCall, *, model: str, call_ids: Iterator[str], memory: MutableMapping[str, Any]
) -> bytes:
    """The answer: a ``response`` object, or with ``stream`` its events; kept in ``memory`` unless ``store=false``."""
    message = answered_message(reply, call_ids)
    rid = "resp_" + secrets.token_hex(12)
    output = _output(message, reply, call)
    cut = reply.finish_reason == "length"
    done = len(reply.token_ids)
    usage = {
        "input_tokens": reply.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": done,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.prompt_tokens + done,
    }
    response = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": call.model or model,
        "output": output,
        "usage": usage,
        **call.context["echo"],
    }
    if call.context["store"]:
        memory.setdefault("responses", {})[rid] = (*call.context["history"], message)
    if not call.stream:
        return dumps(response)
    return b"".join(_events(response, cut))


def _output(message: Mapping[str, Any], reply: Reply, call: ChatCall) -> list[dict[str, Any]]:
    """The output items: reasoning, the message (when it has text, or logprobs to carry), each function call."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        out.append(
            {
                "type": "reasoning",
                "id": "rs_" + secrets.token_hex(12),
                "summary": [],
                "status": "completed",
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
            }
        )
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls or call.logprobs:
        part = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
            "logprobs": logprob_content(reply, call.top_logprobs) if call.logprobs else [],
        }
        out.append(
            {
                "type": "message",
                "id": "msg_" + secrets.token_hex(12),
                "role": "assistant",
                "status": "incomplete" if reply.finish_reason == "length" else "completed",
                "content": [part],
            }
        )
    for c in calls:
        out.append(
            {
                "type": "function_call",
                "id": "fc_" + secrets.token_hex(12),
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
                "status": "completed",
            }
        )
    return out


def _events(response: dict[str, Any], cut: bool) -> Iterator[bytes]:
    """The event sequence of a streamed response: the whole answer replayed (sampled whole, never token by token)."""
    sequence = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": next(sequence), **fields}
        return b"event: " + kind.encode() + b"\ndata: " + dumps(body) + b"\n\n"

    start = {**response, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for k, item in enumerate(response["output"]):
        ids = {"item_id": item["id"], "output_index": k}
        if item["type"] == "function_call":
            yield event(
                "response.output_item.added", output_index=k, item={**item, "arguments": "", "status": "in_progress"}
            )
            yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids, arguments=item["arguments"], name=item["name"])
        elif item["type"] == "reasoning":
            yield event(
                "response.output_item.added", output_index=k, item={**item, "content": [], "status": "in_progress"}
            )
            text = item["content"][0]["text"]
            yield event("response.reasoning_text.delta", **ids, content_index=0, delta=text)
            yield event("response.reasoning_text.done", **ids, content_index=0, text=text)
        else:
            part = item["content"][0]
            yield event(
                "response.output_item.added", output_index=k, item={**item, "content": [], "status": "in_progress"}
            )
            yield event(
                "response.content_part.added", **ids, content_index=0, part={**part, "text": "", "logprobs": []}
            )
            yield event(
                "response.output_text.delta", **ids, content_index=0, delta=part["text"], logprobs=part["logprobs"]
            )
            yield event(
                "response.output_text.done", **ids, content_index=0, text=part["text"], logprobs=part["logprobs"]
            )
            yield event("response.content_part.done", **ids, content_index=0, part=part)
        yield event("response.output_item.done", output_index=k, item=item)
    yield event("response.incomplete" if cut else "response.completed", response=response)
