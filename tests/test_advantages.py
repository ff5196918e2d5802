"""The group advantage rule, once (trl_env.train.advantages): TRL's two settings, bit for bit where TRL computes it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from trl.trainer.utils import nanstd as trl_nanstd

from trl_env.train.advantages import ASYNC_RULE, GRPO_RULE, group_advantages, group_normalise, nan_std
from trl_env.train.credit import EpisodeAdvantage, GiGPO, NaivePerTurnIndex
from trl_env.train.episode_credit import EpisodeCredit


def rewards_with_gaps(seed: int, groups: int = 5, members: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(groups, members, generator=g)
    rewards[torch.rand(groups, members, generator=g) < 0.3] = torch.nan
    return rewards


@pytest.mark.parametrize("seed", range(5))
def test_grpo_rule_is_trls_own_computation_bit_for_bit(seed):
    """As GRPOTrainer._generate_and_score_completions computes it: group mean and nanstd, repeated, eps 1e-4."""
    rewards = rewards_with_gaps(seed)
    flat, group = rewards.flatten(), rewards.size(1)
    mean = torch.nanmean(flat.view(-1, group), dim=1).repeat_interleave(group)
    std = trl_nanstd(flat.view(-1, group), dim=1).repeat_interleave(group)
    trl = (flat - mean) / (std + 1e-4)
    ours = group_normalise(rewards, GRPO_RULE).flatten()
    assert torch.equal(torch.nan_to_num(trl), torch.nan_to_num(ours))
    assert torch.equal(torch.isnan(trl), torch.isnan(ours))
    assert torch.equal(nan_std(flat), trl_nanstd(flat))
    centred = group_normalise(rewards, GRPO_RULE, scale=False).flatten()
    assert torch.equal(torch.nan_to_num(centred), torch.nan_to_num(flat - mean))


def test_async_rule_is_the_population_std_with_eps_1e_8():
    rewards = [1.0, None, 3.0, 2.0, math.nan]
    scored = np.array([1.0, 3.0, 2.0])
    expected = (scored - scored.mean()) / (scored.std() + 1e-8)
    got = group_advantages(rewards, ASYNC_RULE)
    assert got[1] is None and got[4] is None
    assert np.allclose([got[0], got[2], got[3]], expected, rtol=0, atol=1e-12)
    assert group_advantages([5.0], ASYNC_RULE) == [0.0] and group_advantages([None, None]) == [None, None]
    # the sync rule on the same numbers: Bessel's std and eps 1e-4; one scored member gives NaN (TRL: advantage 0)
    sync = group_advantages(rewards, GRPO_RULE)
    assert sync[0] == pytest.approx((1.0 - 2.0) / (scored.std(ddof=1) + 1e-4), abs=1e-12)
    assert math.isnan(group_advantages([5.0, None], GRPO_RULE)[0])


def credit(total, turns, anchors=None):
    rewards = [0.0] * (turns - 1) + [total]
    return EpisodeCredit(turn_rewards=rewards, anchors=anchors or [f"s{t}" for t in range(turns)], failed=False)


def test_every_estimator_normalises_with_the_one_rule():
    """EpisodeAdvantage per group, NaivePerTurnIndex per turn index, GiGPO per anchor group: each is group_advantages
    of the values it normalises (the async rule)."""
    group = [credit(1.0, 3), credit(0.0, 2), credit(2.0, 3), EpisodeCredit(turn_rewards=[], anchors=[], failed=True)]
    assert EpisodeAdvantage().per_episode(group) == group_advantages([1.0, 0.0, 2.0, None], ASYNC_RULE)
    naive = NaivePerTurnIndex()(group)
    last_index = group_advantages([1.0, None, 2.0], ASYNC_RULE)  # turn 2: the episodes still alive
    assert naive[0][2] == pytest.approx(last_index[0]) and naive[2][2] == pytest.approx(last_index[2])
    step, formed = GiGPO(gamma=1.0).step_advantages(group)
    at_s0 = group_advantages([1.0, 0.0, 2.0], ASYNC_RULE)  # every scored episode acted on anchor "s0"
    assert formed == 3 and [step[i][0] for i in range(3)] == at_s0 and step[3] is None
