"""The OpenAI chat-completions wire: a validated reader for requests, and the answers' JSON bytes.

Requests are read by a small validator (a malformed one is a ``WireError``: a 400 with OpenAI's error body);
answers are plain dicts with the fields and shapes of ``openai.types.chat.ChatCompletion`` / ``ChatCompletionChunk``
(tests/test_agents_gateway.py reads them with the SDK), dumped once: no model is built per call. A stream is the whole
answer replayed as chunks (content, reasoning, calls, finish, usage), as OpenEnv's capture server
(``openenv.core.harness.capture.sse``) replays a complete response: the reply is sampled whole, never token by token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trl_env.errors import TrlEnvError
from trl_env.render.chat import Reply, wire_message

__all__ = [
    "ChatCall",
    "WireError",
    "answer_body",
    "answered_message",
    "check_tool_results",
    "dumps",
    "error_body",
    "logprob_content",
    "parse_request",
    "tool_choice_unmet",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_SAMPLING = (
    "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "max_tokens", "max_completion_tokens",
    "stop", "tool_choice", "parallel_tool_calls", "logit_bias", "response_format", "top_k", "min_p",
    "repetition_penalty",
)  # fmt: skip
"""Fields that would change what is sampled: recorded in the episode's info (``agent_sampling``); each is the
trainer's setting (on-policy) unless ``agent_env_factory(sampling="agent")`` honours it (``agent_overridden``)."""


class WireError(TrlEnvError, ValueError):
    """A request the gateway refuses; ``status`` and OpenAI's error fields (``type``, ``param``, ``code``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(error: WireError) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


@dataclass(frozen=True)
class ChatCall:
    """A validated ``POST /v1/chat/completions`` request."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    """The tools the request is rendered with: none with ``tool_choice="none"`` (so the reply's calls stay text)."""
    model: str
    tool_choice: str | dict[str, Any] = "auto"
    """``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}`` (validated)."""
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)
    """The sampling fields the agent set (``_SAMPLING``), with their values, as sent."""
    max_tokens: int | None = None
    """The call's own cap: the smaller of ``max_tokens`` and ``max_completion_tokens`` (``None``: neither set)."""
    dialect: str = "chat"
    """The wire the call came in on and is answered on: ``chat``, ``responses`` or ``messages`` (agents/dialects.py)."""
    context: Mapping[str, Any] = field(default_factory=dict)
    """What the dialect's writer needs besides (the request fields a Responses answer echoes, ...)."""


def _bad(message: str, param: str) -> WireError:
    return WireError(400, message, param=param)


