"""What a ``rollout_func`` hands TRL: ``RolloutOutput``, built from rollouts.

``to_trl`` gives one entry per episode, ``to_trl_rows`` one per row (``EpisodeGRPOTrainer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from trl_env.errors import ConfigError
from trl_env.rollout import Ending, Rollout

__all__ = ["RolloutOutput", "to_trl", "to_trl_rows"]


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

    The one rule from rollouts to TRL's rows: ``to_trl`` and ``EpisodeGRPOTrainer`` both read it.
    Every row of a failed episode (and, with ``mask_truncated``, of a truncated one) is masked out of the loss.
    """
    episode_of_row = [e for e, r in enumerate(rollouts) for _ in r.rows]
    rows = [(r, row) for r in rollouts for row in r.rows]

    def masked(r: Rollout) -> bool:
        return r.ending is Ending.ERROR or (mask_truncated and r.truncated)

    output = RolloutOutput(
        prompt_ids=[row.prompt_ids for _, row in rows],
        completion_ids=[row.completion_ids for _, row in rows],
        logprobs=[row.logprobs for _, row in rows],
        env_mask=[[0] * len(row.env_mask) if masked(r) else row.env_mask for r, row in rows],
        env_reward=[r.reward for r, _ in rows],
        env_ending=[r.ending.value for r, _ in rows],
        env_turns=[len(r.turns) for r, _ in rows],
    )
    return output, episode_of_row
