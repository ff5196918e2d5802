"""The rows a group becomes: TRL async GRPO's advantages, ``RolloutSample``, the group's record, its metrics.

``episode_samples``: one sample per training row, the episode's advantage on each (``credit="episode"``).
``turn_samples``: one sample per model turn, each with its turn's advantage (any other ``credit=``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from trl_env.rollout import Rollout
from trl_env.rollout.records import Row, Turn
from trl_env.train.advantages import ScaleRewards, group_advantages
from trl_env.train.credit import EpisodeCredit, credit_metrics
from trl_env.train.metrics import log_metrics
from trl_env.train.trl_internals import rollout_sample_type
from trl_env.train.trl_output import TrainingRow

if TYPE_CHECKING:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

__all__ = ["GroupRecord", "ScaleRewards", "Unscored", "episode_samples", "group_advantages", "turn_samples"]

Unscored = Literal["zero", "drop"]


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
    """Its episodes pushed (their samples put on the buffer: one each with ``history="sampled"``, one per row with
    ``"deployed"``, one per model turn with a ``credit=`` other than ``"episode"``)."""
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
def rollout_sample() -> type[RolloutSample]:
    """TRL's ``RolloutSample`` (importing ``trl.experimental.async_grpo`` takes seconds: done once, in ``__init__``)."""
    return rollout_sample_type()


RowVersions = Callable[[Sequence[Turn]], tuple[int, int] | None]
"""(oldest, newest) policy version among a row's turns (``groups._versions``)."""


