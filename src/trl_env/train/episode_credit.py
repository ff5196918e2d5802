"""What a credit estimator reads of a ``Rollout``, and how its per-turn advantages reach the rollout's tokens.

``EpisodeCredit.from_rollout`` (one reward and one anchor per model turn) and ``token_advantages`` (each model token
its turn's advantage, row by row) are the two places that read a rollout's turns and rows for credit; the estimators
themselves are in ``trl_env.train.credit``, which re-exports both (docs/credit.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trl_env.errors import ConfigError
from trl_env.rollout import Ending, Rollout

__all__ = ["EpisodeCredit", "token_advantages"]


class _Unset:
    """The default of ``EpisodeCredit.from_rollout``'s ``total``: the rollout's own reward."""


_UNSET = _Unset()


@dataclass(frozen=True)
class EpisodeCredit:
    """What a credit estimator reads of one episode: per model turn, the reward it earned and the state it acted on."""

    turn_rewards: list[float]
    """Per turn: ``env.reward`` after its step minus before it (the rewards sum to the episode's return)."""
    anchors: list[str]
    """Per turn: a key for the state the turn acted on (GiGPO groups turns by it); the observation text by default."""
    failed: bool = False
    """The episode failed or earned no reward: out of every statistic, and its advantages are ``None``."""
    role: int | None = None
    """The seat the episode played in a game of several seats (``Rollout.info["seat"]``); ``None`` for one-seat envs.
    ``trl_env.train.credit.PerRole`` groups episodes by it."""

    def __post_init__(self) -> None:
        if len(self.anchors) != len(self.turn_rewards):
            raise ConfigError(f"{len(self.turn_rewards)} turn rewards but {len(self.anchors)} anchors: one each.")

    @classmethod
    def from_rollout(
        cls,
        rollout: Rollout,
        *,
        total: float | None | _Unset = _UNSET,
        env_weight: float = 1.0,
        anchors: Sequence[str] | None = None,
    ) -> EpisodeCredit:
        """An episode's credit record, read from its turns.

        Turn t earned ``env_weight`` x the change of ``env.reward`` over its step (``Turn.reward`` minus the previous
        turn's; a turn without a step changed nothing). The first turn's is taken against 0, so a reward the env set
        at reset is earned by turn 0: a group shares it (one seed), and there it cancels against the baseline (on the
        last turn it would shift later turns by how many episodes stopped). Whatever of ``total`` these do not
        account for goes to the last turn, so the turn rewards always sum to ``total``: the env's reward settled by
        ``truncate``, and the scores of reward functions that judge the whole episode, are earned at its end.
        ``total`` defaults to ``Rollout.reward``; ``None`` (or a NaN) makes the episode ``failed``, as does an
        ``Ending.ERROR`` or an episode without a turn. ``role`` is the rollout's seat (``info["seat"]``), if any.

        The anchor of turn t is ``Turn.anchor`` (the env's ``info["anchor"]``) where the env gives one, else the
        observation it acted on: ``turns[t - 1].delta``, and for turn 0 the episode's first prompt (its token ids,
        the same for a whole group, which shares a seed). ``anchors`` replaces them (one per turn).
        """
        total = rollout.reward if isinstance(total, _Unset) else total
        failed = rollout.ending is Ending.ERROR or not rollout.turns or total is None or not math.isfinite(total)
        rewards, previous = [], 0.0
        for turn in rollout.turns:
            current = previous if turn.reward is None else turn.reward
            rewards.append(env_weight * (current - previous))
            previous = current
        if rewards and not failed:
            rewards[-1] += total - math.fsum(rewards)  # type: ignore[operator]  # total is a float when not failed
        if anchors is None:
            first = rollout.rows[0].prompt_ids if rollout.rows else rollout.prompt_ids
            observed = [f"prompt:{hash(tuple(first)):x}"] + [t.delta or "" for t in rollout.turns]
            anchors = [t.anchor if t.anchor is not None else o for t, o in zip(rollout.turns, observed, strict=False)]
        seat = rollout.info.get("seat")
        role = seat if isinstance(seat, int) else None
        return cls(turn_rewards=rewards, anchors=list(anchors), failed=failed, role=role)

    @property
    def total(self) -> float:
        """The episode's return: the sum of its turn rewards."""
        return math.fsum(self.turn_rewards)


def token_advantages(rollout: Rollout, advantages: Sequence[float] | None) -> list[list[float]]:
    """One advantage per completion token, for each of the rollout's training rows (``Rollout.rows``).

    Each model token of turn k gets ``advantages[k]``; env tokens get 0.0 (they are masked out of the loss anyway);
    ``None`` (a failed episode) gives 0.0 everywhere. With ``history="sampled"`` there is one row, the rollout's own
    ``completion_ids``; with ``"deployed"`` each row holds ``Row.turns`` consecutive turns.

    Raises:
        ConfigError: when ``advantages`` has not one value per turn, or the turns do not add up to the rows' tokens
            (``Rollout.spans``).
    """
    rows = rollout.rows
    if advantages is None:
        return [[0.0] * len(row.completion_ids) for row in rows]
    if len(advantages) != len(rollout.turns):
        raise ConfigError(f"{len(advantages)} advantages for {len(rollout.turns)} turns: one per turn.")
    out = []
    for row, spans in rollout.spans():
        tokens = [0.0] * len(row.completion_ids)
        for span in spans:
            tokens[span.model] = [advantages[span.turn]] * (span.model.stop - span.model.start)
        out.append(tokens)
    return out
