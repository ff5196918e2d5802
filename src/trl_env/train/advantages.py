"""The group advantage rule, in one place: ``(r - mean) / (std + eps)`` over a group's scored members.

TRL applies it with two settings, named here:

- ``GRPO_RULE``, ``GRPOTrainer``'s: eps ``1e-4``, Bessel-corrected std (``ddof=1``, TRL's ``nanstd``), on the
  trainer's float32 tensors. ``EpisodeGRPOTrainer`` uses it, op for op, so ``credit="episode"`` gives TRL's own
  advantages bit for bit.
- ``ASYNC_RULE``, the rule of ``AsyncGRPOTrainer``'s rollout worker: eps ``1e-8``, population std (``ddof=0``).
  trl-env's async worker and every credit estimator (``trl_env.train.credit``) use it.

A NaN reward (``None`` in a list: a failed or unscored episode) is out of the mean and the std, and its advantage
stays NaN (``None``). ``scale=False`` (``scale_rewards="none"``) leaves ``r - mean``. Torch is imported on first use,
not with the package (an env's worker process imports ``trl_env`` without it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GroupRule:
    """The two constants of the group rule."""

    eps: float
    """Added to the std before dividing."""
    ddof: int
    """Delta degrees of freedom of the std: 1 (Bessel's correction) or 0 (the population std)."""


GRPO_RULE = GroupRule(eps=1e-4, ddof=1)
"""``GRPOTrainer``'s (TRL 1.16 ``_generate_and_score_completions``)."""
ASYNC_RULE = GroupRule(eps=1e-8, ddof=0)
"""``AsyncGRPOTrainer``'s rollout worker's (TRL 1.16 ``AsyncRolloutWorker._score_group``)."""


def nan_std(values: torch.Tensor, *, ddof: int = 1, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The std of the non-NaN entries; with ``ddof=1`` TRL's ``nanstd`` (``trl.trainer.utils``) op for op."""
    import torch

    variance = torch.nanmean((values - torch.nanmean(values, dim=dim, keepdim=True)) ** 2, dim=dim, keepdim=keepdim)
    count = torch.sum(~torch.isnan(values), dim=dim, keepdim=keepdim)
    variance *= count / (count - ddof)
    return torch.sqrt(variance)


def group_normalise(rewards: torch.Tensor, rule: GroupRule, *, scale: bool = True, dim: int = 1) -> torch.Tensor:
    """Advantages of ``rewards``, whose ``dim`` runs over a group's members (NaN: out of the statistics, stays NaN).

    A group of one member has std 0 (its advantage is 0, as TRL's).
    """
    import torch

    mean = torch.nanmean(rewards, dim=dim, keepdim=True)
    advantages = rewards - mean
    if scale:
        many = rewards.size(dim) > 1
        std = nan_std(rewards, ddof=rule.ddof, dim=dim, keepdim=True) if many else torch.zeros_like(mean)
        advantages = advantages / (std + rule.eps)
    return advantages


def group_advantages(
    rewards: Sequence[float | None], rule: GroupRule = ASYNC_RULE, *, scale: bool = True
) -> list[float | None]:
    """One group's advantages as plain floats: ``None`` (or a non-finite reward) is out and stays ``None``."""
    import torch

    finite = [r if r is not None and math.isfinite(r) else None for r in rewards]
    if all(r is None for r in finite):
        return [None] * len(finite)
    values = torch.tensor([[math.nan if r is None else r for r in finite]], dtype=torch.float64)
    advantages = group_normalise(values, rule, scale=scale)[0].tolist()
    return [None if r is None else float(a) for r, a in zip(finite, advantages, strict=True)]