def episode_samples(
    r: Rollout,
    rows: Sequence[TrainingRow],
    reward: float | None,
    reward_std: float,
    version: tuple[int, int] | None,
    group_id: int,
    row_versions: RowVersions,
) -> list[RolloutSample]:
    """The episode's rows (``training_rows``: one with ``history="sampled"``), each a sample with its advantage.

    With ``credit="episode"`` every token of the episode has the same advantage, which the sample carries. Empty
    when a row must not reach the trainer; then the episode is untrainable as a whole (its rows are trained together
    or not at all). A row's ``model_version`` is the oldest among its own turns.
    """
    if version is None or r.info.get("placeholder"):
        return []
    samples = []
    for t in rows:
        row_version = version if len(rows) == 1 else (row_versions(t.turns) or version)
        advantage = next((a for a, m in zip(t.advantages, t.trained, strict=True) if m), 0.0)
        sample = row_sample(t.row, t.turns, advantage, reward, reward_std, row_version, group_id, r.seed)
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
    if not _trainable(row):
        return None
    n = len(row.prompt_ids)
    mask = np.asarray([0] * n + row.env_mask, dtype=np.int64)
    logprobs = np.asarray([0.0] * n + row.logprobs, dtype=np.float32)
    completion = []
    for turn in turns:
        completion.append({"role": "assistant", "content": turn.text})
        if turn.delta:
            completion.append({"role": "user", "content": turn.delta})
    return rollout_sample()(
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


def _trainable(row: Row) -> bool:
    """Whether a row may reach the trainer: it needs a trained token, with finite logprobs at them all.

    An empty loss row crashes the trainer (``segment_id.max()`` of nothing); a ``None`` logprob from the server,
    parsed as NaN, makes the loss NaN.
    """
    mask = np.asarray(row.env_mask, dtype=np.int64)
    return bool(mask.any()) and bool(np.isfinite(np.asarray(row.logprobs, dtype=np.float32)[mask == 1]).all())


def turn_samples(
    r: Rollout,
    rows: Sequence[TrainingRow],
    reward: float | None,
    reward_std: float,
    version: tuple[int, int] | None,
    group_id: int,
    row_versions: RowVersions,
) -> list[RolloutSample]:
    """One sample per model turn of each of the episode's rows (``training_rows``), with its turn's advantage.

    TRL's async sample holds one advantage, so where the sync trainer gives each token its turn's advantage in one
    row, turn k of a row is a sample of its own: ``prompt_ids + completion_ids[:e]``, ``e`` the end of its model
    tokens, trained (mask 1, the sampler's logprobs; 0 elsewhere) on those tokens only, with the advantage those
    tokens have in the row. Every model token is trained exactly once, with the same advantage as in the sync
    trainer (``tests/test_one_contract.py``), and a row's samples share its prefix, which TRL's trie packing
    forwards once when they land in one micro-batch. Each sample of a row has the row's ``model_version`` (the
    oldest among its turns), so the staleness checks keep or drop a row whole. The episode's ``reward``,
    ``reward_std`` and ``env/turns`` ride on its last sample only (the trainer averages them over samples). Empty,
    the episode untrainable, where ``episode_samples`` would be.
    """
    if version is None or r.info.get("placeholder"):
        return []
    samples = []
    for t in rows:
        row = t.row
        row_version = version if len(rows) == 1 else (row_versions(t.turns) or version)
        if not _trainable(row):
            return []
        before = [0] * len(row.prompt_ids)
        shown: list[dict[str, str]] = []
        for span, turn in zip(t.spans, t.turns, strict=True):
            start, end = span.model.start, span.model.stop
            shown.append({"role": "assistant", "content": turn.text})
            if any(t.trained[start:end]):  # a turn of no token has nothing to train
                samples.append(
                    rollout_sample()(
                        prompt=[{"role": "user", "content": str(r.seed)}],
                        completion=list(shown),
                        input_ids=np.asarray(row.prompt_ids + row.completion_ids[:end], dtype=np.int64),
                        completion_mask=np.asarray(before + [0] * start + t.trained[start:end], dtype=np.int64),
                        old_log_probs=np.asarray(before + [0] * start + row.logprobs[start:end], dtype=np.float32),
                        advantage=float(t.advantages[start]),
                        model_version=row_version[0],
                        group_id=group_id,
                        metrics={},
                    )
                )
            if turn.delta:
                shown.append({"role": "user", "content": turn.delta})
    if samples:
        samples[-1].metrics.update(
            {
                "reward": math.nan if reward is None else float(reward),
                "reward_std": reward_std,
                "env/turns": float(len(r.turns)),
            }
        )
    return samples


CREDIT_RATES = ("credit/advantage_mean", "credit/advantage_abs_mean", "credit/flip_frac", "credit/anchored_turn_frac")
"""``credit_metrics`` keys the worker logs as (num, den) over turns: pooled over a logging window's groups."""


def group_credit_metrics(
    credits: Sequence[EpisodeCredit], advantages: Sequence[list[float] | None]
) -> dict[str, float | tuple[float, float]]:
    """``credit_metrics`` of one group, for the trainer's ``metrics_queue``.

    Means and fractions over turns (``advantage_mean``, ``advantage_abs_mean``, ``flip_frac``,
    ``anchored_turn_frac``, ``turn{k}/advantage_mean``) as ``(num, den)`` rates, so the trainer pools them over the
    turns of all the groups in its logging window; ``scored_turns``, ``anchor_groups`` and ``advantage_std`` stay
    gauges: the trainer logs their mean per group.
    """
    metrics = credit_metrics([credits], [list(advantages)])
    scored = [a for e, a in zip(credits, advantages, strict=True) if a is not None and not e.failed]
    turns = metrics["credit/scored_turns"]
    out: dict[str, float | tuple[float, float]] = {}
    for key, value in metrics.items():
        if key in CREDIT_RATES:
            out[key] = (value * turns, turns)
        elif key.startswith("credit/turn") and key.endswith("/advantage_mean"):
            k = int(key.removeprefix("credit/turn").split("/")[0])
            alive = float(sum(len(a) > k for a in scored))
            out[key] = (value * alive, alive)
        else:
            out[key] = value
    return out


class _MetricsSink:
    """Just enough of a trainer for ``log_metrics``: one process, training mode, a metric dict."""

    def __init__(self) -> None:
        self._metrics: dict[str, defaultdict[str, list[float]]] = {"train": defaultdict(list)}
        self.model = dataclasses.make_dataclass("M", [("training", bool, True)])()


def env_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """The sync path's ``env/*`` statistics (``trl_env.train.metrics``) for one group."""
    sink = _MetricsSink()
    log_metrics(sink, rollouts)
    return {key: values[-1] for key, values in sink._metrics["train"].items() if values}
