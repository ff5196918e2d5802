"""The wires the gateway speaks, each a parser to the one ``ChatCall`` and a writer of the one ``Reply``.

``chat`` (``POST /v1/chat/completions``, agents/wire.py), ``responses`` (``POST /v1/responses``, agents/responses.py)
and ``messages`` (Anthropic's ``POST /v1/messages``, agents/messages.py). Both transports (the HTTP endpoint and the
in-process one, agents/local.py) serve them from this table; nothing else knows a dialect. See docs/agents.md.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import trl_env.agents.messages as messages
import trl_env.agents.responses as responses
import trl_env.agents.wire as wire
from trl_env.agents.wire import ChatCall, WireError
from trl_env.render.chat import Reply

__all__ = ["DIALECTS", "Dialect", "dialect_for_path"]


def _chat_parse(body: bytes, memory: MutableMapping[str, Any]) -> ChatCall:
    return wire.parse_request(body)


def _chat_answer(
    reply: Reply, call: ChatCall, *, model: str, call_ids: Iterator[str], memory: MutableMapping[str, Any]
) -> bytes:
    made, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    return wire.answer_body(reply, call, id=made, created=created, model=call.model or model, call_ids=call_ids)


@dataclass(frozen=True)
class Dialect:
    """One wire: where it is served, how a request is read and an answer and an error written."""

    name: str
    path: str
    """The route under the server root, e.g. ``/v1/responses``."""
    parse: Callable[[bytes, MutableMapping[str, Any]], ChatCall]
    """The body and the episode's ``Session.memory`` to the one request model (raises ``WireError``)."""
    answer: Callable[..., bytes]
    """``(reply, call, *, model, call_ids, memory)`` to the answer's bytes (SSE events with ``call.stream``)."""
    error_body: Callable[[WireError], dict[str, Any]]
    """A refusal in the dialect's shape."""
    key_header: str | None = None
    """A header that carries the key besides ``Authorization: Bearer`` (Anthropic's ``x-api-key``)."""

    def authorization(self, headers: Mapping[str, str]) -> str:
        """The ``Authorization`` value the gateway checks: the header itself, or ``key_header``'s key as a bearer."""
        given = headers.get("authorization", "")
        if not given and self.key_header is not None and headers.get(self.key_header):
            return "Bearer " + headers[self.key_header]
        return given


DIALECTS = {
    "chat": Dialect("chat", "/v1/chat/completions", _chat_parse, _chat_answer, wire.error_body),
    "responses": Dialect("responses", "/v1/responses", responses.parse_request, responses.answer_body, wire.error_body),
    "messages": Dialect(
        "messages",
        "/v1/messages",
        messages.parse_request,
        messages.answer_body,
        messages.error_body,
        key_header="x-api-key",
    ),
}


def dialect_for_path(path: str) -> Dialect | None:
    """The dialect served at ``path`` (a URL path ending in a dialect's route), or ``None``."""
    path = path.rstrip("/")
    return next((d for d in DIALECTS.values() if path.endswith(d.path)), None)
