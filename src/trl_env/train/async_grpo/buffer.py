"""``rollout_buffer``: the bounded queue the trainer reads, its staleness eviction and the admission rule."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class RolloutBuffer(queue.Queue):  # type: ignore[type-arg]  # of RolloutSample
    """A bounded ``queue.Queue`` whose producer checks staleness under the queue's lock, and the admission rule.

    ``update_model_version`` changes the version and then calls ``evict``; ``put_fresh`` decides and
    puts under the same lock. So once ``update_model_version(v)`` has returned, no row older than
    ``v - max_staleness`` is in the buffer, and the trainer (which reads after that call) never has to
    drop one. Uses ``Queue``'s documented subclass hooks (``_qsize``, ``_put``, ``_get``) and its lock.

    Admission: ``claimed`` counts the rows of started groups not yet read, evicted or given up (``release``),
    ``reads`` the rows read since the last sync. A group's rows are read after the ``claimed`` ones, at
    ``rows_per_version`` per version, so they are read within ``max_staleness`` versions of its start if
    ``claimed + n <= max(rows_per_version - reads, 0) + max_staleness × rows_per_version`` (``claim``): the
    reads left at this version, then those of the next ``max_staleness``.
    """

    def __init__(self, maxsize: int, rows_per_version: int) -> None:
        super().__init__(maxsize)
        self.may_start = threading.Condition(self.mutex)
        self.claimed = 0
        self.reads = 0
        self.rows_per_version = rows_per_version
        """The trainer's reads between its last two syncs; the given estimate until then."""
        self._versions_read = 0

    def claim(self, n: int, max_staleness: int, timeout: float) -> bool:
        """Claim ``n`` rows for a group if the admission rule lets it start; else ``False`` after ``timeout``."""
        with self.may_start:
            if not self._admits(n, max_staleness):
                self.may_start.wait(timeout)
                if not self._admits(n, max_staleness):
                    return False
            self.claimed += n
            return True

    def _admits(self, n: int, max_staleness: int) -> bool:
        # With nothing unread, a group starts whatever the rule says: the trainer waits for it. More reads than
        # expected at this version (the trainer's first also fills its data loader's lookahead) leave none here.
        left_now = max(self.rows_per_version - self.reads, 0)
        return not self.claimed or self.claimed + n <= left_now + max_staleness * self.rows_per_version

    def release(self, n: int) -> None:
        """Give up ``n`` claimed rows that will never be read (no row made, stale, stopped).

        A negative ``n`` claims the rows a group made beyond its claim (``history="deployed"``: several per episode).
        """
        if n:
            with self.may_start:
                self.claimed -= n
                assert self.claimed >= 0, self.claimed
                self.may_start.notify_all()

    def next_version(self) -> None:
        """The trainer synced: measure its reads per version and start counting again."""
        with self.may_start:
            if self.reads:
                # The trainer's first version with reads also fills its data loader's one-batch lookahead.
                if self._versions_read:
                    self.rows_per_version = self.reads
                self._versions_read += 1
            self.reads = 0
            self.may_start.notify_all()

    def _get(self) -> Any:
        item = super()._get()
        self.claimed -= 1
        self.reads += 1
        self.may_start.notify_all()
        return item

    def put_fresh(self, items: list[Any], stale: Callable[[Any], bool], timeout: float) -> str:
        """Put an episode's rows together unless the first (its oldest) is stale: ``"pushed"``, ``"stale"``, ``"full"``.

        ``"full"`` after ``timeout`` without room. Room for one row is enough: an episode of k rows may fill the
        buffer up to ``maxsize + k - 1``, so no episode waits forever and none is split by a version sync.
        """
        with self.not_full:
            if 0 < self.maxsize <= self._qsize():
                self.not_full.wait(timeout)
                if 0 < self.maxsize <= self._qsize():
                    return "full"
            if stale(items[0]):
                self.claimed -= len(items)
                self.may_start.notify_all()
                return "stale"
            for item in items:
                item.enqueued_at = time.time()
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()
            return "pushed"

    def evict(self, stale: Callable[[Any], bool]) -> int:
        """Remove every stale item; returns how many."""
        with self.mutex:
            keep = [item for item in self.queue if not stale(item)]
            evicted = len(self.queue) - len(keep)
            if evicted:
                self.queue.clear()
                self.queue.extend(keep)
                self.claimed -= evicted
                self.not_full.notify(evicted)
                self.may_start.notify_all()
            return evicted
