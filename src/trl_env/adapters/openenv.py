"""OpenEnv bridge: ``OpenEnvAdapter`` runs one episode of an OpenEnv environment server as a trl_env ``Env``.

OpenEnv (https://github.com/huggingface/OpenEnv; ``pip install 'trl-env[openenv]'``) serves an environment
with FastAPI. Its HTTP ``/reset`` and ``/step`` build a throwaway environment per request, so an episode
lives in a WebSocket session (``/ws``): one server-side environment per connection, at most
``max_concurrent_envs`` at once. The adapter opens one session per episode (the engine's fresh env per
episode) and closes it when the episode ends. OpenEnv is imported only when the first adapter is built.
Two reads of the client's private state (``EnvClient._ws`` and ``_send_and_receive``) are skipped where absent.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from trl_env.adapters.openenv_schema import SCHEMA_RETRY_S as SCHEMA_RETRY_S  # kept import path (docs/openenv.md)
from trl_env.adapters.openenv_schema import action_field
from trl_env.env import Action, Delta, Env, Seed
from trl_env.errors import ConfigError, EnvError, EnvTimeoutError, EpisodeFailure

REWARD_MODES = ("sum", "last")
_INSTALL_HINT = "pip install 'trl-env[openenv]'  (or: pip install openenv)"
_collect_lock = threading.Lock()
_CAPACITY_HINT = (
    "Every running episode holds one session: start the server with max_concurrent_envs >= the episodes of one "
    "rollout call (its env class needs SUPPORTS_CONCURRENT_SESSIONS = True), or spread episodes over several servers."
)


def seed_to_reset_kwargs(seed: Seed) -> dict[str, Any]:
    """The default mapping from a trl_env seed to the keyword arguments of OpenEnv's ``reset``.

    A JSON object is taken as the reset options themselves (``'{"seed": 3, "task": "easy"}'``); a
    non-negative integer becomes ``{"seed": int}``; any other text becomes ``{"seed": n}`` with ``n``
    a stable 31-bit hash of it, so equal seeds (a GRPO group) give the same episode in every process.
    """
    text = seed.strip()
    if text.startswith("{"):
        try:
            options = json.loads(text)
        except json.JSONDecodeError:
            options = None
        if isinstance(options, dict):
            return options
    if re.fullmatch(r"[0-9]+", text):
        return {"seed": int(text)}
    return {"seed": int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest()[:4], "big") >> 1}


def observation_to_text(observation: Any) -> Delta:
    """The default mapping from an OpenEnv observation to the delta text.

    ``done``, ``reward`` and ``metadata`` are dropped; if exactly one string field remains, it is the
    text; otherwise the remaining fields are written as JSON (pass ``observation=`` for anything richer).
    """
    fields = _as_dict(observation)
    fields = {k: v for k, v in fields.items() if k not in ("done", "reward", "metadata")}
    texts = [v for v in fields.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(fields, ensure_ascii=False, sort_keys=True, default=str)


class OpenEnvAdapter(Env):
    """One episode of an OpenEnv environment server, as a text ``Env``: one WebSocket session per episode.

    ``reset(seed)`` opens a session at ``base_url`` and resets it with ``reset_kwargs(seed)``;
    ``step(text)`` sends ``action(text)``; each observation becomes the delta through ``observation``.
    ``reward`` is the sum of the step rewards the server reported (``reward_mode="last"``: the latest
    one), ``None`` counting as 0; ``alive`` is ``not done``. The session is closed when the server says
    done, when a call fails, or when the engine calls ``close()`` at the episode's end (however it ended;
    a finalizer closes it if nobody does), so the server's ``max_concurrent_envs`` must cover the episodes
    of one rollout batch, not more. Every failure raises from ``reset``/``step`` and the engine ends only
    that episode, as ``error``: a server that does not answer within the adapter's own timeouts (opening
    the session, reading ``/schema``, a reset or step answer) raises ``EnvTimeoutError`` (``env_timeout``),
    a reply that is not an observation ends it as ``env_bad_return``, anything else (a refused
    connection, a server that dies mid-episode) as ``env_exception``.

    Example::

        env_factory = lambda: OpenEnvAdapter("http://127.0.0.1:8000")  # text action envs: echo, textarena
        env_factory = lambda: OpenEnvAdapter(url, client_cls=CodingEnv, action=lambda text: CodeAction(code=text))

    Args:
        base_url: the server, ``http(s)://`` or ``ws(s)://`` (a local process, a remote host, an HF Space).
        client_cls: an OpenEnv ``EnvClient`` subclass (the env's typed client); default ``GenericEnvClient``
            (dict actions and observations, nothing of the env installed locally).
        action: model action text -> what ``client.step`` takes. Default, for ``GenericEnvClient``:
            ``{field: text}`` where ``field`` is the action's only string field in the server's ``/schema``
            (read once per server; read again when the server rejects the action, e.g. after a redeploy
            renamed the field; a failed read is remembered for ``SCHEMA_RETRY_S``).
            A typed ``client_cls`` needs one (its action class is not discoverable).
        observation: observation -> delta text; default ``observation_to_text``.
        reset_kwargs: seed -> keyword arguments of ``reset``; default ``seed_to_reset_kwargs``. The server
            silently drops options its env's ``reset`` does not accept.
        reward_mode: ``"sum"`` (step rewards add up, Gymnasium's return) or ``"last"`` (the env reports the
            episode's reward so far, or only at the end).
        connect_timeout_s: limit for opening the session, for closing it and for reading ``/schema``.
        message_timeout_s: limit for each reset/step answer.
        headers: extra HTTP headers for the connection, e.g. ``{"Authorization": "Bearer ..."}`` for a
            private HF Space (a client that takes ``headers=``: ``openenv`` 0.10 does, ``openenv-core`` 0.3 not).

    Raises:
        ConfigError: for bad arguments, or when OpenEnv is not installed. ``reset``/``step`` raise
            ``EnvTimeoutError`` for a timeout, ``EpisodeFailure`` (kind ``env_bad_return``, around an ``EnvError``)
            for a reply that is not an observation, and ``ConnectionError``/``RuntimeError`` for the rest.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client_cls: type | None = None,
        action: Callable[[Action], Any] | None = None,
        observation: Callable[[Any], Delta] | None = None,
        reset_kwargs: Callable[[Seed], Mapping[str, Any]] | None = None,
        reward_mode: str = "sum",
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        generic = _import_openenv()
        if reward_mode not in REWARD_MODES:
            raise ConfigError(f"reward_mode={reward_mode!r}: expected one of {REWARD_MODES}.")
        if not (connect_timeout_s > 0 and message_timeout_s > 0):
            raise ConfigError(
                f"connect_timeout_s={connect_timeout_s!r}, message_timeout_s={message_timeout_s!r}: both must be > 0."
            )
        client_cls = client_cls or generic
        if action is None and not issubclass(client_cls, generic):
            raise ConfigError(
                f"client_cls={client_cls.__name__} takes its own action type; pass action=, e.g. "
                f"`action=lambda text: MyAction(message=text)`."
            )
        self.reward, self.alive = 0.0, True
        self.base_url = base_url.rstrip("/")
        self.results: list[Any] = []
        """What the server reported (OpenEnv ``StepResult``s): the reset first, then one per step."""
        self.client_cls, self.reward_mode = client_cls, reward_mode
        self.connect_timeout_s, self.message_timeout_s = connect_timeout_s, message_timeout_s
        self.headers = dict(headers) if headers else None
        self._action, self._observation = action, observation or observation_to_text
        self._field: str | None = None  # without action=: the action's text field, from the server's /schema
        self._reset_kwargs = reset_kwargs or seed_to_reset_kwargs
        self._client: Any = None
        self._close: weakref.finalize[Any, Any] | None = None
        self._refused = False  # the last reset was refused a session (capacity), so it may be tried again

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Open a session (once) and reset it with the options ``seed`` maps to."""
        kwargs = self._reset_kwargs(seed)
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"reset_kwargs({seed!r:.60}) returned {kwargs!r:.80}; it must return a dict.")
        self._refused = False
        try:
            result = self._call("reset", lambda: self._open().reset(**kwargs))
        except (RuntimeError, ConnectionError):
            if not self._refused:
                raise
            # Sessions of finished episodes can outlive them where nobody called close() (use outside the engine, or
            # adapters caught in a reference cycle); collecting runs their finalizers. Then try once more.
            with _collect_lock:  # a gc.collect() racing another one returns before the other's finalizers ran
                gc.collect()
            result = self._call("reset", lambda: self._open().reset(**kwargs))
        if self._action is None:
            try:
                self._field = action_field(self.base_url, self.connect_timeout_s, self.headers)
            except Exception:
                self._close_in_background()
                raise
        self.results = [result]
        self.reward, self.alive = 0.0, not result.done
        if result.done:
            self.close()
        return self, self._observation(result.observation)

    def step(self, action: Action) -> tuple[Env, Delta]:
        """Send ``action(text)`` and add the reported reward."""
        if self._client is None or (self._action is None and self._field is None):
            raise RuntimeError(f"{type(self).__name__}.step called with no open session: call reset first.")
        result = self._call("step", lambda: self._send(action))
        self.results.append(result)
        if result.reward is not None:
            self.reward = (self.reward if self.reward_mode == "sum" else 0.0) + float(result.reward)
        self.alive = not result.done
        if result.done:
            self.close()
        return self, self._observation(result.observation)

    def _send(self, text: Action) -> Any:
        """``client.step`` with the action built from ``text``; with the /schema field, re-read once if rejected."""
        client, name = self._client, self._field
        if self._action is not None:
            return client.step(self._action(text))
        assert name is not None
        try:
            return client.step({name: text})
        except RuntimeError as e:
            if "VALIDATION_ERROR" not in str(e):
                raise
            # The server checks the action before its env sees it, so nothing moved: a redeploy may have renamed
            # the field since /schema was read. Read it again (once per server) and resend if it changed.
            self._field = action_field(self.base_url, self.connect_timeout_s, self.headers, stale=name)
            if self._field == name:
                raise RuntimeError(
                    f"OpenEnv server {self.base_url} rejected the action {{{name!r}: text}} ({e}) although its "
                    f"/schema names {name!r} as the action's text field; pass action= to build a valid action."
                ) from e
        return client.step({self._field: text})

    def _open(self) -> Any:
        """The episode's client (a ``SyncEnvClient``), opened on first use; closed by ``close`` or the finalizer."""
        if self._client is None:
            options: dict[str, Any] = dict(
                connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.message_timeout_s
            )
            if self.headers:
                options["headers"] = self.headers
            async_client = self.client_cls(base_url=self.base_url, **options)
            exchange = getattr(async_client, "_send_and_receive", None)  # private: every reset/step answer passes it
            if exchange is not None:
                async_client._send_and_receive = _observations_only(exchange, self.base_url)
            client = async_client.sync()
            self._client = client
            self._close = weakref.finalize(self, _close_quietly, client)  # also if nobody calls close()
            self._close.atexit = False
        return self._client

    def close(self) -> None:
        """Close the session (idempotent; within about ``connect_timeout_s``); the server frees its environment."""
        self._client = None
        if self._close is not None:
            self._close()

    def _call(self, method: str, call: Callable[[], Any]) -> Any:
        url, socket = self.base_url, self._socket()
        try:
            if socket is not None and getattr(getattr(socket, "state", None), "name", "") in ("CLOSING", "CLOSED"):
                raise ConnectionError(
                    f"OpenEnv server {url} closed the session before {method}; the server stopped or dropped it."
                )
            result = call()
        except (TimeoutError, asyncio.TimeoutError) as e:
            self._close_in_background()
            raise EnvTimeoutError(
                f"OpenEnv server {url} did not answer {method} within message_timeout_s={self.message_timeout_s} s; "
                "raise it if the env is just slow.",
                method=method,
            ) from e
        except EnvTimeoutError:  # /schema, read again for a rejected action
            self._close_in_background()
            raise
        except EnvError as e:  # the answer was not an observation (_observations_only)
            self._close_in_background()
            raise EpisodeFailure("env_bad_return", e) from e
        except Exception as e:
            self._close_in_background()
            if isinstance(e, ConnectionError) and isinstance(e.__cause__, (TimeoutError, asyncio.TimeoutError)):
                raise EnvTimeoutError(  # a server frozen at connect: a timeout, as one frozen mid-episode
                    f"OpenEnv server {url} did not open a session within connect_timeout_s={self.connect_timeout_s} s "
                    f"({e}); raise it if the server is just slow.",
                    method=method,
                ) from e
            if "CAPACITY_REACHED" in str(e):
                self._refused = True
                raise RuntimeError(f"OpenEnv server {url} refused a new session ({e}). {_CAPACITY_HINT}") from e
            if type(e).__name__.startswith("ConnectionClosed"):  # websockets: the server went away mid-episode
                # openenv-core 0.3's client reports a refused session this way too (it misses the error frame).
                self._refused = method == "reset" and socket is None
                hint = f" A full server refuses new sessions this way. {_CAPACITY_HINT}" if self._refused else ""
                raise ConnectionError(f"OpenEnv server {url} closed the session during {method}: {e}.{hint}") from e
            raise
        if socket is not None and self._socket() is not socket:
            self._close_in_background()
            raise ConnectionError(
                f"OpenEnv server {url} dropped the session during {method} and the client reconnected to a fresh "
                "session with no episode in it; the episode cannot go on."
            )
        if hasattr(self._socket(), "close_timeout"):  # websockets waits 10 s for a close handshake by default
            self._socket().close_timeout = self.connect_timeout_s
        return result

    def _socket(self) -> Any:
        # openenv 0.10's client silently reconnects a dropped socket on the next call, to a NEW server session (a fresh
        # env with no episode in it). The socket is private (``EnvClient._ws``): no check where it is absent.
        return getattr(getattr(self._client, "_async", None), "_ws", None)

    def _close_in_background(self) -> None:
        close, self._close, self._client = self._close, None, None
        if close is not None:
            threading.Thread(target=close, name="openenv-close", daemon=True).start()


def _import_openenv() -> type:
    try:
        from openenv.core import GenericEnvClient  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional; no py.typed
    except ImportError as e:
        raise ConfigError(f"OpenEnvAdapter needs OpenEnv, which is not installed ({e}); run `{_INSTALL_HINT}`.") from e
    generic: type = GenericEnvClient
    return generic


def _observations_only(
    exchange: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]], url: str
) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    """The client's ``_send_and_receive``, raising ``EnvError`` for a reset or step not answered with an observation.

    An observation frame has ``observation``, ``reward`` and ``done``; the client would turn anything else into an
    empty turn (delta ``'{}'``, reward 0, alive) and the episode would go on.
    """

    async def checked(message: dict[str, Any]) -> dict[str, Any]:
        frame = await exchange(message)
        method, data = message.get("type"), frame.get("data")
        if method not in ("reset", "step"):
            return frame
        data = data if isinstance(data, dict) else {}
        missing = [k for k in ("observation", "reward", "done") if k not in data]
        if frame.get("type") != "observation":
            problem = f"a {frame.get('type')!r} frame"
        elif missing:
            problem = f"a frame without {', '.join(missing)}"
        elif not isinstance(data["done"], bool) or not isinstance(data["reward"], int | float | None):
            problem = f"a frame with done={data['done']!r:.40}, reward={data['reward']!r:.40}"
        else:
            return frame
        raise EnvError(
            f"OpenEnv server {url} answered {method} with {problem}, not an observation (observation, reward, done): "
            f"{json.dumps(frame, default=str)[:200]}. The server (or a proxy before it) does not speak this OpenEnv "
            "client's WebSocket protocol; check that both run the same OpenEnv version.",
            method=str(method),
        )

    return checked


def _as_dict(observation: Any) -> dict[str, Any]:
    if isinstance(observation, Mapping):
        return dict(observation)
    if hasattr(observation, "model_dump"):  # a pydantic Observation from a typed client
        return dict(observation.model_dump())
    return dict(vars(observation)) if hasattr(observation, "__dict__") else {"observation": str(observation)}


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001  # best effort: the server also frees a session when its socket drops
        pass
