"""Where each env text that spells an added token sits in a chat template's rendering (``DeployedHistory.encode``).

The conversation is rendered with a marker inside each such text, and the pieces are read off that rendering.
"""

from __future__ import annotations

import json
import re

from trl_env.render.messages import Message

MARK = "TRLENVHISTORY5b1e{}Q"  # plain text no template rewrites; locates each env text in a rendering
_MARKS = re.compile(r"TRLENVHISTORY5b1e(\d+)Q")


def _middle(text: str, added: re.Pattern[str]) -> int:
    """The middle of ``text``'s longest run of plain text (outside added tokens' strings); else the middle boundary."""
    edges = [0, *(x for m in added.finditer(text) for x in m.span()), len(text)]
    runs = [(edges[k], edges[k + 1]) for k in range(0, len(edges), 2)]
    start, end = max(runs, key=lambda r: r[1] - r[0])
    return (start + end) // 2 if end > start else min(edges, key=lambda x: abs(2 * x - len(text)))


def _start(text: str, added: re.Pattern[str]) -> int:
    return 0


def _end(text: str, added: re.Pattern[str]) -> int:
    return len(text)


def locate(marked: str, rendered: str, messages: list[Message], cuts: dict[int, int]) -> list[tuple[str, bool]] | None:
    """``rendered`` as pieces (text, is env text), read off ``marked``; ``None`` where the two renderings disagree.

    ``marked`` is the rendering with a marker at ``cuts[i]`` in env text ``i``. Without its markers it must be
    ``rendered``; around each marker, the text before and after the cut must stand as written, stripped or
    JSON-quoted. One entry per piece of ``rendered``, in order; env pieces are exactly env text.
    """
    parts = _MARKS.split(marked)
    if "".join(parts[0::2]) != rendered:
        return None  # the marker changed what the template wrote
    pieces: list[tuple[str, bool]] = []
    done = at = 0  # done: end of the last piece in ``rendered``; at: the current marker's position there
    for k in range(1, len(parts), 2):
        at += len(parts[k - 1])
        i = int(parts[k])
        if i not in cuts:
            return None
        text, cut = messages[i]["content"], cuts[i]
        for form in (_verbatim, _stripped, _quoted_pair):
            before, after = form(text[:cut], text[cut:])
            start, end = at - len(before), at + len(after)
            if start >= done and rendered[start:at] == before and rendered[at:end] == after:
                pieces += [(rendered[done:start], False), (rendered[start:end], True)]
                done = end
                break
        else:
            return None
    return [*pieces, (rendered[done:], False)]


def _verbatim(before: str, after: str) -> tuple[str, str]:
    return before, after


def _stripped(before: str, after: str) -> tuple[str, str]:
    """The two sides of a cut once the whole text is stripped (the marker between them is not whitespace)."""
    return before.lstrip(), after.rstrip()


def _quoted_pair(before: str, after: str) -> tuple[str, str]:
    return _quoted(before), _quoted(after)


def _quoted(text: str) -> str:
    """``text`` as a JSON string's inside (the marker's quotes are the template's own)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


CUTS = (_middle, _start, _end)
"""Where the marker goes in an env text, in the order tried: its middle, its start, its end."""
