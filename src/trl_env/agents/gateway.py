"""The gateway: an OpenAI-compatible HTTP endpoint, one per process, that turns an agent's model calls into turns.

Starlette on uvicorn, in a daemon thread with its own event loop, on 127.0.0.1 and an ephemeral port by default.
Each episode holds a ``Session`` with an unguessable key; a request is refused (and records nothing) without a live
key, and otherwise waits, as a ``Pending`` call, until its episode's ``AgentEnv`` answers it with the next turn.
See docs/agents.md (the trust model).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import itertools
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from trl_env.agents.dialects import DIALECTS, Dialect
from trl_env.agents.wire import ChatCall, WireError, error_body
from trl_env.errors import ConfigError
from trl_env.render.chat import Reply

__all__ = ["Gateway", "Pending", "Session", "import_stack", "local_gateway", "shared_gateway"]

MAX_BODY = 8 * 2**20
"""Request bodies above this many bytes are refused with 413 (configurable per gateway)."""


def import_stack() -> None:
    """Import everything the gateway and AgentRun's clients use; raise ``ConfigError`` naming the extra when missing.

    Called by ``Gateway()`` (every episode opens its session on a running gateway before its program starts) and
    where an ``AgentEnvFactory`` is built or unpickled, so no program imports any of it on its own thread. A lazy
    import there races the programs starting beside it: openai 3.x's client constructor reads ``sys.modules["httpx"]``
    without importing it, and while ``run.openai()`` imports ``agents/local.py`` (hence httpx) on one thread, a
    client built on ``run.base_url`` on another fails with "partially initialized module 'httpx' has no attribute
    'URL'" (tests/test_agents_imports.py).
    """
    try:
        import httpx  # noqa: F401
        import openai  # noqa: F401
        import openai.lib._parsing  # noqa: F401  # imported lazily by a client's first call: racing threads break it
        import openai.resources.chat.completions  # noqa: F401
        import openai.types.chat  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"trl_env.agents needs the 'agents' extra ({e.name} is missing): pip install 'trl-env[agents]'."
        ) from None
    import trl_env.agents.local  # noqa: F401  # AgentRun's transports (it imports this module, loaded by now)


@dataclass
class Pending:
    """One model call waiting for its turn: the validated request and the future its answer settles."""

    call: ChatCall
    future: Future[Reply] = field(default_factory=Future)


@dataclass
class Session:
    """One episode's side of the gateway: its key, its waiting calls, and how the program ended (if it has)."""

    key: str
    calls: collections.deque[Pending] = field(default_factory=collections.deque)
    outcome: tuple[str, Any] | None = None
    """``("returned", value)`` or ``("raised", exception)`` once the program is done."""
    ended: str | None = None
    """Why the episode ended (no call is taken after it); ``None`` while it runs."""
    answered: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    """What the dialects keep for the episode: Responses' answered responses (``previous_response_id``), ..."""
    changed: threading.Condition = field(default_factory=threading.Condition)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def call_ids(self) -> Iterator[str]:
        """Ids for the tool calls of the next answer: ``call_0``, ``call_1``, ... counted over the whole episode.

        Unique within the episode (every reply's calls continue the count), and the same for the same replies, so a
        template that renders ids renders the same prompt in every run (vLLM's are random: ``chatcmpl-tool-<hex>``).
        """
        return (f"call_{k}" for k in self._ids)  # itertools.count's next is atomic under the GIL

    def submit(self, call: ChatCall) -> Future[Reply]:
        """Queue a call for the episode's next turn; a call after the episode ended is refused.

        Raises:
            WireError: 409 ``episode_ended`` with the reason.
        """
        with self.changed:
            if self.ended is not None:
                raise WireError(
                    409,
                    f"this episode has ended ({self.ended}); no further model calls are taken",
                    type="invalid_request_error",
                    code="episode_ended",
                )
            pending = Pending(call)
            self.calls.append(pending)
            self.changed.notify_all()
            return pending.future

    def finish(self, kind: str, value: Any) -> None:
        """Record how the program ended (from its thread)."""
        with self.changed:
            self.outcome = (kind, value)
            self.changed.notify_all()

    def next(self, timeout: float | None = None) -> Pending | None:
        """The next waiting call, or ``None`` once the program is done or the episode ended (or after ``timeout``)."""
        with self.changed:
            self.changed.wait_for(lambda: self.calls or self.outcome is not None or self.ended is not None, timeout)
            if self.outcome is not None or self.ended is not None or not self.calls:
                return None
            return self.calls.popleft()

    def wait_outcome(self, timeout: float | None) -> tuple[str, Any] | None:
        """How the program ended, waiting at most ``timeout`` seconds."""
        with self.changed:
            self.changed.wait_for(lambda: self.outcome is not None, timeout)
            return self.outcome

    def end(self, reason: str) -> None:
        """End the episode: every waiting call (and every later one) is refused with ``reason``."""
        with self.changed:
            self.ended = self.ended or reason
            waiting, self.calls = list(self.calls), collections.deque()
            self.changed.notify_all()
        for pending in waiting:
            refuse(pending, f"this episode has ended ({self.ended}); the call was not answered")


