"""One group of ``TrlEnvRolloutWorker``: its episodes through the shared generator, scored, pushed and recorded.

``run_group`` runs on a group thread of the worker; ``score_group`` gives the group's rows and metrics;
``_GroupGenerator`` is the shared generator as one group sees it (the versions live at its submits; stoppable).
"""

from __future__ import annotations

import collections
import functools
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trl_env.backends.base import Generation, GenerationRequest, Generator, GeneratorBase, request_sampling_of
from trl_env.env import Env
from trl_env.errors import ServerError
from trl_env.render.processors.base import Processor
from trl_env.rollout import Budgets, Ending, History, Rollout
from trl_env.rollout.records import Turn
from trl_env.seats import Seating
from trl_env.train.async_grpo.buffer import RolloutBuffer
from trl_env.train.async_grpo.samples import (
    GroupRecord,
    ScaleRewards,
    Unscored,
    env_metrics,
    episode_samples,
    group_advantages,
    group_credit_metrics,
    turn_samples,
)
from trl_env.train.credit import CreditEstimator, EpisodeCredit, estimate
from trl_env.train.episodes import run_episodes
from trl_env.train.options import RolloutOptions
from trl_env.train.trl_output import masked_episode, training_rows

if TYPE_CHECKING:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample


class GroupWorker(Protocol):
    """What a group needs of its ``TrlEnvRolloutWorker`` (worker.py, which runs ``run_group`` on its threads).

    A protocol, so that this module does not import the worker that imports it: the settings a group reads, the state
    the group threads share (under ``_lock``), and the worker's helpers that ``run_group`` calls (tests record them).
    """

    env_factory: Callable[[], Env] | Seating
    processor: Processor
    tokenizer: Any
    generator: Generator
    options: RolloutOptions
    budgets: Budgets
    num_generations: int
    estimator: CreditEstimator | None
    scale_rewards: ScaleRewards
    unscored: Unscored
    mask_truncated: bool
    on_group: Callable[[GroupRecord, list[Rollout]], None] | None
    model_version: int
    counts: dict[str, int]
    groups: collections.deque[GroupRecord]
    _lock: threading.Lock
    _push_lock: threading.Lock
    _stopping: threading.Event
    _pending: set[Future[Generation]]
    _buffer: RolloutBuffer
    _policy_re: re.Pattern[str] | None

    def _tick(self) -> None: ...
    def _halted(self) -> bool: ...
    def _put_metrics(self, metrics: dict[str, Any]) -> None: ...
    def _stale(self, sample: RolloutSample) -> bool: ...
    def _score(
        self,
        group_id: int,
        rollouts: list[Rollout],
        versions: list[tuple[int, int] | None],
        fallback: int,
        newest: int | None,
    ) -> tuple[list[list[RolloutSample]], dict[str, Any]]: ...
    def _push(self, episodes: list[list[RolloutSample]]) -> tuple[int, int, float, int, int]: ...
    def _write_transcripts(self, group_id: int, version: int, rollouts: list[Rollout]) -> None: ...


def run_group(worker: GroupWorker, group_id: int, seed: Any, claim: int) -> None:
    """Run, score and push one group on ``seed`` (a group thread of ``worker``), settling its ``claim`` of rows."""
    started, version_at_start = time.time(), worker.model_version
    gen = _GroupGenerator(worker)
    rollouts = run_episodes(
        [seed] * worker.num_generations,
        worker.env_factory,
        worker.processor,
        worker.tokenizer,
        gen,
        worker.options.engine,
        worker.budgets,
        env_workers=min(worker.options.engine.env_workers, worker.num_generations),
        on_episode_end=lambda _: worker._tick(),
    )
    ended = time.time()
    worker._tick()
    fallback = gen.first_version if gen.first_version is not None else version_at_start
    versions = [_versions(worker, r.turns, fallback, gen.last_version) for r in rollouts]
    endings = tuple(r.ending.value for r in rollouts)
    if worker._halted():  # stopped: its generations in flight were failed; nothing of it is pushed
        worker._buffer.release(claim)
        with worker._lock:
            for key, value in (("groups", 1), ("episodes", len(rollouts)), ("stopped", len(rollouts))):
                worker.counts[key] += value
        record = GroupRecord(
            group_id, str(seed), started, ended, tuple(versions), endings, 0, 0, False, stopped=len(rollouts)
        )
        worker.groups.append(record)
        if worker.on_group is not None:
            worker.on_group(record, rollouts)
        return
    episodes, metrics = worker._score(group_id, rollouts, versions, fallback, gen.last_version)
    worker._buffer.release(claim - sum(map(len, episodes)))  # failed, untrainable, ...: no row (more: a claim)
    pushed, dropped, waited, rows, rows_left = worker._push(episodes)
    stopped = len(episodes) - pushed - dropped  # stop() came while they waited for room in the buffer
    worker._buffer.release(rows_left)
    metrics.update(
        {
            "rollout/pushed_total": float(pushed),
            "rollout/dropped_stale_total": float(dropped),
            "rollout/backpressure_s": waited,
            "rollout/group_s": ended - started,
        }
    )
    if worker.options.engine.history is History.DEPLOYED or worker.estimator is not None:
        metrics["rollout/rows_pushed_total"] = float(rows)
    worker._put_metrics(metrics)
    worker._put_metrics({k: (v, 1.0) for k, v in env_metrics(rollouts).items()})
    with worker._lock:
        worker.counts["pushed"] += pushed
        worker.counts["rows"] += rows
        worker.counts["dropped_stale"] += dropped
        worker.counts["stopped"] += stopped
    record = GroupRecord(
        group_id, str(seed), started, ended, tuple(versions), endings, pushed, dropped, not stopped, stopped
    )
    worker.groups.append(record)
    worker._write_transcripts(group_id, version_at_start, rollouts)
    if worker.on_group is not None:
        worker.on_group(record, rollouts)


