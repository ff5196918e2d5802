"""The group advantage rule, once: ``(r - mean) / (std + EPS)`` over a group's scored members, TRL's ``GRPOTrainer``'s.

One rule for every trainer and every credit estimator: the group mean, the Bessel-corrected std (TRL's ``nanstd``)
and ``EPS = 1e-4``, on float32 tensors where TRL computes them (``GRPOTrainer._generate_and_score_completions``), so
``credit="episode"`` under ``EpisodeGRPOTrainer`` gives TRL's own advantages bit for bit, and the async worker, the
credit estimators and ``per_role`` give the same numbers for the same rewards. (TRL's own async rollout worker uses
the population std and eps 1e-8; trl-env's worker replaces it and uses this rule, so that switching trainers does not
rescale advantages.)

A NaN reward (``None`` in a list: a failed or unscored episode) is out of the mean and the std, and its advantage is
NaN (``None``); a scored member whose group holds no other scored member gets 0 (TRL's ``nan_to_num``).
``scale_rewards="none"`` leaves ``r - mean``. ``episode_advantages`` is TRL's whole rule over reward functions
(weights, ``scale_rewards="batch"``, ``multi_objective_aggregation``). Torch is imported on first use, not with the
package (an env's worker process imports ``trl_env`` without it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from trl_env.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["EPS", "ScaleRewards", "episode_advantages", "group_advantages", "group_normalise", "nan_std"]

EPS = 1e-4
"""Added to the std before dividing: TRL ``GRPOTrainer``'s."""

ScaleRewards = Literal["group", "none"]
"""TRL's ``scale_rewards`` values that normalise within a group: ``"group"`` divides by the std, ``"none"`` does not."""


def nan_std(values: torch.Tensor, *, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The Bessel-corrected std of the non-NaN entries: TRL's ``nanstd`` (``trl.trainer.utils``) op for op."""
    import torch

    variance = torch.nanmean((values - torch.nanmean(values, dim=dim, keepdim=True)) ** 2, dim=dim, keepdim=keepdim)
    count = torch.sum(~torch.isnan(values), dim=dim, keepdim=keepdim).to(values.dtype)  # float32: TRL's own division
    variance *= count / (count - 1)
    return torch.sqrt(variance)


def group_normalise(rewards: torch.Tensor, *, scale: bool = True, dim: int = 1) -> torch.Tensor:
    """Advantages of ``rewards``, whose ``dim`` runs over a group's members (NaN: out of the statistics, stays NaN).

    A group of one member has std 0 (its advantage is 0, as TRL's); one with a single scored member gives NaN, as TRL
    computes it before its ``nan_to_num``.
    """
    import torch

    mean = torch.nanmean(rewards, dim=dim, keepdim=True)
    advantages = rewards - mean
    if scale:
        many = rewards.size(dim) > 1
        std = nan_std(rewards, dim=dim, keepdim=True) if many else torch.zeros_like(mean)
        advantages = advantages / (std + EPS)
    return advantages


def group_advantages(rewards: Sequence[float | None], scale_rewards: ScaleRewards = "group") -> list[float | None]:
    """One group's advantages as plain floats: ``None`` (or a non-finite reward) is out and stays ``None``.

    The rule of ``group_normalise`` in float64; a scored member without another scored one gets 0.0.
    """
    import torch

    finite = [r if r is not None and math.isfinite(r) else None for r in rewards]
    if all(r is None for r in finite):
        return [None] * len(finite)
    values = torch.tensor([[math.nan if r is None else r for r in finite]], dtype=torch.float64)
    advantages = group_normalise(values, scale=scale_rewards == "group")[0].tolist()
    out: list[float | None] = []
    for r, a in zip(finite, advantages, strict=True):
        out.append(None if r is None else (float(a) if math.isfinite(a) else 0.0))
    return out


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL's weighted reward per episode, ``sum_k w_k R_k`` over the functions that scored it; NaN where none did."""
    import torch

    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def episode_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    *,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One advantage per episode, exactly as TRL 1.16 computes one per completion (``_generate_and_score_completions``).

    ``rewards_per_func`` is (episodes, reward functions), NaN where a function gave ``None``; an episode with every
    entry NaN (a failed one) is out of its group's mean and std and gets advantage 0. Consecutive ``num_generations``
    episodes form a group. ``scale_rewards="batch"`` and ``aggregation="normalize_then_sum"`` are TRL's own
    batch-wide variants of the rule. Returns the advantages and the weighted rewards (NaN for unscorable episodes).
    """
    import torch

    weights = weights.to(rewards_per_func.device)
    if aggregation == "sum_then_normalize":
        rewards = weighted_rewards(rewards_per_func, weights)
        by_group = rewards.view(-1, num_generations)
        if scale_rewards == "batch":
            std = nan_std(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
            advantages = group_normalise(by_group, scale=False).flatten() / (std + EPS)
        else:
            advantages = group_normalise(by_group, scale=scale_rewards != "none").flatten()
    elif aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        reward_k = group_normalise(grouped).view(-1, rewards_per_func.size(1))  # each function's own
        rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        std = nan_std(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + EPS)
    else:
        raise ConfigError(
            f"multi_objective_aggregation={aggregation!r}: expected 'sum_then_normalize' or 'normalize_then_sum'."
        )
    return torch.nan_to_num(advantages, nan=0.0), rewards
