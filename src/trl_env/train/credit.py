"""Credit assignment across the turns of an episode: per-turn advantages for one GRPO group (docs/credit.md).

Pure functions over plain data; ``credit=`` on ``make_rollout_func`` (trained with ``EpisodeGRPOTrainer``) and on the
async worker delivers them. ``EpisodeCredit.from_rollout`` turns a ``Rollout`` into what an estimator reads (one reward
and one anchor per model turn); a ``CreditEstimator`` maps a group's episodes to one advantage per turn (``None`` for
a failed episode, which is out of every statistic); ``token_advantages`` gives every model token of a turn that turn's
advantage, row by row; ``credit_metrics`` summarises them. ``get_estimator`` picks one by its ``credit=`` name.
``EpisodeCredit`` and ``token_advantages``, the two that read a ``Rollout``, live in ``trl_env.train.episode_credit``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from trl_env.errors import ConfigError
from trl_env.train.advantages import EPS, ScaleRewards, group_advantages
from trl_env.train.episode_credit import EpisodeCredit, token_advantages

__all__ = [
    "CREDIT_ESTIMATORS",
    "CreditEstimator",
    "DiscountedReturns",
    "EpisodeAdvantage",
    "EpisodeCredit",
    "GiGPO",
    "NaivePerTurnIndex",
    "PerRole",
    "credit_estimator",
    "credit_metrics",
    "estimate",
    "get_estimator",
    "token_advantages",
]

Scale = ScaleRewards


Advantages = list[list[float] | None]


class CreditEstimator(Protocol):
    """A group's episodes in, per-turn advantages out: one list per episode, ``None`` for a failed one."""

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode of ``group``, one advantage per turn; ``None`` for a failed episode."""
        ...


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}``, one per turn."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof=0), as ``numpy.mean`` / ``numpy.std``."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def _check(gamma: float, scale_rewards: str) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: it must be in [0, 1].")
    if scale_rewards not in ("group", "none"):
        raise ConfigError(f"scale_rewards={scale_rewards!r}: expected 'group' or 'none'.")


@dataclass(frozen=True)
class EpisodeAdvantage:
    """``credit="episode"``, today's behaviour: every turn gets its episode's group advantage.

    ``(R - mean) / (std + 1e-4)`` over the group's scored episodes, ``R`` the episode's return: TRL ``GRPOTrainer``'s
    rule, the one every trainer uses (``trl_env.train.advantages``); ``scale_rewards="none"`` gives ``R - mean``.
    """

    scale_rewards: Scale = "group"

    def __post_init__(self) -> None:
        _check(1.0, self.scale_rewards)

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode, one advantage per turn; ``None`` for a failed episode."""
        per_episode = self.per_episode(group)
        return [None if a is None else [a] * len(e.turn_rewards) for e, a in zip(group, per_episode, strict=True)]

    def per_episode(self, group: Sequence[EpisodeCredit]) -> list[float | None]:
        """One advantage per episode (``None`` for a failed one)."""
        totals = [None if e.failed else e.total for e in group]
        return group_advantages(totals, self.scale_rewards)


