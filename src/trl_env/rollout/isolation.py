"""Env code in worker processes: ``isolated(env_factory)``, an env factory whose envs each run in a child process.

Env code normally runs on the engine's worker threads, inside the trainer's process. Wrapped with
``isolated``, each env lives in a worker process of its own, in a temporary working directory of its own. The
workers are forked from one "zygote" process per ``isolated`` factory, started with ``spawn`` (so nothing of the
trainer's threads or CUDA state is inherited), which imports the env's code once: a worker starts in
milliseconds, not seconds.
A crash, a segfault, ``os._exit``, a hang or runaway memory (``memory_mb``) in env code then ends only
its episode, with the reason recorded (``env_exception``, or ``env_timeout`` through ``env_timeout``),
and the worker is replaced. Envs of different episodes run in parallel across cores (no GIL between
them). Workers are reused across episodes (up to ``pool_size`` idle ones are kept): a reused worker
builds a fresh env with ``env_factory()``, in a fresh working directory.

The factory and everything an env returns cross a process boundary, so they must pickle: pass a
class or a module-level function, not a lambda. A factory whose code does not load in the zygote (its module
raises on import there) fails every episode at once with the zygote's exception; it is not retried.

For a library that is merely not thread-safe (shared global state, no crashes), ``serialized(env_factory)``
is the cheap answer: every call into its envs holds one lock, so they run one at a time, in this process.

Example::

    rollout_func = make_rollout_func(isolated(TextWorldEnv, memory_mb=2048), processor)
    rollout_func = make_rollout_func(serialized(TextArenaEnv), processor)  # seeds the global `random` in reset
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from trl_env.env import Action, Closable, Delta, Env, Seed, Truncatable
from trl_env.errors import ConfigError, EnvError
from trl_env.rollout.isolation_child import zygote


def serialized(env_factory: Callable[[], Env]) -> Callable[[], Env]:
    """An env factory whose envs' calls (construction, ``reset``, ``step``, ``truncate``, ``close``) hold one lock.

    For env code that is not thread-safe: TextArena seeds Python's global ``random`` in ``reset``, so two
    concurrent resets can hand one episode another seed's game; a shared parser races on first load. Calls then
    run one at a time (model turns still overlap them); for CPU-bound or crashing env code use ``isolated``.
    """
    lock = threading.Lock()

    def make() -> Env:
        with lock:
            return SerializedEnv(env_factory(), lock)

    return make


class SerializedEnv:
    """An env whose calls hold its factory's lock; ``reward``, ``alive`` and ``info`` are copied after each call."""

    def __init__(self, env: Env, lock: threading.Lock) -> None:
        self.env, self._lock = env, lock
        self.reward, self.alive = env.reward, env.alive

    def _copy(self, env: Env, delta: Delta) -> tuple[Env, Delta]:
        self.env, self.reward, self.alive = env, env.reward, env.alive
        info = getattr(env, "info", None)  # optional in the Env protocol
        if info is not None:
            self.info = info
        return self, delta

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """The env's ``reset``, under the lock."""
        with self._lock:
            return self._copy(*self.env.reset(seed))

    def step(self, action: Action) -> tuple[Env, Delta]:
        """The env's ``step``, under the lock."""
        with self._lock:
            return self._copy(*self.env.step(action))

    def truncate(self, reason: str) -> None:
        """The env's ``truncate`` if it has one, under the lock."""
        if isinstance(self.env, Truncatable):
            with self._lock:
                self.env.truncate(reason)
                self._copy(self.env, "")

    def close(self) -> None:
        """The env's ``close`` if it has one, under the lock."""
        if isinstance(self.env, Closable):
            with self._lock:
                self.env.close()


def isolated(env_factory: Callable[[], Env], *, pool_size: int = 16, memory_mb: int | None = None) -> Callable[[], Env]:
    """An env factory whose envs run ``env_factory()``'s env in a worker process each (see the module docs).

    Args:
        env_factory: a picklable zero-argument callable returning an env (a class, or a module-level function).
        pool_size: idle worker processes kept for reuse.
        memory_mb: address-space limit of each worker (``RLIMIT_AS``); an env that exceeds it fails its episode.

    Raises:
        ConfigError: if ``env_factory`` does not pickle (a lambda or a local function), naming the fix.
    """
    try:
        pickle.dumps(env_factory)
    except Exception as e:  # noqa: BLE001  # pickle raises several types
        raise ConfigError(
            f"isolated({env_factory!r:.80}): the env factory must pickle to reach a worker process ({e}); pass a "
            "class or a module-level function (or a functools.partial of one), not a lambda or a local function."
        ) from None
    return _Pool(env_factory, pool_size, memory_mb)


class _Pool:
    """The factory ``isolated`` returns: hands out ``ProcessEnv``s, keeps idle workers for reuse."""

    def __init__(self, env_factory: Callable[[], Env], pool_size: int, memory_mb: int | None) -> None:
        self.env_factory, self.pool_size, self.memory_mb = env_factory, pool_size, memory_mb
        self._idle: list[_Worker] = []
        self.zygote: _Zygote | None = None
        self._load_error: str | None = None  # the env's code did not load in a new process: it never will
        self._lock = threading.Lock()

    def __call__(self) -> ProcessEnv:
        with self._lock:
            if self._load_error is not None:
                raise EnvError(self._load_error)
            worker = self._idle.pop() if self._idle else None
            if self.zygote is None or not self.zygote.alive():
                try:
                    self.zygote = _Zygote(self.env_factory, self.memory_mb)
                except EnvError as e:
                    self._load_error = str(e)
                    raise
            zygote = self.zygote
        if worker is not None and not worker.alive():
            worker.stop()  # died idle: clean its directories up
            worker = None
        if worker is None:
            worker = _Worker(zygote)
        return ProcessEnv(worker, self)

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size and worker.alive():
                self._idle.append(worker)
                return
        worker.stop()