def _versions(worker: GroupWorker, turns: Sequence[Turn], fallback: int, newest: int | None) -> tuple[int, int] | None:
    """(oldest, newest) version among an episode's or a row's turns: from their adapter names, else ``fallback``."""
    if not turns:
        return None
    parsed = [_parse_policy(worker, t.policy) for t in turns]
    known = [v for v in parsed if v is not None]
    if len(known) < len(parsed):  # no adapter names (full-weight sync, or a generator that records none)
        known += [fallback, newest if newest is not None else fallback]
    return min(known), max(known)


def _parse_policy(worker: GroupWorker, policy: str | None) -> int | None:
    match = worker._policy_re.match(policy) if (policy and worker._policy_re) else None
    return int(match.group(1)) if match else None


def score_group(
    worker: GroupWorker,
    group_id: int,
    rollouts: list[Rollout],
    versions: list[tuple[int, int] | None],
    fallback: int,
    newest: int | None,
) -> tuple[list[list[RolloutSample]], dict[str, Any]]:
    """The group's rows to push, per episode, and its metrics.

    Each episode counts once in the advantages (over its scored, non-failed episodes); its rows carry its
    advantage. With a credit estimator, each of its turns is a sample with the turn's advantage instead (an
    unscored episode's turns get 0), and the group's ``credit/*`` metrics join the others.
    """
    n = len(rollouts)
    failed = [r.ending is Ending.ERROR for r in rollouts]
    rewards = [None if f else r.reward for r, f in zip(rollouts, failed, strict=True)]
    advantages = group_advantages(rewards, worker.scale_rewards)
    scored = [r for r, a in zip(rewards, advantages, strict=True) if a is not None and r is not None]
    reward_std = float(np.std(scored)) if scored else math.nan
    per_turn: list[list[float] | None] = [None] * n
    credit: dict[str, Any] = {}
    if worker.estimator is not None:
        credits = [EpisodeCredit.from_rollout(r) for r in rollouts]
        per_turn = estimate(worker.estimator, credits)
        credit = group_credit_metrics(credits, per_turn)
    if worker.estimator is None:  # credit="episode": the episode's advantage on every turn
        pairs = zip(rollouts, advantages, strict=True)
        per_turn = [None if a is None or not r.turns else [a] * len(r.turns) for r, a in pairs]
    else:  # an unscored episode's turns get 0
        per_turn = [None if a is None else t for t, a in zip(per_turn, advantages, strict=True)]
    train = training_rows(rollouts, per_turn, mask_truncated=worker.mask_truncated)  # every trainer's rows
    samples, untrainable, unscored, dropped_unscored, masked = [], 0, 0, 0, 0
    episodes = zip(rollouts, failed, advantages, rewards, versions, strict=True)
    for e, (r, f, adv, reward, version) in enumerate(episodes):
        if f:
            continue
        if adv is None:
            unscored += 1
            if worker.unscored == "drop":
                dropped_unscored += 1
                continue
        if masked_episode(r, worker.mask_truncated):
            masked += 1
            continue
        rows_of = [t for t in train if t.episode == e]
        row_versions = functools.partial(_versions, worker, fallback=fallback, newest=newest)
        make = episode_samples if worker.estimator is None else turn_samples
        rows = make(r, rows_of, reward, reward_std, version, group_id, row_versions)
        if not rows:
            untrainable += 1
            continue
        samples.append(rows)
    spans = [v[1] - v[0] for v in versions if v is not None]
    metrics: dict[str, Any] = {
        "rollout/groups_total": 1.0,
        "rollout/episodes_total": float(n),
        "rollout/failed_frac": (float(sum(failed)), float(n)),
        "rollout/unscored_frac": (float(unscored), float(n)),
        "rollout/untrainable_total": float(untrainable),
        "rollout/truncated_masked_total": float(masked),
        "rollout/reward_mean": (float(sum(scored)), float(len(scored))),
        "rollout/reward_std": reward_std,
        "rollout/version_span_mean": (float(sum(spans)), float(len(spans))),
        "rollout/version_span_max": float(max(spans, default=0)),
        **credit,
    }
    with worker._lock:
        for key, value in (
            ("groups", 1),
            ("episodes", n),
            ("failed", sum(failed)),
            ("unscored", unscored),
            ("dropped_unscored", dropped_unscored),
            ("untrainable", untrainable),
            ("truncated_masked", masked),
        ):
            worker.counts[key] += value
    return samples, metrics


