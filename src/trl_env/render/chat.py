"""Episodes whose observations are whole chat requests (an agent program's model calls through the gateway).

An env that answers with a ``ChatRequest`` (a ``str`` carrying the request's ``messages`` and ``tools``) is stepped
with a ``Reply`` (a ``str`` carrying the assistant message ``DeployedHistory.reply`` builds and the sampled tokens).
With ``history="deployed"`` each request is rendered as it stands, with its own tools (``ChatHistories``), instead
of appending the reply and an answer to the conversation: the row rule is unchanged (docs/agents.md).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trl_env.render.history import DeployedHistory
from trl_env.render.messages import REASONING_FIELDS, Message, call_arguments
from trl_env.render.processors.derived import from_tokenizer
from trl_env.render.tools.processor import ToolProcessor

__all__ = [
    "ChatHistories",
    "ChatRequest",
    "Reply",
    "SamplingEnv",
    "SamplingEnvFactory",
    "normalize",
    "token_bytes",
    "wire_message",
]

_KEEP = ("role", "content", "name", "tool_calls", "tool_call_id")


class ChatRequest(str):
    """An observation that is a whole chat request: its ``messages`` (and ``tools``) are rendered as they stand.

    The text is the last message's content (for transcripts).
    """

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...]
    max_tokens: int | None
    """The request's own cap on the turn (an agent call's ``max_tokens``); ``None``: the budgets' (``turn_request``)."""

    def __new__(
        cls, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = (), max_tokens: int | None = None
    ) -> ChatRequest:
        """``messages`` in the OpenAI chat format, ``tools`` as function schemas (``{"type": "function", ...}``)."""
        last = messages[-1].get("content") if messages else ""
        self = super().__new__(cls, last if isinstance(last, str) else json.dumps(last, ensure_ascii=False))
        self.messages, self.tools, self.max_tokens = tuple(messages), tuple(tools), max_tokens
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the messages and the cap across a process boundary
        return (ChatRequest, (self.messages, self.tools, self.max_tokens))


@runtime_checkable
class SamplingEnv(Protocol):
    """An env whose next turn asks for sampling settings of its own (an agent's: ``agent_env_factory(sampling=...)``).

    Checked once per env class (set ``turn_sampling`` in ``__init__`` or on the class). The engine reads
    ``turn_sampling`` (on its scheduler thread: keep it a plain attribute) before each turn is
    sampled and sends it as ``GenerationRequest.sampling``; a generator that cannot honour it fails the rollout with
    a ``ConfigError`` (``check_request_sampling``). Such turns are sampled off the trainer's policy (docs/agents.md).
    """

    turn_sampling: Mapping[str, float]
    """The next turn's own settings (``temperature``, ``top_p``); empty: the generator's."""


@runtime_checkable
class SamplingEnvFactory(Protocol):
    """An env factory that says, before any episode, which per-request settings its envs' turns may ask for.

    ``batch_rollout`` checks them against the generator first, so an unfit generator is refused before any episode.
    """

    request_sampling: frozenset[str]

    def __call__(self) -> Any:
        """A fresh env (a ``SamplingEnv``)."""
        ...