@dataclass(frozen=True)
class DiscountedReturns:
    """``credit="discounted"``: per-turn discounted returns with a baseline unbiased under policy-controlled length.

    Turn t of episode i gets ``G_{i,t} - b_t``, its discounted return-to-go minus a baseline that no episode's own
    actions move, so the estimator stays unbiased when the policy decides how many turns an episode lasts.

    ``baseline="turn"`` (default): ``b_t`` is the mean over *all* the group's scored episodes of their return-to-go
    at turn index t, an episode that already stopped counting 0. ``baseline="episode"``: ``b_t`` is the group mean
    of the episodes' (discounted) returns, the same for every turn (with only a final reward, ``gamma=1`` and
    ``scale_rewards="none"`` this is ``credit="episode"``). Either mean includes episode i itself, as TRL's does,
    which scales the expected gradient by ``(n - 1) / n`` for every parameter (docs/credit.md has the proof sketch).
    ``scale_rewards="group"`` then divides the group's advantages by their root mean square over its turns
    (Bessel-corrected over its episodes, + ``advantages.EPS``), so they have unit scale; ``"none"`` leaves them (the
    setting the unbiasedness statement is about, as for TRL's own ``scale_rewards``).
    """

    gamma: float = 1.0
    baseline: Literal["turn", "episode"] = "turn"
    scale_rewards: Scale = "group"

    def __post_init__(self) -> None:
        _check(self.gamma, self.scale_rewards)
        if self.baseline not in ("turn", "episode"):
            raise ConfigError(f"baseline={self.baseline!r}: expected 'turn' or 'episode'.")

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode, one advantage per turn; ``None`` for a failed episode."""
        scored = [returns_to_go(e.turn_rewards, self.gamma) for e in group if not e.failed]
        if not scored:
            return [None] * len(group)
        if self.baseline == "turn":
            longest = max(map(len, scored))
            base = [math.fsum(g[t] for g in scored if t < len(g)) / len(scored) for t in range(longest)]
        else:
            base = [math.fsum(g[0] for g in scored if g) / len(scored)] * max(map(len, scored))
        centred = [[g[t] - base[t] for t in range(len(g))] for g in scored]
        return _place(group, _rms_scaled(centred) if self.scale_rewards == "group" else centred)


@dataclass(frozen=True)
class NaivePerTurnIndex:
    """``credit="per_turn_index"``, MT-GRPO style, **biased** when the policy controls episode length: kept to show it.

    Each turn reward is normalised over the episodes still alive at its turn index (the one rule,
    ``(r - mean) / (std + 1e-4)``, or ``r - mean`` with ``scale_rewards="none"``), and turn t gets the discounted sum
    of its episode's normalised rewards from t to its end. The baseline this subtracts, a sum of per-index means, has
    as many terms as the episode has turns left: its own actions choose it, so the gradient is biased (verl RFC #7244;
    docs/credit.md).
    """

    gamma: float = 1.0
    scale_rewards: Scale = "group"

    def __post_init__(self) -> None:
        _check(self.gamma, self.scale_rewards)

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode, one advantage per turn; ``None`` for a failed episode."""
        scored = [e.turn_rewards for e in group if not e.failed]
        normalised: list[list[float]] = [[] for _ in scored]
        for t in range(max(map(len, scored), default=0)):  # over the episodes still alive at turn index t
            at_t = group_advantages([r[t] if t < len(r) else None for r in scored], self.scale_rewards)
            for n, a in zip(normalised, at_t, strict=True):
                if a is not None:
                    n.append(a)
        return _place(group, [returns_to_go(n, self.gamma) for n in normalised])