def push_group(worker: GroupWorker, episodes: list[list[RolloutSample]]) -> tuple[int, int, float, int, int]:
    """Put the rows on the buffer, a group's rows together, an episode's rows at once; drop stale episodes.

    Returns (episodes pushed, episodes dropped as stale, waited_s, rows pushed, rows left unpushed by ``stop()``).
    """
    pushed = dropped = rows = 0
    waited = 0.0
    with worker._push_lock:
        for k, samples in enumerate(episodes):
            while not worker._halted():
                t0 = time.monotonic()
                outcome = worker._buffer.put_fresh(samples, worker._stale, timeout=0.2)
                if outcome == "full":
                    waited += time.monotonic() - t0
                    worker._tick()  # waiting for the trainer is not a hang
                    continue
                pushed += outcome == "pushed"
                rows += len(samples) if outcome == "pushed" else 0
                dropped += outcome == "stale"
                break
            else:
                return pushed, dropped, waited, rows, sum(map(len, episodes[k:]))
    return pushed, dropped, waited, rows, 0


def _track(worker: GroupWorker, inner: list[Future[Generation]]) -> list[Future[Generation]]:
    """Futures the worker can fail on ``stop()``, settled from the generator's; each one ticks the heartbeat."""
    outer: list[Future[Generation]] = [Future() for _ in inner]
    with worker._lock:
        worker._pending.update(outer)
    for src, dst in zip(inner, outer, strict=True):
        src.add_done_callback(functools.partial(_settled, worker, dst=dst))
    if worker._stopping.is_set():  # stop() ran while these were being submitted
        for dst in outer:
            settle_future(dst, error=ServerError("the rollout worker stopped"))
    return outer


def _settled(worker: GroupWorker, src: Future[Generation], *, dst: Future[Generation]) -> None:
    worker._tick()
    with worker._lock:
        worker._pending.discard(dst)
    error = src.exception() if not src.cancelled() else ServerError("the generation was cancelled")
    settle_future(dst, result=None if error else src.result(), error=error)


class _GroupGenerator(GeneratorBase):
    """The shared generator as one group sees it: notes the version live at each submit; stoppable."""

    def __init__(self, worker: GroupWorker) -> None:
        self.worker, self.inner = worker, worker.generator
        self.continuous = bool(self.inner.continuous)
        self.request_sampling = request_sampling_of(self.inner)  # requests pass through as they are
        self.first_version: int | None = None
        self.last_version: int | None = None

    @property
    def context_limit(self) -> int | None:
        return self.inner.context_limit

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        if self.worker._halted():
            raise ServerError("the rollout worker stopped")  # the engine fails these episodes at once
        version = self.worker.model_version
        if self.first_version is None:
            self.first_version = version
        self.last_version = version
        return _track(self.worker, list(self.inner.submit(requests)))


def settle_future(
    future: Future[Generation], *, result: Generation | None = None, error: BaseException | None = None
) -> None:
    """Fail ``future`` with ``error``, else give it ``result``; one settled already (``stop()`` raced) stays so."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # a Generation when there is no error
    except InvalidStateError:  # settled already (stop() and the answer raced)
        pass