def refuse(pending: Pending, message: str, status: int = 409, code: str = "episode_ended") -> None:
    """Answer a waiting call with an error."""
    if not pending.future.done():
        pending.future.set_exception(WireError(status, message, code=code))


_KEEP_ALIVE_S = 75
"""How long an idle connection stays open: longer than clients' pools keep one (httpx, under the openai SDK: 5 s),
so a client never reuses a connection the gateway is closing (a call lost with 'Server disconnected')."""


class Gateway:
    """The OpenAI-compatible endpoint; ``open()`` a session per episode, ``close()`` it when the episode ends."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "trl-env-policy",
        max_body: int = MAX_BODY,
        read_timeout_s: float = 30.0,
    ) -> None:
        """Bind ``host:port`` (0: an ephemeral port) and start serving in a daemon thread.

        Raises:
            ConfigError: the ``agents`` extra is not installed, or ``host:port`` cannot be bound.
        """
        import_stack()
        import uvicorn

        self.model, self.max_body, self.read_timeout_s = model, max_body, read_timeout_s
        self._sessions: dict[str, Session] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise ConfigError(f"the agents gateway cannot listen on {host}:{port}: {e}; pick another port.") from e
        self.host, self.port = host, self._sock.getsockname()[1]
        with _local_lock:
            _local[self.base_url] = self
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            timeout_keep_alive=_KEEP_ALIVE_S,
            backlog=4096,
            access_log=False,
            lifespan="off",
            http=_protocol(read_timeout_s),
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="trl-env-gateway"
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise ConfigError(f"the agents gateway did not start on {host}:{self.port}")

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, what an OpenAI client takes as ``base_url``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def open(self) -> Session:
        """A new session with a fresh unguessable key (``secrets.token_urlsafe(32)``)."""
        session = Session("trlenv-" + secrets.token_urlsafe(32))
        with self._lock:
            self._sessions[session.key] = session
        return session

    def open_sessions(self) -> int:
        """How many sessions are open: keys that authenticate now (one per running episode)."""
        with self._lock:
            return len(self._sessions)

    def close(self, session: Session, reason: str) -> None:
        """End ``session``: its waiting and later calls are refused with ``reason``; its key stops working."""
        session.end(reason)
        with self._lock:
            self._sessions.pop(session.key, None)
            self._ended[session.key] = session.ended or reason  # the first reason: closing again changes nothing
            while len(self._ended) > 100_000:  # keep the reasons of recent episodes only
                self._ended.popitem(last=False)

    def shutdown(self) -> None:
        """Stop serving (every session ends) and wait for the server thread."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            self.close(session, "the gateway shut down")
        with _local_lock:
            _local.pop(self.base_url, None)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    # -- what both transports serve: the loopback HTTP endpoint and the in-process one (agents/local.py) ----------

    def accept(self, authorization: str, body: bytes, dialect: str = "chat") -> tuple[Session, ChatCall]:
        """The session the ``Authorization`` header names and the request it sends (in ``dialect``'s wire).

        Raises:
            WireError: 401 (no or an unknown key), 409 (an ended episode's key), 413 (a body over ``max_body``),
                400 (a malformed request).
        """
        session = self._session(authorization)
        if len(body) > self.max_body:
            raise WireError(
                413, f"the request body has {len(body)} bytes; the limit is {self.max_body}", code="request_too_large"
            )
        return session, DIALECTS[dialect].parse(body, session.memory)

    def answer(self, session: Session, call: ChatCall, reply: Reply) -> bytes:
        """The answer's body in the call's dialect (with ``call.stream`` its SSE events)."""
        return DIALECTS[call.dialect].answer(
            reply, call, model=self.model, call_ids=session.call_ids(), memory=session.memory
        )

    def models(self, authorization: str) -> dict[str, Any]:
        """The ``GET /v1/models`` body: the one model name the gateway reports.

        Raises:
            WireError: as ``accept`` for the key.
        """
        self._session(authorization)
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "trl-env"}
        return {"object": "list", "data": [model]}

    # -- the ASGI app, on the server's event loop ------------------------------------------------------

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = [Route(d.path, self._route(d), methods=["POST"]) for d in DIALECTS.values()]
        routes.append(Route("/v1/models", self._models, methods=["GET"]))
        return Starlette(routes=routes)

    def _session(self, header: str) -> Session:
        key = header[7:].strip() if header[:7].lower() == "bearer " else ""
        with self._lock:
            session = self._sessions.get(key)
            reason = self._ended.get(key)
        if session is not None:
            return session
        if reason is not None:
            raise WireError(
                409, f"this episode has ended ({reason}); no further model calls are taken", code="episode_ended"
            )
        what = "no API key" if not key else "an unknown API key"
        raise WireError(
            401,
            f"{what}: send the episode's key as 'Authorization: Bearer <key>' (AgentRun.api_key)",
            type="authentication_error",
            code="invalid_api_key",
        )

    async def _body(self, request: Any) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise WireError(
                413, f"the request body has {length} bytes; the limit is {self.max_body}", code="request_too_large"
            )

        async def read() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise WireError(413, f"the request body exceeds {self.max_body} bytes", code="request_too_large")
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(read(), self.read_timeout_s)
        except asyncio.TimeoutError:
            raise WireError(
                408, f"the request body did not arrive within {self.read_timeout_s} s", code="request_timeout"
            ) from None

    def _route(self, dialect: Dialect) -> Any:
        """The endpoint of one dialect: the same keys, limits and turns for all (agents/dialects.py)."""

        async def endpoint(request: Any) -> Any:
            from starlette.responses import JSONResponse, Response

            try:
                authorization = dialect.authorization(request.headers)
                self._session(authorization)  # refused before its body is read
                session, call = self.accept(authorization, await self._body(request), dialect.name)
                reply = await asyncio.wrap_future(session.submit(call))
            except WireError as e:
                return JSONResponse(dialect.error_body(e), status_code=e.status)
            media, headers = ("text/event-stream", STREAM_HEADERS) if call.stream else ("application/json", None)
            return Response(self.answer(session, call, reply), media_type=media, headers=headers)

        return endpoint

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            return JSONResponse(self.models(request.headers.get("authorization", "")))
        except WireError as e:
            return JSONResponse(error_body(e), status_code=e.status)


def _protocol(header_timeout_s: float) -> type:
    """Uvicorn's h11 protocol, closing a connection with no whole request head ``header_timeout_s`` after it opens.

    Uvicorn itself waits forever: slow-loris connections would hold file descriptors.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeout(H11Protocol):  # type: ignore[misc]  # uvicorn's protocol classes are untyped here
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.loop.call_later(header_timeout_s, self._no_head)

        def _no_head(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

    return HeadTimeout


STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_shared: Gateway | None = None
_shared_lock = threading.Lock()
_local: dict[str, Gateway] = {}
"""This process's running gateways by ``base_url`` (what ``local_gateway`` finds)."""
_local_lock = threading.Lock()


def local_gateway(base_url: str) -> Gateway | None:
    """The gateway serving ``base_url`` in this process, or ``None`` (another process's, or shut down)."""
    with _local_lock:
        return _local.get(base_url)


def shared_gateway() -> Gateway:
    """The process's gateway (127.0.0.1, an ephemeral port), started on first use and shut down at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Gateway()
            atexit.register(_shared.shutdown)
        return _shared