@dataclass(frozen=True)
class GiGPO:
    """``credit="gigpo"`` (Feng et al., 2025): the episode advantage plus ``weight`` x a step advantage.

    The step advantage compares turns of the group (of any of its episodes, or the same one) that acted on the same
    anchor state: ``(G - mean) / (std + 1e-4)`` of their discounted returns-to-go ``G`` over that anchor group
    (``r - mean`` with ``scale_rewards="none"``). A turn whose anchor no other turn shares gets step advantage 0.
    """

    weight: float = 1.0
    gamma: float = 0.95
    scale_rewards: Scale = "group"

    def __post_init__(self) -> None:
        _check(self.gamma, self.scale_rewards)

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode, one advantage per turn; ``None`` for a failed episode."""
        episode = EpisodeAdvantage(self.scale_rewards).per_episode(group)
        step, _ = self.step_advantages(group)
        pairs = zip(episode, step, strict=True)
        return [None if a is None or s is None else [a + self.weight * x for x in s] for a, s in pairs]

    def step_advantages(self, group: Sequence[EpisodeCredit]) -> tuple[Advantages, int]:
        """The step advantages alone, and how many anchor groups formed (anchors shared by two turns or more)."""
        returns = [None if e.failed else returns_to_go(e.turn_rewards, self.gamma) for e in group]
        members: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, (e, g) in enumerate(zip(group, returns, strict=True)):
            if g is not None:
                for t, anchor in enumerate(e.anchors):
                    members[anchor].append((i, t))
        out: Advantages = [None if g is None else [0.0] * len(g) for g in returns]
        formed = 0
        for cells in members.values():
            if len(cells) < 2:
                continue
            formed += 1
            values: list[float | None] = [returns[i][t] for i, t in cells]  # type: ignore[index]  # scored only
            normalised = group_advantages(values, self.scale_rewards)
            for (i, t), a in zip(cells, normalised, strict=True):
                out[i][t] = a  # type: ignore[index,assignment]  # a scored episode's list, and a float
        return out, formed


@dataclass(frozen=True)
class PerRole:
    """``credit="per_role"``: another estimator applied to each role's episodes of a group apart (games with seats).

    Role-conditioned advantage estimation (SPIRAL, Liu et al., 2025) with per-role group normalisation: a seat's
    return is compared with the returns of the *same seat* in the group's other games (one seed, so one game, played
    ``num_generations / seats`` times), never with its opponent's. In a zero-sum game the seats' returns cancel
    within a game, so a baseline over both seats of one game would be the constant 0 (no variance reduction), and an
    episode's advantage taken from the game's summed return would be 0 (no signal at all); per role, each seat keeps
    its own signal and a first-mover edge is not credited to the moves. ``inner`` is any estimator (default
    ``EpisodeAdvantage(scale_rewards)``); turn-level ones (``"discounted"``, ``"gigpo"``) compose the same way.
    Episodes without a role (one-seat envs) form one role of their own. Each role needs two scored episodes in a
    group for a non-zero advantage: ``num_generations`` of at least twice the policy seats.
    """

    inner: CreditEstimator | None = None
    scale_rewards: Scale = "group"

    def __post_init__(self) -> None:
        _check(1.0, self.scale_rewards)

    def __call__(self, group: Sequence[EpisodeCredit]) -> Advantages:
        """Per episode, one advantage per turn; ``None`` for a failed episode."""
        inner = self.inner if self.inner is not None else EpisodeAdvantage(self.scale_rewards)
        members: defaultdict[int | None, list[int]] = defaultdict(list)
        for i, e in enumerate(group):
            members[e.role].append(i)
        out: Advantages = [None] * len(group)
        for indices in members.values():
            for i, a in zip(indices, estimate(inner, [group[i] for i in indices]), strict=True):
                out[i] = a
        return out


def estimate(estimator: CreditEstimator, credits: Sequence[EpisodeCredit]) -> list[list[float] | None]:
    """The estimator's per-turn advantages for one group, checked: one list per episode, one value per turn.

    Raises:
        ConfigError: naming the numbers, when the estimator (a custom one) gives another shape.
    """
    advantages = list(estimator(credits))
    if len(advantages) != len(credits):
        raise ConfigError(
            f"the credit estimator gave advantages for {len(advantages)} episodes of a group of "
            f"{len(credits)}: one list per episode (None for a failed one)."
        )
    for e, a in zip(credits, advantages, strict=True):
        if a is not None and len(a) != len(e.turn_rewards):
            raise ConfigError(
                f"the credit estimator gave {len(a)} advantages for {len(e.turn_rewards)} turns: one "
                "per turn of each episode (None for a failed one)."
            )
    return advantages


def _rms_scaled(centred: list[list[float]]) -> list[list[float]]:
    """``centred`` divided by its root mean square over the turns, Bessel-corrected over the episodes, + ``EPS``.

    With ``n`` episodes of equal length this is the group std of ``advantages.group_normalise`` (the baseline is a
    mean over the same ``n`` episodes), so the two scales agree there.
    """
    cells = [x for row in centred for x in row]
    if not cells:
        return centred
    n = len(centred)
    correction = n / (n - 1) if n > 1 else 1.0
    scale = math.sqrt(math.fsum(x * x for x in cells) / len(cells) * correction) + EPS
    return [[x / scale for x in row] for row in centred]


def _place(group: Sequence[EpisodeCredit], scored: list[list[float]]) -> Advantages:
    """The scored episodes' advantages back in the group's order, ``None`` for the failed ones."""
    it = iter(scored)
    return [None if e.failed else next(it) for e in group]


CREDIT_ESTIMATORS: dict[str, Callable[..., CreditEstimator]] = {
    "episode": EpisodeAdvantage,
    "discounted": DiscountedReturns,
    "per_turn_index": NaivePerTurnIndex,
    "gigpo": GiGPO,
    "per_role": PerRole,
}
"""``credit=`` names and the estimator each builds (keyword arguments go to it)."""


def get_estimator(credit: str | CreditEstimator = "episode", **kwargs: float | str) -> CreditEstimator:
    """The estimator ``credit=`` names (``CREDIT_ESTIMATORS``), built with ``kwargs``; a callable is returned as is."""
    if callable(credit):
        if kwargs:
            raise ConfigError("credit= is an estimator already: pass its options to it, not here.")
        return credit
    if credit not in CREDIT_ESTIMATORS:
        raise ConfigError(f"credit={credit!r}: expected one of {sorted(CREDIT_ESTIMATORS)} or a CreditEstimator.")
    return CREDIT_ESTIMATORS[credit](**kwargs)


def credit_estimator(credit: str | CreditEstimator, scale_rewards: Scale) -> CreditEstimator | None:
    """The estimator a trainer uses for ``credit=``: ``None`` for ``"episode"`` (one sample per row, as always).

    A ``CREDIT_ESTIMATORS`` name is built with the worker's ``scale_rewards``; a ``CreditEstimator`` is used as is.

    Raises:
        ConfigError: for anything else.
    """
    if credit == "episode":
        return None
    if (isinstance(credit, str) and credit in CREDIT_ESTIMATORS) or (callable(credit) and not isinstance(credit, type)):
        return get_estimator(credit, scale_rewards=scale_rewards) if isinstance(credit, str) else credit
    raise ConfigError(
        f"credit={credit!r}: expected one of {sorted(CREDIT_ESTIMATORS)} or a trl_env.train.credit.CreditEstimator (a "
        "callable: a group's EpisodeCredits -> one advantage per turn of each, None for a failed one), e.g. "
        "credit='gigpo' or credit=GiGPO(gamma=0.9); see docs/credit.md."
    )


def credit_metrics(groups: Sequence[Sequence[EpisodeCredit]], advantages: Sequence[Advantages]) -> dict[str, float]:
    """What the trainers log under ``credit/``: per-turn advantage statistics over the scored episodes' turns.

    ``advantage_mean`` / ``_std`` / ``_abs_mean`` over all scored turns; ``turn{k}/advantage_mean`` for the first
    ``LOGGED_TURNS`` turn indices; ``flip_frac``: turns whose advantage has the other sign than their episode's
    ``"episode"`` advantage (how often turn-level credit disagrees with the episode's); ``anchor_groups``: states
    (anchors) shared by two scored turns or more of one group, per group (the mean over ``groups``);
    ``anchored_turn_frac``: the scored turns in such a state.
    """
    cells: list[float] = []
    per_index: defaultdict[int, list[float]] = defaultdict(list)
    flips = anchor_groups = anchored = 0
    for group, advs in zip(groups, advantages, strict=True):
        episode = EpisodeAdvantage("none").per_episode(group)
        counts: defaultdict[str, int] = defaultdict(int)
        for e, a, ep in zip(group, advs, episode, strict=True):
            if a is None or ep is None:
                continue
            for t, (x, anchor) in enumerate(zip(a, e.anchors, strict=True)):
                cells.append(x)
                per_index[t].append(x)
                flips += x * ep < 0
                counts[anchor] += 1
        anchor_groups += sum(1 for c in counts.values() if c > 1)
        anchored += sum(c for c in counts.values() if c > 1)
    if not cells:
        return {"credit/scored_turns": 0.0}
    mean, std = _mean_std(cells)
    metrics = {
        "credit/scored_turns": float(len(cells)),
        "credit/advantage_mean": mean,
        "credit/advantage_std": std,
        "credit/advantage_abs_mean": math.fsum(map(abs, cells)) / len(cells),
        "credit/flip_frac": flips / len(cells),
        "credit/anchor_groups": anchor_groups / len(groups),
        "credit/anchored_turn_frac": anchored / len(cells),
    }
    for t in sorted(per_index)[:LOGGED_TURNS]:
        metrics[f"credit/turn{t}/advantage_mean"] = math.fsum(per_index[t]) / len(per_index[t])
    return metrics


LOGGED_TURNS = 8
"""``credit_metrics`` logs the mean advantage of this many first turn indices."""
