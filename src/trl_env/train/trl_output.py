"""Rollouts -> what a trainer trains: ``training_rows`` (every trainer's), and TRL's ``RolloutOutput`` built from it.

``training_rows`` is the one rule from rollouts to trained tokens: each training row (``Rollout.rows``) with the
tokens it trains and each token's advantage (its turn's, from ``token_advantages`` over the row's spans). A failed
episode, and with ``mask_truncated`` a truncated one, trains no token (docs/concepts.md, "One contract for both
trainers"). ``EpisodeGRPOTrainer`` builds its batch from it, the async worker its ``RolloutSample``s (one per row, or
one per model turn), ``to_trl_rows`` / ``to_trl`` the plain ``rollout_func``'s dict (one entry per row / episode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from trl_env.errors import ConfigError
from trl_env.rollout import Ending, Rollout
from trl_env.rollout.records import Row, Span, Turn
from trl_env.train.episode_credit import token_advantages

__all__ = ["RolloutOutput", "TrainingRow", "masked_episode", "to_trl", "to_trl_rows", "training_rows", "trl_output"]


@dataclass(frozen=True)
class TrainingRow:
    """One training row of an episode: what it trains and each token's advantage."""

    episode: int
    """The episode's index in the rollouts."""
    row: Row
    turns: tuple[Turn, ...]
    """The row's turns, in order (``Row.spans``: one span each)."""
    trained: list[int]
    """Per completion token: 1 = in the loss (``row.env_mask``); all 0 for a failed or masked-truncated episode."""
    advantages: list[float]
    """Per completion token: its turn's advantage; 0.0 on env tokens and for an episode without advantages."""

    @property
    def spans(self) -> tuple[Span, ...]:
        """The row's turns' token spans."""
        return self.row.spans


def masked_episode(rollout: Rollout, mask_truncated: bool) -> bool:
    """Whether the episode trains no token: it failed, or it was truncated and ``mask_truncated`` is set."""
    return rollout.ending is Ending.ERROR or (mask_truncated and rollout.truncated)


def training_rows(
    rollouts: Sequence[Rollout],
    advantages: Sequence[Sequence[float] | None] | None = None,
    *,
    mask_truncated: bool = False,
) -> list[TrainingRow]:
    """Every training row of ``rollouts``, in order, with its trained tokens and per-token advantages.

    ``advantages`` holds, per episode, one advantage per turn (``credit="episode"``: the episode's on every turn), or
    ``None`` (a failed or unscored episode: 0.0 on every token); omitted, every advantage is 0.0.

    Raises:
        ConfigError: when an episode's advantages are not one per turn, or its turns do not tile its rows.
    """
    out = []
    for e, r in enumerate(rollouts):
        masked = masked_episode(r, mask_truncated)
        per_token = token_advantages(r, None if advantages is None else advantages[e])
        first = 0
        for row, values in zip(r.rows, per_token, strict=True):
            turns = tuple(r.turns[first : first + row.turns])
            first += row.turns
            trained = [0] * len(row.env_mask) if masked else list(row.env_mask)
            out.append(TrainingRow(episode=e, row=row, turns=turns, trained=trained, advantages=values))
    return out


class RolloutOutput(TypedDict):
    """The dict TRL receives: one entry per prompt in every list."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    env_mask: list[list[int]]
    """1 = sampled by the model (trained on), 0 = env text or a failed episode (not trained on)."""
    env_reward: list[float | None]
    """The env's reward; ``None`` (NaN in TRL: out of the loss and the group statistics) for failed episodes."""
    env_ending: list[str]
    env_turns: list[int]


def to_trl(rollouts: Sequence[Rollout], *, mask_truncated: bool = False) -> RolloutOutput:
    """Convert rollouts of one training row each (``history="sampled"``) to TRL's dict: ``to_trl_rows``'s rows.

    A failed episode keeps its tokens but is masked out of the loss (and, through
    ``make_rollout_func``, out of the reward statistics). With ``mask_truncated`` (TRL's
    ``mask_truncated_completions``) so is every episode trl-env reports as truncated
    (``max_turns``, ``length``), and only those. A row without a model turn is one masked
    stand-in token for prompt and completion, so it fits any model.

    Raises:
        ConfigError: for an episode of several rows (``history="deployed"``), which one entry cannot hold.
    """
    output, episode_of_row = to_trl_rows(rollouts, mask_truncated=mask_truncated)
    if len(episode_of_row) != len(rollouts):
        several = next(e for e, r in enumerate(rollouts) if len(r.rows) > 1)
        raise ConfigError(
            f"episode {several} has {len(rollouts[several].rows)} training rows (history='deployed'), and to_trl "
            "gives one entry per episode; use to_trl_rows (one entry per row) or EpisodeGRPOTrainer."
        )
    return output


def to_trl_rows(rollouts: Sequence[Rollout], *, mask_truncated: bool = False) -> tuple[RolloutOutput, list[int]]:
    """TRL's dict with one entry per *row* (``Rollout.rows``), and the episode index of each row.

    ``training_rows``'s rows: every row of a failed episode (and, with ``mask_truncated``, of a truncated one) has
    ``env_mask`` all 0.
    """
    return trl_output(rollouts, training_rows(rollouts, mask_truncated=mask_truncated))


def trl_output(rollouts: Sequence[Rollout], rows: Sequence[TrainingRow]) -> tuple[RolloutOutput, list[int]]:
    """TRL's dict of ``rows`` (``training_rows`` of ``rollouts``), and the episode index of each row."""
    output = RolloutOutput(
        prompt_ids=[t.row.prompt_ids for t in rows],
        completion_ids=[t.row.completion_ids for t in rows],
        logprobs=[t.row.logprobs for t in rows],
        env_mask=[t.trained for t in rows],
        env_reward=[rollouts[t.episode].reward for t in rows],
        env_ending=[rollouts[t.episode].ending.value for t in rows],
        env_turns=[len(rollouts[t.episode].turns) for t in rows],
    )
    return output, [t.episode for t in rows]
