"""The rows a group becomes: TRL async GRPO's advantages, ``RolloutSample``, the group's record, ``env/*`` metrics."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from trl_env.integrations.metrics import log_metrics
from trl_env.rollout import Rollout
from trl_env.rollout.records import Row, Turn

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


RowVersions = Callable[[Sequence[Turn]], tuple[int, int] | None]
"""(oldest, newest) policy version among a row's turns (``TrlEnvRolloutWorker._versions``)."""


def episode_samples(
    r: Rollout,
    advantage: float,
    reward: float | None,
    reward_std: float,
    version: tuple[int, int] | None,
    group_id: int,
    row_versions: RowVersions,
) -> list[RolloutSample]:
    """The episode's rows (``Rollout.rows``: one with ``history="sampled"``), each with the episode's advantage.

    Empty when a row must not reach the trainer; then the episode is untrainable as a whole (its rows are
    trained together or not at all). A row's ``model_version`` is the oldest among its own turns.
    """
    if version is None or r.info.get("placeholder"):
        return []
    rows = r.rows or (Row(r.prompt_ids, r.completion_ids, r.logprobs, r.env_mask, len(r.turns)),)
    if len(rows) == 1:  # the episode's own lists and versions (history="sampled", or a merged deployed episode)
        sample = row_sample(rows[0], r.turns, advantage, reward, reward_std, version, group_id, r.seed)
        return [] if sample is None else [sample]
    samples, first = [], 0
    for row in rows:
        turns = r.turns[first : first + row.turns]
        first += row.turns
        row_version = row_versions(turns) or version
        sample = row_sample(row, turns, advantage, reward, reward_std, row_version, group_id, r.seed)
        if sample is None:
            return []
        samples.append(sample)
    return samples


def row_sample(
    row: Row,
    turns: Sequence[Turn],
    advantage: float,
    reward: float | None,
    reward_std: float,
    version: tuple[int, int],
    group_id: int,
    seed: Any,
) -> RolloutSample | None:
    """One row as a ``RolloutSample``, or ``None`` when it must not reach the trainer."""
    if not any(row.env_mask):
        return None  # no trained token: an empty loss row crashes the trainer (segment_id.max() of nothing)
    n = len(row.prompt_ids)
    mask = np.asarray([0] * n + row.env_mask, dtype=np.int64)
    logprobs = np.asarray([0.0] * n + row.logprobs, dtype=np.float32)
    if not np.isfinite(logprobs[mask == 1]).all():
        return None  # a None logprob from the server (parsed as NaN) would make the loss NaN
    completion = []
    for turn in turns:
        completion.append({"role": "assistant", "content": turn.text})
        if turn.delta:
            completion.append({"role": "user", "content": turn.delta})
    return _rollout_sample()(
        prompt=[{"role": "user", "content": str(seed)}],
        completion=completion,
        input_ids=np.asarray(row.prompt_ids + row.completion_ids, dtype=np.int64),
        completion_mask=mask,
        old_log_probs=logprobs,
        advantage=float(advantage),
        model_version=version[0],
        group_id=group_id,
        metrics={
            "reward": math.nan if reward is None else float(reward),
            "reward_std": reward_std,
            "env/turns": float(len(turns)),
        },
    )


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