class Reply(str):
    """The action a chat env is stepped with: the content it is answered, with the reply as a chat pipeline sends it.

    Its text is ``message["content"]`` (``DeployedHistory.reply``: every sampled token less the one that ended the
    turn), not the processor's parse, so an agent's transcript records what the agent was answered.
    """

    message: Message
    """``DeployedHistory.reply``: ``content``, the reasoning in the template's field, ``tool_calls``."""
    reasoning_field: str | None
    """The key ``message`` carries the reasoning under (``None``: the template reads none)."""
    finish_reason: str
    """``"stop"`` or ``"length"`` (the generator's)."""
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int
    _tokens: tuple[str, ...] | None
    _decode_one: Callable[[int], str] | None
    _token_bytes: tuple[bytes, ...] | None
    _bytes_one: Callable[[int], bytes] | None

    def __new__(
        cls,
        action: str,
        message: Message,
        *,
        reasoning_field: str | None,
        finish_reason: str,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        prompt_tokens: int,
        tokens: Sequence[str] | None = None,
        decode_one: Callable[[int], str] | None = None,
        token_bytes: Sequence[bytes] | None = None,
        bytes_one: Callable[[int], bytes] | None = None,
    ) -> Reply:
        """See the fields; ``tokens`` / ``decode_one``: each id's text, or one id's (read on first use).

        ``token_bytes`` / ``bytes_one``: each id's bytes, or one id's (neither: each token's text encoded).
        """
        self = super().__new__(cls, action)
        self.message, self.reasoning_field, self.finish_reason = message, reasoning_field, finish_reason
        self.token_ids, self.logprobs, self.prompt_tokens = tuple(token_ids), tuple(logprobs), prompt_tokens
        self._tokens = None if tokens is None else tuple(tokens)
        self._decode_one = decode_one
        self._token_bytes = None if token_bytes is None else tuple(token_bytes)
        self._bytes_one = bytes_one
        return self

    @property
    def tokens(self) -> tuple[str, ...]:
        """Each sampled id decoded on its own, for ``logprobs`` in the answer.

        Decoded on first read: a call that asks for no logprobs costs one decode of the reply, not one per token.
        """
        if self._tokens is None:
            decode = self._decode_one
            self._tokens = tuple(decode(i) for i in self.token_ids) if decode is not None else ()
        return self._tokens

    @property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Each sampled id's own bytes (``token_bytes``), for ``logprobs``: whole where ``tokens`` shows U+FFFD.

        Read on first use, as ``tokens``.
        """
        if self._token_bytes is None:
            one = self._bytes_one
            self._token_bytes = (
                tuple(one(i) for i in self.token_ids) if one is not None else tuple(t.encode() for t in self.tokens)
            )
        return self._token_bytes

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the reply across a process boundary (process executor)
        fields = {"reasoning_field": self.reasoning_field, "finish_reason": self.finish_reason,
                  "token_ids": self.token_ids, "logprobs": self.logprobs, "prompt_tokens": self.prompt_tokens,
                  "tokens": self.tokens, "token_bytes": self.token_bytes}  # fmt: skip  # read here: no tokenizer
        return (_reply, (str(self), self.message, fields))


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte (``tokenizers``' ``ByteLevel`` pre-tokenizer and decoder)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


_BYTES = _byte_level_table()


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """One id's own bytes: what it adds to the UTF-8 of a text, even where it holds part of a character.

    Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) map each byte to a character: their pieces are read back
    through that table; SentencePiece byte pieces (``<0xE4>``) are that byte; special and added tokens, and any other
    vocabulary, are their decoded text (exact wherever an id holds whole characters).
    """
    if token_id not in getattr(tokenizer, "added_tokens_decoder", {}):
        piece = tokenizer.convert_ids_to_tokens(token_id)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        if isinstance(piece, str) and type(decoder).__name__ == "ByteLevel" and all(c in _BYTES for c in piece):
            return bytes(_BYTES[c] for c in piece)
        if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
    return str(tokenizer.decode([token_id], skip_special_tokens=False)).encode()


def _reply(action: str, message: Message, fields: dict[str, Any]) -> Reply:
    return Reply(action, message, **fields)


@dataclass
class ChatHistories:
    """One ``DeployedHistory`` per tool set a request carries (read once per set, then cached); thread-safe."""

    base: DeployedHistory
    """The engine's: used for requests without tools (or with exactly its ``ToolProcessor``'s tools)."""
    _cache: dict[str, DeployedHistory] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, tools: Sequence[Mapping[str, Any]]) -> DeployedHistory:
        """The history that renders with ``tools`` and parses the reply's calls in the template's format.

        Raises:
            ProcessorError: the template has no tool calling trl-env can read (from ``ToolFormat.read``).
        """
        processor = self.base.processor
        own = list(processor.format.tools) if isinstance(processor, ToolProcessor) else []
        if [dict(t) for t in tools] == own:
            return self.base
        key = json.dumps(list(tools), sort_keys=True, default=str)
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            return found
        tokenizer, kwargs = self.base.tokenizer, dict(self.base.template_kwargs)
        if tools:
            chosen: Any = ToolProcessor.from_tokenizer(tokenizer, list(tools), template_kwargs=kwargs)
        else:
            chosen = from_tokenizer(tokenizer, template_kwargs=kwargs)
        history = DeployedHistory.check(chosen, tokenizer, self.base.text, kwargs)
        with self._lock:
            return self._cache.setdefault(key, history)


def normalize(messages: Sequence[Mapping[str, Any]], history: DeployedHistory) -> list[Message]:
    """Messages as a client sends them, as the template takes them (what ``DeployedHistory.reply`` builds).

    Keeps role, content (text parts joined; ``None`` as ``""``), name, tool calls (JSON-string arguments parsed to a
    dict unless the template takes text), ``tool_call_id`` and the reasoning (in the template's field); a ``tool``
    message without a ``name`` gets its call's. Everything else a client echoes (``refusal``, ``annotations``, ...)
    is dropped: the template never reads it.
    """
    field_name = history.reasoning_field
    as_text = isinstance(history.processor, ToolProcessor) and history.processor.format.args_as_text
    names: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        m: Message = {k: message[k] for k in _KEEP if message.get(k) is not None}
        m["role"] = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        m["content"] = "" if content is None else content
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k)), None)
        if reasoning is not None and field_name is not None:
            m[field_name] = reasoning
        if m.get("tool_calls"):
            m["tool_calls"] = [_call(c, as_text) for c in m["tool_calls"]]
            names.update((c.get("id", ""), c["function"]["name"]) for c in m["tool_calls"])
        elif "tool_calls" in m:
            del m["tool_calls"]
        if m["role"] == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
        out.append(m)
    return out


def _call(call: Mapping[str, Any], as_text: bool) -> Message:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, (str, Mapping)):
        function["arguments"] = call_arguments(arguments, as_text=as_text)
    return {"id": call.get("id"), "type": call.get("type", "function"), "function": function}


def wire_message(reply: Reply) -> Message:
    """``reply.message`` as the OpenAI wire writes it: reasoning as ``reasoning_content``, arguments as JSON text."""
    message = dict(reply.message)
    reasoning = message.pop(reply.reasoning_field, None) if reply.reasoning_field else None
    calls = []
    for c in message.get("tool_calls") or ():
        name, arguments = c["function"]["name"], c["function"]["arguments"]
        text = call_arguments(arguments, as_text=True)
        calls.append({"id": c["id"], "type": "function", "function": {"name": name, "arguments": text}})
    out: Message = {"role": "assistant", "content": message.get("content") or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = reasoning
    return out
