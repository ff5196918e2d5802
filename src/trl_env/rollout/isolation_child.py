"""The processes ``isolated`` starts, from the inside: the zygote's loop (``zygote``) and each worker's (``_serve``).

The zygote is spawned by ``trl_env.rollout.isolation._Zygote``; it forks the workers, each of which serves one env at a
time in a fresh working directory.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from trl_env.env import Env, Truncatable, json_safe


def zygote(conn: Connection, factory: bytes, memory_mb: int | None) -> None:
    """Load the env factory (say ``None``, or why not); then fork a worker, or say how one ended, on request.

    On the trainer's death (its end of the pipe closes: also by ``os._exit`` or SIGKILL, when no clean-up of its own
    runs), kill the workers, reap them, remove their directories and exit.
    """
    try:
        env_factory = pickle.loads(factory)
    except BaseException as e:  # noqa: BLE001  # whatever the env's module raises on import, the trainer hears it
        conn.send(f"{type(e).__name__}: {e}")
        return
    conn.send(None)
    ended: dict[int, int] = {}
    workers: set[int] = set()
    roots: dict[int, str] = {}  # each worker's directory, until the trainer has heard how the worker ended

    def reap() -> None:
        for pid in list(workers):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                workers.discard(pid)
                ended[pid] = os.waitstatus_to_exitcode(status)

    while True:
        try:
            command, *args = conn.recv()
        except (EOFError, OSError):  # the trainer is gone
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in workers:  # dead before their directories go: nothing writes there any more
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            for root in roots.values():
                shutil.rmtree(root, ignore_errors=True)
            return
        if command == "fork":
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the worker
                try:
                    conn.close()
                    ours.close()
                    _die_with_parent()
                    _serve(Connection(theirs.detach()), env_factory, memory_mb, args[0])
                finally:
                    os._exit(0)
            theirs.close()
            workers.add(pid)
            roots[pid] = args[0]
            conn.send(pid)
            reduction.send_handle(conn, ours.fileno(), 0)
            ours.close()
        else:  # exitcode
            pid, wait_s = args
            deadline = time.monotonic() + wait_s
            reap()
            while pid in workers and time.monotonic() < deadline:
                time.sleep(0.005)
                reap()
            if pid not in workers:
                roots.pop(pid, None)  # the trainer removes the directory of a worker it heard has ended
            conn.send(ended.pop(pid, None) if pid not in workers else None)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the zygote) dies; elsewhere, do nothing."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _serve(conn: Connection, env_factory: Callable[[], Env], memory_mb: int | None, root: str) -> None:
    """The worker's loop: ``reset`` builds a fresh env in a fresh directory; ``close`` closes it and waits."""
    if memory_mb is not None:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    env: Any = None
    workdir = None
    while True:
        try:
            command, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if command == "reset":
                workdir = _fresh_workdir(workdir, root)
                env = env_factory()
                env, delta = env.reset(*args)
            elif command == "step":
                env, delta = env.step(*args)
            elif command == "truncate":
                if isinstance(env, Truncatable):
                    env.truncate(*args)
                delta = ""
            else:  # close
                if env is not None and callable(getattr(env, "close", None)):
                    env.close()
                env, delta = None, None
            reward, alive = (getattr(env, "reward", 0.0), getattr(env, "alive", False)) if env else (0.0, False)
            info = getattr(env, "info", None)
            conn.send(("ok", delta, reward, alive, json_safe(info) if isinstance(info, Mapping) else info))
        except BaseException as e:  # noqa: BLE001  # everything env code raises goes back to its episode
            conn.send(("error", type(e).__name__, str(e), traceback.format_exc(limit=-8)))


def _fresh_workdir(previous: str | None, root: str) -> str:
    os.chdir(root)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    workdir = tempfile.mkdtemp(prefix="trl_env_env_", dir=root)
    os.chdir(workdir)
    return workdir
