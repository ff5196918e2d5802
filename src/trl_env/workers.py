"""Daemon worker threads for user env code, with per-call start times so hung calls can be abandoned.

``concurrent.futures.ThreadPoolExecutor`` cannot give up on a call: its threads are joined at
interpreter exit, so one env stuck forever would hang the run at the end. Here a stuck call's
thread is left behind (daemon) and replaced, so capacity and shutdown never depend on user code.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Workers:
    """A fixed number of live daemon threads running submitted calls in order."""

    def __init__(self, size: int, *, name: str = "trl-env-worker") -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._name, self._spawned = name, 0
        self.started_at: dict[Future[Any], float] = {}
        """When each running call started (calls still queued are absent)."""
        for _ in range(max(1, size)):
            self._spawn()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)``; its future resolves with the result or the exception."""
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def abandon(self, future: Future[Any]) -> None:
        """Give up on a running call: its thread is left to finish (or not) and a new thread takes its place."""
        self.started_at.pop(future, None)
        self._spawn()

    def close(self) -> None:
        """Let every thread exit once the queue is drained (hung ones exit when their call returns)."""
        for _ in range(self._spawned):
            self._queue.put(None)

    def _spawn(self) -> None:
        self._spawned += 1
        threading.Thread(target=self._loop, name=f"{self._name}-{self._spawned}", daemon=True).start()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            self.started_at[future] = time.monotonic()
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001  # delivered to the scheduler through the future
                future.set_exception(e)
            finally:
                self.started_at.pop(future, None)


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
