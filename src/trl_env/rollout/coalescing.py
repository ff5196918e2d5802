"""Coalescing: how long a ready model turn waits for the turns prepared beside it (``coalesce_s``)."""

from __future__ import annotations

from typing import Literal

from trl_env.errors import ConfigError

COALESCE_S = 0.01
"""The shortest window of ``coalesce_s="auto"``: a ready turn waits at most 10 ms for the turns prepared beside it."""
COALESCE_MAX_S = 0.05
"""The longest window of ``coalesce_s="auto"``, reached when env steps take 150 ms or more."""


def check_coalesce(coalesce_s: float | Literal["auto"]) -> None:
    """Refuse a ``coalesce_s`` that is not a finite number of seconds >= 0.

    Raises:
        ConfigError: naming the value and the fix.
    """
    if coalesce_s == "auto":
        return
    if not isinstance(coalesce_s, (int, float)) or not 0 <= coalesce_s < float("inf"):
        raise ConfigError(f"coalesce_s={coalesce_s!r}: give seconds >= 0 (0 sends every turn as soon as it is ready).")


def coalesce_window(coalesce_s: float | Literal["auto"], step_s: float) -> float:
    """``coalesce_s``, or with ``"auto"`` a third of a typical env step (``step_s``), from 10 to 50 ms.

    Turns reach the engine spread over the time their env steps take; holding the first of them for a third
    of that gathers several into one request at a small cost to each. Fast envs keep the 10 ms floor: their
    turns come in bursts, which end when no env call is under way.
    """
    if coalesce_s != "auto":
        return coalesce_s
    return min(COALESCE_MAX_S, max(COALESCE_S, step_s / 3))
