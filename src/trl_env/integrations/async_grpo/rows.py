"""The rows a group becomes: TRL async GRPO's advantages, ``RolloutSample``, the group's record, ``env/*`` metrics."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from trl_env.integrations.metrics import log_metrics
from trl_env.rollout import Rollout

if TYPE_CHECKING:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

ADVANTAGE_EPS = 1e-8
"""TRL async's epsilon in ``(r - mean) / (std + eps)`` (``_score_group``)."""

ScaleRewards = Literal["group", "none"]
Unscored = Literal["zero", "drop"]


def group_advantages(rewards: Sequence[float | None], scale_rewards: ScaleRewards = "group") -> list[float | None]:
    """TRL async GRPO's advantages for one group: ``None`` (unscored) members are out of the statistics.

    ``(r - mean) / (std + 1e-8)`` over the scored members, with numpy's population std (ddof=0), as TRL's
    ``AsyncRolloutWorker._score_group``; ``scale_rewards="none"`` gives ``r - mean``. Unscored members stay
    ``None``. A non-finite reward counts as unscored.
    """
    finite = [r if r is not None and math.isfinite(r) else None for r in rewards]
    scored = np.asarray([r for r in finite if r is not None], dtype=np.float64)
    if scored.size == 0:
        return [None] * len(finite)
    mean, std = float(scored.mean()), float(scored.std())
    scale = std + ADVANTAGE_EPS if scale_rewards == "group" else 1.0
    return [None if r is None else (r - mean) / scale for r in finite]


@dataclass(frozen=True)
class GroupRecord:
    """What one group did, kept in ``TrlEnvRolloutWorker.groups`` (the most recent 10,000)."""

    group_id: int
    seed: str
    started: float
    """``time.time()`` when the group was dispatched."""
    ended: float
    """``time.time()`` when its last episode ended (before its samples were pushed)."""
    versions: tuple[tuple[int, int] | None, ...]
    """Per episode: (oldest, newest) policy version among its turns; ``None`` for an episode without a turn."""
    endings: tuple[str, ...]
    pushed: int
    """Its episodes pushed (their rows put on the buffer: one each with ``history="sampled"``, one per row with
    ``"deployed"``)."""
    dropped_stale: int
    """Its episodes dropped as stale when it ended."""
    complete: bool
    """False for a group cut short by ``stop()`` (or by another group thread's failure): either before it was scored
    (its generations in flight were failed; nothing was pushed) or while its rows waited for room in the buffer (only
    ``pushed`` of them were)."""
    stopped: int = 0
    """Its episodes counted as ``stopped`` in ``TrlEnvRolloutWorker.counts``: all of them for a group stopped before
    it was scored, else its episodes not pushed when ``stop()`` came."""


@functools.cache
def _rollout_sample() -> type[RolloutSample]:
    """TRL's ``RolloutSample`` (importing ``trl.experimental.async_grpo`` takes seconds: done once, in ``__init__``)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample


class _MetricsSink:
    """Just enough of a trainer for ``log_metrics``: one process, training mode, a metric dict."""

    def __init__(self) -> None:
        self._metrics: dict[str, defaultdict[str, list[float]]] = {"train": defaultdict(list)}
        self.model = dataclasses.make_dataclass("M", [("training", bool, True)])()


def _env_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """The sync path's ``env/*`` statistics (``trl_env.integrations.metrics``) for one group."""
    sink = _MetricsSink()
    log_metrics(sink, rollouts)
    return {key: values[-1] for key, values in sink._metrics["train"].items() if values}
