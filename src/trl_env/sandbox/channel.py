"""Reading what a sandboxed run writes: its stdout and stderr with caps, and its status channel line by line.

Used by ``Sandbox.run``; nothing here trusts the bytes it reads (the code may write anything into every stream).
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import IO


class StatusLines:
    """The child's status channel, read line by line with bounded memory, whatever the code writes into it.

    The first ``layers`` line is the child's (written before the code runs); the first ``refused`` line and the
    last ``end`` line are kept however much the code floods the channel (a refusal line starts with a newline,
    so a partial line the code left cannot swallow it). A line longer than ``MAX_LINE`` bytes is kept to its first
    ``MAX_LINE`` bytes (a refusal naming a 70 kB path is still a refusal).
    """

    MAX_LINE = 4096

    def __init__(self) -> None:
        self.layers: tuple[str, ...] | None = None
        self.refused = ""
        self.ended = ""
        self._partial = b""  # the head of the line being read, at most MAX_LINE bytes

    def feed(self, data: bytes) -> None:
        """Take the next bytes read from the channel."""
        first, *rest = data.split(b"\n")
        self._partial += first[: max(0, self.MAX_LINE - len(self._partial))]
        for piece in rest:  # each piece follows a newline: the line before it is complete
            self._line(self._partial.decode("utf-8", "replace"))
            self._partial = piece[: self.MAX_LINE]

    def _line(self, line: str) -> None:
        if line.startswith("layers ") and self.layers is None:
            self.layers = tuple(x for x in line[7:].split(",") if x)
        elif line.startswith("refused ") and not self.refused:
            self.refused = line[8:]
        elif line.startswith("end "):
            self.ended = line[4:]


def collect_streams(
    caps: dict[IO[bytes], int], deadline: float, channel: IO[bytes], on_channel: Callable[[bytes], None]
) -> tuple[dict[IO[bytes], bytearray], set[IO[bytes]], bool]:
    """Read every stream to EOF or the deadline, keeping the first ``caps[stream]`` bytes of each.

    Everything read from ``channel`` goes to ``on_channel``, which keeps what it needs.

    Returns:
        The kept bytes per stream, the streams that had more than their cap, whether the deadline passed.
    """
    kept: dict[IO[bytes], bytearray] = {stream: bytearray() for stream in caps}
    overflowed: set[IO[bytes]] = set()
    with selectors.DefaultSelector() as selector:
        for stream in (*caps, channel):
            selector.register(stream, selectors.EVENT_READ, data=stream)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return kept, overflowed, True
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                source: IO[bytes] = key.data
                if source is channel:
                    on_channel(data)
                    continue
                buffer, cap = kept[source], caps[source]
                if len(buffer) + len(data) > cap:  # keep reading (and discarding) so the child never blocks
                    overflowed.add(source)
                    data = data[: max(0, cap - len(buffer))]
                buffer += data
    return kept, overflowed, False