def parse_request(body: bytes) -> ChatCall:
    """Read and validate a chat-completions request body.

    Raises:
        WireError: 400 naming the field (``param``) and what is wrong with it.
    """
    try:
        data = json.loads(body)
    except ValueError as e:
        raise _bad(f"the body is not JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object", "body")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(f"messages[{i}] must be an object with a role in {list(_ROLES)}", f"messages[{i}].role")
        content = m.get("content")
        if not (content is None or isinstance(content, (str, list))):
            raise _bad(f"messages[{i}].content must be a string, a list of parts or null", f"messages[{i}].content")
        if m["role"] == "developer":  # the same slot as a system message, for the chat template
            messages[i] = {**m, "role": "system"}
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(_is_call(c) for c in calls)):
            raise _bad(f"messages[{i}].tool_calls must be a list of function calls", f"messages[{i}].tool_calls")
    tools = data.get("tools") or []
    if not isinstance(tools, list) or not all(_is_tool(t) for t in tools):
        raise _bad("'tools' must be a list of {'type': 'function', 'function': {'name': ...}}", "tools")
    choice = data.get("tool_choice") or "auto"
    _check_tool_choice(choice, {t["function"]["name"] for t in tools})
    if data.get("n", 1) not in (1, None):
        raise _bad(f"n={data.get('n')!r}: the gateway samples one choice per call (n=1)", "n")
    caps = []
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise _bad(f"{name}={value!r}: must be a positive integer", name)
        caps += [] if value is None else [value]
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):  # OpenAI's ranges; vLLM's top_p > 0
        value = data.get(name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (number and low <= value <= high and (value > 0 or name == "temperature")):
            raise _bad(f"{name}={value!r}: must be a number in [{low}, {high}] (top_p above 0)", name)
    stop = data.get("stop")
    texts = isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    if not (stop is None or isinstance(stop, str) or texts):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    top = data.get("top_logprobs") or 0
    if not (isinstance(top, int) and 0 <= top <= 20):
        raise _bad(f"top_logprobs={top!r}: must be an integer from 0 to 20", "top_logprobs")
    return ChatCall(
        messages=messages,
        tools=[] if choice == "none" else tools,  # vLLM's --exclude-tools-when-tool-choice-none: no call is parsed
        model=str(data.get("model") or ""),
        tool_choice=choice,
        stream=bool(data.get("stream")),
        logprobs=bool(data.get("logprobs")),
        top_logprobs=top,
        sampling={k: data[k] for k in _SAMPLING if data.get(k) is not None},
        max_tokens=min(caps, default=None),
    )


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _is_tool(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("type", "function") == "function" and _is_call(tool)


def _check_tool_choice(choice: object, names: set[str]) -> None:
    if choice in ("auto", "none", "required"):
        return
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if name not in names:
        raise _bad(
            f"tool_choice={choice!r}: use 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': <one of the tools>}}",
            "tool_choice",
        )


def tool_choice_unmet(call: ChatCall, message: Mapping[str, Any]) -> bool:
    """Whether a reply did not follow a ``"required"`` or named ``tool_choice``: no call, or a call to another tool.

    Sampling is not constrained (vLLM's server constrains it with guided decoding; a processor cannot): the reply is
    answered as sampled and ``AgentEnv`` counts it in ``info["agent_tool_choice_unmet"]``.
    """
    calls = message.get("tool_calls") or ()
    if call.tool_choice == "required":
        return not calls
    if isinstance(call.tool_choice, Mapping):
        name = call.tool_choice["function"]["name"]
        return not calls or any(c["function"]["name"] != name for c in calls)
    return False


def finish_reason(reply: Reply) -> str:
    """``length`` (cut), ``tool_calls`` (the reply calls tools) or ``stop``."""
    if reply.finish_reason == "length":
        return "length"
    return "tool_calls" if reply.message.get("tool_calls") else "stop"


def answer_body(reply: Reply, call: ChatCall, *, id: str, created: int, model: str, call_ids: Iterator[str]) -> bytes:
    """The answer's bytes: a ``chat.completion`` object, or with ``stream`` the SSE ``data:`` lines of its chunks.

    ``call_ids`` names the reply's tool calls (unique within the episode: ``Session.call_ids``).
    """
    message = answered_message(reply, call_ids)
    logprobs = {"content": logprob_content(reply, call.top_logprobs), "refusal": None} if call.logprobs else None
    if not call.stream:
        choice = {"index": 0, "message": message, "finish_reason": finish_reason(reply), "logprobs": logprobs}
        head = {"id": id, "object": "chat.completion", "created": created, "model": model}
        return dumps({**head, "choices": [choice], "usage": _usage(reply)})
    head = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning_content"):
        deltas.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for i, c in enumerate(message.get("tool_calls") or ()):
        deltas.append({"tool_calls": [{"index": i, **c}]})
    chunks = [
        {
            **head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs if k == 0 else None}],
        }
        for k, delta in enumerate(deltas)
    ]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason(reply)}]})
    chunks.append({**head, "choices": [], "usage": _usage(reply)})
    return b"".join(b"data: " + dumps(chunk) + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON: every dialect's answer bytes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _usage(reply: Reply) -> dict[str, int]:
    done = len(reply.token_ids)
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": done, "total_tokens": reply.prompt_tokens + done}


def answered_message(reply: Reply, call_ids: Iterator[str]) -> dict[str, Any]:
    """The reply as the chat wire answers it (``wire_message``), its tool calls named from ``call_ids``.

    Every dialect writes this one message in its own shape, and reads it back to the same chat message.
    """
    message = wire_message(reply)
    for c in message.get("tool_calls") or ():
        c["id"] = next(call_ids)
    return message


def logprob_content(reply: Reply, top_logprobs: int) -> list[dict[str, Any]]:
    """One entry per sampled token of the turn, in order: the row's tokens, the token that ended the turn included.

    ``token`` is the id decoded on its own (U+FFFD where it holds part of a UTF-8 character); ``bytes`` are the id's
    own bytes (``Reply.token_bytes``), so the entries' bytes joined are the UTF-8 of the sampled text.
    ``top_logprobs`` lists the sampled token only (the server sends no more). The same list in every dialect that
    carries logprobs (docs/agents.md, "Logprobs").
    """
    content = []
    for token, raw, logprob in zip(reply.tokens, reply.token_bytes, reply.logprobs, strict=True):
        entry = {"token": token, "logprob": logprob, "bytes": list(raw)}
        content.append({**entry, "top_logprobs": [entry] if top_logprobs else []})
    return content


def check_tool_results(messages: list[dict[str, Any]], param: str) -> None:
    """Refuse a tool result that answers no call of the conversation it is sent with (as OpenAI and Anthropic do).

    Raises:
        WireError: 400 naming the call id.
    """
    made: set[object] = set()
    for m in messages:
        if m.get("role") == "assistant":
            made.update(c.get("id") for c in m.get("tool_calls") or ())
        elif m.get("role") == "tool" and m.get("tool_call_id") not in made:
            raise _bad(
                f"a tool result for call id {m.get('tool_call_id')!r}, which no earlier assistant turn of "
                "this conversation made",
                param,
            )
