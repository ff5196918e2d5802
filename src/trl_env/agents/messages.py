"""The Anthropic Messages dialect (``POST /v1/messages``): a parser to the one ``ChatCall`` and a writer of its answer.

A request's ``system``, ``text`` / ``thinking`` / ``tool_use`` / ``tool_result`` blocks become the chat messages a chat
pipeline would send (thinking to the template's reasoning field, tool uses to ``tool_calls``, tool results to ``tool``
messages); the answer is the chat wire's message (``answered_message``) written as content blocks, whole or as the
event sequence ``anthropic.lib.streaming`` accumulates. Shapes: ``anthropic.types.Message`` and its raw stream events.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from trl_env.agents.wire import ChatCall, WireError, answered_message, check_tool_results, dumps
from trl_env.render.chat import Reply

__all__ = ["answer_body", "error_body", "parse_request"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
}


def error_body(error: WireError) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}`` (its type for the status)."""
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _bad(message: str, param: str) -> WireError:
    return WireError(400, f"{param}: {message}", param=param)


def parse_request(body: bytes, memory: MutableMapping[str, Any]) -> ChatCall:
    """Read a Messages request into the one ``ChatCall``.

    ``memory`` is the episode's: the argument text of each tool call it answered (``arguments``), so a ``tool_use``
    sent back renders exactly as it was sampled (its ``input`` is an object: spacing and key order would be lost).

    Raises:
        WireError: 400: malformed, no ``max_tokens``, an unknown or unsupported block type, a server tool, a
            ``tool_result`` for a ``tool_use`` no earlier turn made.
    """
    try:
        data = json.loads(body)
    except ValueError as e:
        raise _bad(f"the body is not JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object", "body")
    cap = data.get("max_tokens")
    if not (isinstance(cap, int) and not isinstance(cap, bool) and cap > 0):
        raise _bad(f"max_tokens={cap!r}: a positive integer is required", "max_tokens")
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list of messages", "messages")
    messages = _system(data.get("system"))
    arguments: Mapping[str, str] = memory.get("arguments", {})
    for i, m in enumerate(raw):
        messages += _message(m, f"messages.{i}", arguments)
    check_tool_results(messages, "messages")
    tools = _tools(data.get("tools"))
    choice = data.get("tool_choice")
    chat_choice = _tool_choice(choice, {t["function"]["name"] for t in tools})
    for name, high in (("temperature", 1.0), ("top_p", 1.0)):  # Anthropic's ranges
        value = data.get(name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (number and 0.0 <= value <= high and (value > 0 or name == "temperature")):
            raise _bad(f"{name}={value!r}: must be a number in [0, {high}]", name)
    stop = data.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("'stop_sequences' must be a list of strings", "stop_sequences")
    parallel = None
    if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use") is not None:
        parallel = not choice["disable_parallel_tool_use"]
    asked = {  # in the chat route's names (info["env"]["agent_sampling"])
        "temperature": data.get("temperature"),
        "top_p": data.get("top_p"),
        "top_k": data.get("top_k"),
        "max_tokens": cap,
        "stop": stop,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "thinking": data.get("thinking"),
    }
    return ChatCall(
        messages=messages,
        tools=[] if chat_choice == "none" else tools,
        model=str(data.get("model") or ""),
        tool_choice=chat_choice,
        stream=bool(data.get("stream")),
        sampling={k: v for k, v in asked.items() if v is not None},
        max_tokens=cap,
        dialect="messages",
    )


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    return [{"role": "system", "content": _texts(system, "system")}]


def _texts(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("must be a string or a list of text blocks", param)
    out = []
    for k, block in enumerate(content):
        if not (isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            kind = block.get("type") if isinstance(block, Mapping) else None
            raise _bad(f"block type {kind!r}: only text blocks are taken here", f"{param}.{k}")
        out.append(block["text"])
    return "".join(out)


def _message(m: Any, param: str, arguments: Mapping[str, str]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user turn's tool results each a ``tool`` message, in order."""
    if not isinstance(m, Mapping) or m.get("role") not in ("user", "assistant"):
        raise _bad("a message must be an object with role 'user' or 'assistant'", f"{param}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of blocks", f"{param}.content")
    if m["role"] == "assistant":
        return [_assistant(content, f"{param}.content", arguments)]
    out: list[dict[str, Any]] = []
    for k, block in enumerate(content):
        where = f"{param}.content.{k}"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            if out and out[-1]["role"] == "user":  # consecutive text blocks: one user turn
                out[-1]["content"] += block["text"]
            else:
                out.append({"role": "user", "content": block["text"]})
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = block.get("content")
            text = _texts(result, f"{where}.content") if result is not None else ""
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            raise _bad(
                f"block type {kind!r}: a user turn takes text and tool_result blocks (the template renders text only)",
                where,
            )
    return out


def _assistant(content: list[Any], param: str, arguments: Mapping[str, str]) -> dict[str, Any]:
    """An assistant turn: thinking to the reasoning, text to the content, tool uses to ``tool_calls``."""
    texts, thoughts, calls = [], [], []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
            value = block.get("input")
            if not isinstance(value, Mapping):
                raise _bad("a tool_use block's input must be an object", f"{param}.{k}.input")
            sampled = arguments.get(block["id"])
            same = sampled is not None and _loads(sampled) == value  # the text it was answered with, if unchanged
            text = sampled if same and sampled is not None else json.dumps(value, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": text}}
            )
        else:
            raise _bad(
                f"block type {kind!r}: an assistant turn takes text, thinking and tool_use blocks", f"{param}.{k}"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Client tools as the chat wire sends them; server tools (``web_search_...``, ``bash_...``) refused."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of tools", "tools")
    out = []
    for k, tool in enumerate(tools):
        ok = isinstance(tool, Mapping) and tool.get("type", "custom") == "custom" and isinstance(tool.get("name"), str)
        if not ok or not isinstance(tool.get("input_schema"), Mapping):
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise _bad(
                f"tool type {kind!r}: the gateway serves client tools ({{'name', 'description', "
                "'input_schema'}); server tools run on Anthropic's servers",
                f"tools.{k}",
            )
        function = {"name": tool["name"]}
        if "description" in tool:
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, names: set[str]) -> str | dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if choice is None or kind == "auto":
        return "auto"
    if kind in ("none", "any"):
        return "none" if kind == "none" else "required"
    if kind == "tool" and choice.get("name") in names:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        f"tool_choice={choice!r}: use {{'type': 'auto' | 'any' | 'none'}} or {{'type': 'tool', 'name': <one "
        "of the tools>}}",
        "tool_choice",
    )


def answer_body(
    reply: Reply, call: ChatCall, *, model: str, call_ids: Iterator[str], memory: MutableMapping[str, Any]
) -> bytes:
    """The answer: a ``message`` object, or with ``stream`` its SSE events."""
    message = answered_message(reply, call_ids)
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    calls = message.get("tool_calls") or []
    if message.get("content") or not (calls or blocks):
        blocks.append({"type": "text", "text": message.get("content") or ""})
    kept = memory.setdefault("arguments", {})
    for c in calls:
        text = c["function"]["arguments"]
        value = _loads(text)
        kept[c["id"]] = text
        blocks.append(
            {
                "type": "tool_use",
                "id": c["id"],
                "name": c["function"]["name"],
                "input": value if isinstance(value, dict) else {},
            }
        )
    stop = "max_tokens" if reply.finish_reason == "length" else "tool_use" if calls else "end_turn"
    usage = {
        "input_tokens": reply.prompt_tokens,
        "output_tokens": len(reply.token_ids),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    answer = {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": call.model or model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not call.stream:
        return dumps(answer)
    return b"".join(_events(answer))


def _events(answer: dict[str, Any]) -> Iterator[bytes]:
    """The event sequence of a streamed message: the whole answer replayed (sampled whole, never token by token)."""

    def event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields}) + b"\n\n"

    usage = answer["usage"]
    start = {**answer, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield event("message_start", message=start)
    for k, block in enumerate(answer["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=k, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=k, delta={"type": "text_delta", "text": block["text"]})
        elif block["type"] == "thinking":
            yield event(
                "content_block_start", index=k, content_block={"type": "thinking", "thinking": "", "signature": ""}
            )
            yield event("content_block_delta", index=k, delta={"type": "thinking_delta", "thinking": block["thinking"]})
            yield event("content_block_delta", index=k, delta={"type": "signature_delta", "signature": ""})
        else:
            yield event("content_block_start", index=k, content_block={**block, "input": {}})
            yield event(
                "content_block_delta",
                index=k,
                delta={"type": "input_json_delta", "partial_json": dumps(block["input"]).decode()},
            )
        yield event("content_block_stop", index=k)
    delta = {"stop_reason": answer["stop_reason"], "stop_sequence": None}
    yield event("message_delta", delta=delta, usage={"output_tokens": usage["output_tokens"]})
    yield event("message_stop")
