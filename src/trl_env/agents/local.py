"""The gateway in-process: ``httpx`` transports that hand a request to the ``Gateway`` without a socket.

``AgentRun.openai()`` / ``async_openai()`` build their client on one when the gateway runs in the program's process,
so a call costs no loopback HTTP on either side (the client's connection pool, h11, uvicorn, Starlette, an event-loop
hop): the same keys, limits, validation and answer bytes (``Gateway.accept`` / ``answer``), read by the same SDK.
A program in another process, or a client built on ``run.base_url``, takes the HTTP endpoint. See docs/agents.md.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

from trl_env.agents.gateway import STREAM_HEADERS, Gateway, Session, local_gateway
from trl_env.agents.wire import ChatCall, WireError, error_body
from trl_env.render.chat import Reply

__all__ = ["AsyncLocalTransport", "LocalTransport", "local_async_client", "local_client"]


class LocalTransport(httpx.BaseTransport):
    """Serves ``/v1/chat/completions`` and ``/v1/models`` from ``gateway`` on the calling thread."""

    def __init__(self, gateway: Gateway) -> None:
        """Requests go to ``gateway`` (in this process)."""
        self.gateway = gateway

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Answer ``request``; a call waits for its turn here (at most the client's read timeout)."""
        taken = _take(self.gateway, request, request.read())
        if isinstance(taken, httpx.Response):
            return taken
        session, call, future = taken
        try:
            reply = future.result(timeout=_read_timeout(request))
        except FutureTimeout:
            raise httpx.ReadTimeout("the gateway did not answer within the read timeout", request=request) from None
        except WireError as e:
            return _error(e)
        return _answer(self.gateway, session, call, reply)


class AsyncLocalTransport(httpx.AsyncBaseTransport):
    """``LocalTransport`` for ``httpx.AsyncClient``: a call awaits its turn on the program's event loop."""

    def __init__(self, gateway: Gateway) -> None:
        """Requests go to ``gateway`` (in this process)."""
        self.gateway = gateway

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Answer ``request``."""
        taken = _take(self.gateway, request, await request.aread())
        if isinstance(taken, httpx.Response):
            return taken
        session, call, future = taken
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), _read_timeout(request))
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout("the gateway did not answer within the read timeout", request=request) from None
        except WireError as e:
            return _error(e)
        return _answer(self.gateway, session, call, reply)


def local_client(base_url: str) -> httpx.Client | None:
    """An ``httpx.Client`` on a ``LocalTransport`` to the gateway at ``base_url``; ``None`` if it is not in-process.

    ``trust_env=False``: no proxy from the environment can take a request off the transport.
    """
    gateway = local_gateway(base_url)
    return None if gateway is None else httpx.Client(transport=LocalTransport(gateway), trust_env=False)


def local_async_client(base_url: str) -> httpx.AsyncClient | None:
    """``local_client`` for ``httpx.AsyncClient``."""
    gateway = local_gateway(base_url)
    return None if gateway is None else httpx.AsyncClient(transport=AsyncLocalTransport(gateway), trust_env=False)


def _take(gateway: Gateway, request: httpx.Request, body: bytes) -> tuple[Session, ChatCall, Future[Reply]] | Any:
    """The queued call (its session, request and future), or the response that ends the request at once."""
    path, method = request.url.path.rstrip("/"), request.method
    authorization = request.headers.get("authorization", "")
    try:
        if path.endswith("/v1/chat/completions") and method == "POST":
            session, call = gateway.accept(authorization, body)
            return session, call, session.submit(call)
        if path.endswith("/v1/models") and method == "GET":
            return httpx.Response(200, content=json.dumps(gateway.models(authorization)).encode(),
                                  headers={"content-type": "application/json"})  # fmt: skip
        return _error(WireError(404, f"{method} {path}: the gateway serves POST /v1/chat/completions and GET "
                                     "/v1/models", code="not_found"))  # fmt: skip
    except WireError as e:
        return _error(e)


def _answer(gateway: Gateway, session: Session, call: ChatCall, reply: Reply) -> httpx.Response:
    headers = {"content-type": "text/event-stream", **STREAM_HEADERS} if call.stream else {
        "content-type": "application/json"}  # fmt: skip
    return httpx.Response(200, content=gateway.answer(session, call, reply), headers=headers)


def _error(error: WireError) -> httpx.Response:
    return httpx.Response(error.status, content=json.dumps(error_body(error)).encode(),
                          headers={"content-type": "application/json"})  # fmt: skip


def _read_timeout(request: httpx.Request) -> float | None:
    timeout = request.extensions.get("timeout") or {}
    return timeout.get("read") if isinstance(timeout, dict) else None
