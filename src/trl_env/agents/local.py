"""The gateway in-process: ``httpx`` transports that hand a request to the ``Gateway`` without a socket.

``AgentRun.openai()`` / ``async_openai()`` build their client on one when the gateway runs in the program's process,
so a call costs no loopback HTTP on either side (the client's connection pool, h11, uvicorn, Starlette, an event-loop
hop): the same keys, limits, validation and answer bytes (``Gateway.accept`` / ``answer``), read by the same SDK.
A program in another process, or a client built on ``run.base_url``, takes the HTTP endpoint. See docs/agents.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

from trl_env.agents.dialects import DIALECTS, Dialect, dialect_for_path
from trl_env.agents.gateway import STREAM_HEADERS, Gateway, Session, local_gateway
from trl_env.agents.wire import ChatCall, WireError
from trl_env.render.chat import Reply

__all__ = ["AsyncLocalTransport", "LocalTransport", "local_async_client", "local_client"]


class LocalTransport(httpx.BaseTransport):
    """Serves every dialect's route (agents/dialects.py) and ``/v1/models`` from ``gateway`` on the calling thread."""

    http: Any = httpx
    """The ``httpx`` package the client is built on (the Anthropic SDK's is ``httpx2``: ``local_client(http=...)``)."""

    def __init__(self, gateway: Gateway) -> None:
        """Requests go to ``gateway`` (in this process)."""
        self.gateway = gateway

    def handle_request(self, request: Any) -> Any:
        """Answer ``request``; a call waits for its turn here (at most the client's read timeout)."""
        taken = _take(self.gateway, request, request.read(), self.http)
        if isinstance(taken, self.http.Response):
            return taken
        session, call, future = taken
        try:
            reply = future.result(timeout=_read_timeout(request))
        except FutureTimeout:
            raise self.http.ReadTimeout("the gateway did not answer within the read timeout", request=request) from None
        except WireError as e:
            return _error(e, DIALECTS[call.dialect], self.http)
        return _answer(self.gateway, session, call, reply, self.http)


class AsyncLocalTransport(httpx.AsyncBaseTransport):
    """``LocalTransport`` for ``httpx.AsyncClient``: a call awaits its turn on the program's event loop."""

    http: Any = httpx
    """As ``LocalTransport.http``."""

    def __init__(self, gateway: Gateway) -> None:
        """Requests go to ``gateway`` (in this process)."""
        self.gateway = gateway

    async def handle_async_request(self, request: Any) -> Any:
        """Answer ``request``."""
        taken = _take(self.gateway, request, await request.aread(), self.http)
        if isinstance(taken, self.http.Response):
            return taken
        session, call, future = taken
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), _read_timeout(request))
        except asyncio.TimeoutError:
            raise self.http.ReadTimeout("the gateway did not answer within the read timeout", request=request) from None
        except WireError as e:
            return _error(e, DIALECTS[call.dialect], self.http)
        return _answer(self.gateway, session, call, reply, self.http)


@functools.cache
def _transports(http: Any) -> tuple[type, type]:
    """``LocalTransport`` and ``AsyncLocalTransport`` for another ``httpx``-compatible package (``httpx2``)."""
    if http is httpx:
        return LocalTransport, AsyncLocalTransport
    sync = type("LocalTransport", (http.BaseTransport,), {**_methods(LocalTransport), "http": http})
    async_ = type("AsyncLocalTransport", (http.AsyncBaseTransport,), {**_methods(AsyncLocalTransport), "http": http})
    return sync, async_


def _methods(cls: type) -> dict[str, Any]:
    return {k: v for k, v in vars(cls).items() if k in ("__init__", "handle_request", "handle_async_request")}


def local_client(base_url: str, http: Any = httpx) -> Any:
    """An ``http.Client`` on a ``LocalTransport`` to the gateway at ``base_url``; ``None`` if it is not in-process.

    ``http``: the ``httpx`` package the SDK takes its client from (``httpx``; ``httpx2`` for the Anthropic SDK).
    ``trust_env=False``: no proxy from the environment can take a request off the transport.
    """
    gateway = local_gateway(base_url)
    return None if gateway is None else http.Client(transport=_transports(http)[0](gateway), trust_env=False)


def local_async_client(base_url: str, http: Any = httpx) -> Any:
    """``local_client`` for ``http.AsyncClient``."""
    gateway = local_gateway(base_url)
    return None if gateway is None else http.AsyncClient(transport=_transports(http)[1](gateway), trust_env=False)


def _take(gateway: Gateway, request: Any, body: bytes, http: Any) -> tuple[Session, ChatCall, Future[Reply]] | Any:
    """The queued call (its session, request and future), or the response that ends the request at once."""
    path, method = request.url.path.rstrip("/"), request.method
    dialect = dialect_for_path(path)
    chat = DIALECTS["chat"]
    try:
        if dialect is not None and method == "POST":
            session, call = gateway.accept(dialect.authorization(request.headers), body, dialect.name)
            return session, call, session.submit(call)
        if path.endswith("/v1/models") and method == "GET":
            models = gateway.models(chat.authorization(request.headers))
            return http.Response(200, content=json.dumps(models).encode(), headers={"content-type": "application/json"})
        routes = ", ".join(f"POST {d.path}" for d in DIALECTS.values())
        return _error(
            WireError(404, f"{method} {path}: the gateway serves {routes} and GET /v1/models", code="not_found"),
            dialect or chat,
            http,
        )
    except WireError as e:
        return _error(e, dialect or chat, http)


def _answer(gateway: Gateway, session: Session, call: ChatCall, reply: Reply, http: Any) -> Any:
    headers = (
        {"content-type": "text/event-stream", **STREAM_HEADERS} if call.stream else {"content-type": "application/json"}
    )
    return http.Response(200, content=gateway.answer(session, call, reply), headers=headers)


def _error(error: WireError, dialect: Dialect, http: Any) -> Any:
    return http.Response(
        error.status,
        content=json.dumps(dialect.error_body(error)).encode(),
        headers={"content-type": "application/json"},
    )


def _read_timeout(request: Any) -> float | None:
    timeout = request.extensions.get("timeout") or {}
    return timeout.get("read") if isinstance(timeout, dict) else None
