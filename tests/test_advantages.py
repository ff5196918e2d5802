"""The group advantage rule, once (trl_env.train.advantages): TRL GRPOTrainer's, bit for bit where TRL computes it, and
the same rule under every trainer and estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from trl.trainer.utils import nanstd as trl_nanstd

from trl_env.train.advantages import EPS, episode_advantages, group_advantages, group_normalise, nan_std
from trl_env.train.credit import EpisodeAdvantage, GiGPO, NaivePerTurnIndex, PerRole
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
    ours = group_normalise(rewards).flatten()
    assert torch.equal(torch.nan_to_num(trl), torch.nan_to_num(ours))
    assert torch.equal(torch.isnan(trl), torch.isnan(ours))
    assert torch.equal(nan_std(flat), trl_nanstd(flat))
    centred = group_normalise(rewards, scale=False).flatten()
    assert torch.equal(torch.nan_to_num(centred), torch.nan_to_num(flat - mean))


def test_the_one_rule_on_plain_floats_is_bessels_std_and_trls_eps():
    rewards = [1.0, None, 3.0, 2.0, math.nan]
    scored = np.array([1.0, 3.0, 2.0])
    expected = (scored - scored.mean()) / (scored.std(ddof=1) + 1e-4)
    got = group_advantages(rewards)
    assert EPS == 1e-4 and got[1] is None and got[4] is None
    assert np.allclose([got[0], got[2], got[3]], expected, rtol=0, atol=1e-12)
    assert group_advantages(rewards, "none")[0] == pytest.approx(1.0 - 2.0)
    # one scored member: TRL's NaN becomes advantage 0 (its nan_to_num); nobody scored: all None
    assert group_advantages([5.0]) == [0.0] and group_advantages([5.0, None]) == [0.0, None]
    assert group_advantages([None, None]) == [None, None]


@pytest.mark.parametrize("seed", range(3))
def test_episode_credit_means_the_same_everywhere(seed):
    """credit="episode" under EpisodeGRPOTrainer (episode_advantages, float32, TRL's op order), the async worker and
    the credit estimators (group_advantages), and per_role around a one-seat env: the same advantages."""
    rewards = rewards_with_gaps(seed, groups=3, members=4)
    trl, _ = episode_advantages(rewards.flatten().unsqueeze(1), torch.ones(1), 4)
    for g in range(3):
        values = [None if math.isnan(r) else float(r) for r in rewards[g].tolist()]
        plain = group_advantages(values)
        group = [EpisodeCredit([0.0] if v is None else [v], ["s"], failed=v is None) for v in values]
        one_seat = PerRole()(group)
        assert one_seat == EpisodeAdvantage()(group) == [None if a is None else [a] for a in plain]
        expected = trl[4 * g : 4 * g + 4].tolist()
        for a, t in zip(plain, expected, strict=True):
            assert (a if a is not None else 0.0) == pytest.approx(t, rel=1e-6, abs=1e-6)  # float32 against float64


def credit(total, turns, anchors=None):
    rewards = [0.0] * (turns - 1) + [total]
    return EpisodeCredit(turn_rewards=rewards, anchors=anchors or [f"s{t}" for t in range(turns)], failed=False)


def test_every_estimator_normalises_with_the_one_rule():
    """EpisodeAdvantage per group, NaivePerTurnIndex per turn index, GiGPO per anchor group: each is group_advantages
    of the values it normalises (the one rule)."""
    group = [credit(1.0, 3), credit(0.0, 2), credit(2.0, 3), EpisodeCredit(turn_rewards=[], anchors=[], failed=True)]
    assert EpisodeAdvantage().per_episode(group) == group_advantages([1.0, 0.0, 2.0, None])
    naive = NaivePerTurnIndex()(group)
    last_index = group_advantages([1.0, None, 2.0])  # turn 2: the episodes still alive
    assert naive[0][2] == pytest.approx(last_index[0]) and naive[2][2] == pytest.approx(last_index[2])
    step, formed = GiGPO(gamma=1.0).step_advantages(group)
    at_s0 = group_advantages([1.0, 0.0, 2.0])  # every scored episode acted on anchor "s0"
    assert formed == 3 and [step[i][0] for i in range(3)] == at_s0 and step[3] is None
