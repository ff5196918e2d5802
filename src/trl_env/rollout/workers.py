"""Daemon worker threads for user env code, with per-call start times so hung calls can be abandoned.

``concurrent.futures.ThreadPoolExecutor`` cannot give up on a call: its threads are joined at
interpreter exit, so one env stuck forever would hang the run at the end. Here a stuck call's
thread is left behind (daemon) and replaced, so capacity and shutdown never depend on user code.
Between calls a worker holds no reference to anything it ran (no env, no model), and ``close``
stops and joins every thread that is not stuck in a call, so nothing of a rollout outlives it on a
worker thread (objects freed by a thread during interpreter shutdown crash some libraries).

A call may wait on another episode (a seat of a game waiting for its turn: ``trl_env.seats``) inside ``waiting()``:
while it waits it is not timed, does not count as env work the scheduler waits for, and a spare thread takes its
place, so waiting calls can never use up the pool (the "managed blocker" of Java's ForkJoinPool).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class Workers:
    """A fixed number of live daemon threads running submitted calls in order."""

    def __init__(self, size: int, *, name: str = "trl-env-worker", on_wait: Callable[[], None] | None = None) -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._name, self._spawned = name, 0
        self._lock = threading.Lock()
        self._running: dict[Future[Any], tuple[float, threading.Thread]] = {}  # start, thread; under _lock
        self._threads: dict[threading.Thread, bool] = {}  # thread -> abandoned
        self._waiting: set[Future[Any]] = set()  # calls inside waiting(); under _lock
        self._on_wait = on_wait
        for _ in range(max(1, size)):
            self._spawn()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)``; its future resolves with the result or the exception."""
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def running(self) -> dict[Future[Any], float]:
        """A snapshot of the calls running now and when each started (``time.monotonic``)."""
        with self._lock:
            return {future: started for future, (started, _) in self._running.items()}

    def waiting_calls(self) -> int:
        """How many running calls are waiting on another episode (inside ``waiting()``)."""
        with self._lock:
            return len(self._waiting)

    def abandon(self, future: Future[Any]) -> None:
        """Give up on a running call: its thread is left to finish (or not) and a new thread takes its place."""
        with self._lock:
            _, thread = self._running.pop(future, (0.0, None))
            if thread is not None:
                self._threads[thread] = True
        self._spawn()

    def close(self, join_timeout: float = 5.0) -> None:
        """Stop every thread once the queue is drained and join those not stuck in an abandoned call."""
        for _ in range(self._spawned):
            self._queue.put(None)
        deadline = time.monotonic() + join_timeout
        for thread, abandoned in list(self._threads.items()):
            if not abandoned:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self) -> None:
        self._spawned += 1
        thread = threading.Thread(target=self._loop, name=f"{self._name}-{self._spawned}", daemon=True)
        with self._lock:
            self._threads[thread] = False
        thread.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            del item
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._running[future] = (time.monotonic(), me)
                _CURRENT.call = (self, future)
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001  # delivered to the scheduler through the future
                    future.set_exception(e)
                    del e
                finally:
                    _CURRENT.call = None
                    with self._lock:
                        self._running.pop(future, None)
            del future, fn, args  # hold nothing of a finished call while waiting for the next one

    def _wait(self, future: Future[Any]) -> bool:
        """The call ``future`` starts waiting: untimed, and a spare thread takes its place; False if abandoned."""
        with self._lock:
            if self._running.pop(future, None) is None:
                return False
            self._waiting.add(future)
        self._spawn()
        if self._on_wait is not None:
            self._on_wait()
        return True

    def _resume(self, future: Future[Any]) -> None:
        """The call ``future`` goes on: timed again from now; one thread (the first idle one) retires."""
        with self._lock:
            self._waiting.discard(future)
            self._running[future] = (time.monotonic(), threading.current_thread())
        self._queue.put(None)


class _Current(threading.local):
    call: tuple[Workers, Future[Any]] | None = None


_CURRENT = _Current()
"""The pool and the call this worker thread is running, for ``waiting()``."""


@contextmanager
def waiting() -> Iterator[None]:
    """Mark the current call as waiting on another episode while the block runs (see the module docstring).

    Outside a worker call (a test calling an env directly) it does nothing.
    """
    call = _CURRENT.call
    if call is None or not call[0]._wait(call[1]):
        yield
        return
    try:
        yield
    finally:
        call[0]._resume(call[1])


def drain(done: queue.SimpleQueue[Future[Any]], timeout: float | None) -> list[Future[Any]]:
    """Wait for one finished future (or the timeout), then take every other one already finished."""
    try:
        batch = [done.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            batch.append(done.get_nowait())
        except queue.Empty:
            return batch