class _Zygote:
    """A process that imported the env's code once (``spawn``: a fresh interpreter) and forks every worker from itself.

    A worker then starts in milliseconds, however heavy the imports of the env's module (or of the trainer's
    ``__main__``, which ``spawn`` runs again). The zygote is single-threaded, so forking it is safe; it reaps its
    workers and reports how they ended. When the trainer's process dies, the zygote sees its pipe close, kills its
    workers and exits (and a worker dies with the zygote), so no env outlives the trainer.
    """

    def __init__(self, env_factory: Callable[[], Env], memory_mb: int | None) -> None:
        """Start the zygote and wait until it has loaded the env's code.

        Raises:
            EnvError: the env factory did not load in a new interpreter, with the zygote's exception.
        """
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()  # a Unix socket pair: it also carries the workers' pipe ends
        self.process = context.Process(  # the factory goes pickled: the zygote reports if it cannot load it
            target=zygote, args=(child, pickle.dumps(env_factory), memory_mb), name="trl-env-env-zygote", daemon=True
        )
        self.process.start()
        child.close()
        self._lock = threading.Lock()
        try:
            failure = self.conn.recv()
        except (EOFError, OSError) as e:
            failure = f"the process ended ({e!r}; its traceback is on stderr)"
        if failure is not None:
            self.process.join(5.0)
            raise EnvError(
                f"isolated({env_factory!r:.80}): the env's code did not load in a new process: {failure}. The "
                "factory's module must import in a fresh interpreter (the worker processes are spawned)."
            )

    def alive(self) -> bool:
        return self.process.is_alive()

    def _ask(self, *message: Any) -> Any:
        with self._lock:
            try:
                self.conn.send(message)
                answer = self.conn.recv()
                return (answer, reduction.recv_handle(self.conn)) if message[0] == "fork" else answer
            except (EOFError, OSError) as e:
                raise EnvError(f"the env workers' zygote process {self.process.pid} ended ({e!r})") from None

    def fork(self, root: str) -> tuple[int, Connection]:
        """A new worker serving envs in directories under ``root``: its pid and the trainer's end of its pipe."""
        pid, fd = self._ask("fork", root)
        return pid, Connection(fd)

    def exitcode(self, pid: int, wait_s: float) -> int | None:
        """How worker ``pid`` ended (negative: killed by that signal), waiting up to ``wait_s``; ``None``: running."""
        try:
            return self._ask("exitcode", pid, wait_s)  # type: ignore[no-any-return]
        except EnvError:
            return None


class _Worker:
    """One process, forked by the zygote, serving one env at a time over a pipe."""

    def __init__(self, zygote: _Zygote) -> None:
        self.zygote = zygote
        self.root = tempfile.mkdtemp(prefix="trl_env_worker_")  # the episodes' working directories; removed by stop()
        try:
            self.pid, self.conn = zygote.fork(self.root)
        except EnvError:  # the zygote is gone (killed, say)
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.exit: int | None = None
        atexit.register(self.stop)  # an idle worker at exit: its last working directory goes too

    def alive(self) -> bool:
        if self.exit is None:
            self.exit = self.zygote.exitcode(self.pid, 0.0)
        return self.exit is None

    def call(self, *message: Any) -> Any:
        try:
            self.conn.send(message)
            status, *payload = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self.exit = self.zygote.exitcode(self.pid, 5.0)
            raise EnvError(f"the env's worker process {self.pid} {_death(self.exit)}") from None
        if status == "error":
            name, text, trace = payload
            raise EnvError(f"{name}: {text} (in the env's worker process)\n{trace}")
        return payload

    def stop(self) -> None:
        """Kill the process if it runs, and remove its working directories (a killed worker cannot)."""
        if self.exit is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.exit = self.zygote.exitcode(self.pid, 5.0)  # reaped: no zombie left behind
        self.conn.close()
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)


def _death(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class ProcessEnv:
    """An env whose code runs in a worker process; ``reward`` and ``alive`` are copied back after each call."""

    def __init__(self, worker: _Worker, pool: _Pool) -> None:
        self.reward, self.alive = 0.0, True
        self._worker, self._pool, self._busy = worker, pool, threading.Lock()
        self._closed = False

    def _call(self, *message: Any) -> Delta:
        with self._busy:
            try:
                delta, self.reward, self.alive, info = self._worker.call(*message)
            except EnvError:
                if not self._worker.alive():  # it crashed (a reset that dies is never closed): clean up now
                    self._worker.stop()
                raise
            if info is not None:
                self.info = info
        return delta  # type: ignore[no-any-return]  # checked by the engine like any env's

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Build a fresh env in the worker (``env_factory()``, new working directory) and reset it."""
        return self, self._call("reset", seed)

    def step(self, action: Action) -> tuple[Env, Delta]:
        """Step the worker's env."""
        return self, self._call("step", action)

    def truncate(self, reason: str) -> None:
        """Tell the worker's env that trl-env ended its episode, if it listens (``Truncatable``)."""
        self._call("truncate", reason)

    def kill(self) -> None:
        """Kill the worker now, whatever runs in it (the engine's answer to a ``close`` hung past ``env_timeout``)."""
        self._closed = True
        self._worker.stop()

    def close(self) -> None:
        """Close the worker's env and give the worker back; kill it if a call is still running (a hung env)."""
        if self._closed:
            return
        self._closed = True
        if not self._busy.acquire(blocking=False):  # a call hangs on another thread: only killing frees it
            self._worker.stop()
            return
        try:
            self._worker.call("close")
        except EnvError:
            self._worker.stop()
            return
        finally:
            self._busy.release()
        self._pool.give_back(self._worker)
