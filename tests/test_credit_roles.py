"""Per-role credit (trl_env.train.credit.PerRole) for games of several seats: hand-computed values, composition with the
turn-level estimators, and an exact self-play gradient by enumeration of a small two-player zero-sum game."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trl_env.rollout import Ending, Rollout, Turn
from trl_env.train.credit import (
    CREDIT_ESTIMATORS,
    DiscountedReturns,
    EpisodeAdvantage,
    EpisodeCredit,
    PerRole,
    credit_estimator,
    estimate,
)


def approx(expected):
    return [None if e is None else pytest.approx(e, rel=1e-6, abs=1e-9) for e in expected]


def game_group(seat0_returns):
    """Zero-sum games: seat 0 won r, seat 1 won -r; episodes in play_seats' order (game by game, seat by seat)."""
    return [EpisodeCredit([s * r], ["s"], role=seat) for r in seat0_returns for seat, s in ((0, 1.0), (1, -1.0))]


def test_each_role_is_normalised_against_its_own_seat_in_the_groups_other_games():
    group = game_group([1.0, 1.0, -1.0, 0.0])  # seat 0's mean 0.25, seat 1's -0.25
    unscaled = [a[0] for a in PerRole(scale_rewards="none")(group)]
    assert unscaled == approx([0.75, -0.75, 0.75, -0.75, -1.25, 1.25, -0.25, 0.25])
    std = math.sqrt((0.75**2 * 2 + 1.25**2 + 0.25**2) / 3)  # Bessel std of seat 0's returns (seat 1's: the same)
    scaled = [a[0] for a in PerRole()(group)]
    assert scaled == approx([x / (std + 1e-4) for x in unscaled])  # the one rule: EpisodeAdvantage's, TRL's
    # pooled over both seats the baseline is the zero-sum 0: advantages are the raw returns (no variance reduction)
    assert [a[0] for a in EpisodeAdvantage("none")(group)] == approx([1, -1, 1, -1, -1, 1, 0, 0])
    # a game's summed return as every seat's reward cancels to no signal at all
    summed = [EpisodeCredit([0.0], ["s"], role=e.role) for e in group]
    assert all(a == [0.0] for a in PerRole()(summed))


def test_failed_episodes_and_roleless_episodes():
    group = game_group([2.0, 0.0, 1.0])
    group[2] = EpisodeCredit([0.0], ["s"], failed=True, role=0)  # game 1's seat 0 failed (play_seats fails both)
    group[3] = EpisodeCredit([0.0], ["s"], failed=True, role=1)
    out = PerRole(scale_rewards="none")(group)
    assert out == [approx([0.5]), approx([-0.5]), None, None, approx([-0.5]), approx([0.5])]
    roleless = [EpisodeCredit([1.0], ["s"]), EpisodeCredit([3.0], ["s"])]
    assert PerRole(scale_rewards="none")(roleless) == EpisodeAdvantage("none")(roleless)


def test_turn_level_estimators_compose_per_role():
    group = [
        EpisodeCredit([0.0, 1.0], ["a", "b"], role=0),
        EpisodeCredit([0.0], ["c"], role=1),
        EpisodeCredit([1.0, 1.0], ["a", "b"], role=0),
        EpisodeCredit([-2.0, 0.0], ["c", "d"], role=1),
    ]
    inner = DiscountedReturns(gamma=1.0, scale_rewards="none")
    out = estimate(PerRole(inner), group)
    assert out[0] == approx(inner([group[0], group[2]])[0]) and out[2] == approx(inner([group[0], group[2]])[1])
    assert out[1] == approx(inner([group[1], group[3]])[0]) and out[3] == approx(inner([group[1], group[3]])[1])
    assert out[0] == approx([-0.5, 0.0])  # returns-to-go (1, 1) vs (2, 1): turn baselines 1.5 and 1.0


def test_per_role_is_a_credit_name_and_reads_the_seat_off_the_rollout():
    assert CREDIT_ESTIMATORS["per_role"] is PerRole
    assert credit_estimator("per_role", "none") == PerRole(scale_rewards="none")
    turn = Turn("t", "", "a", "d", 1.0, "stop", 1, 0, 0.0, 0.0)  # type: ignore[arg-type]
    rollout = Rollout.single("7", [1], [2], [0.0], [1], (turn,), 1.0, Ending.ENV_DONE, info={"seat": 1})
    assert EpisodeCredit.from_rollout(rollout).role == 1
    alone = Rollout.single("7", [1], [2], [0.0], [1], (turn,), 1.0, Ending.ENV_DONE)
    assert EpisodeCredit.from_rollout(alone).role is None


# The exact self-play gradient. Seat 0 plays a = 1 with probability sigmoid(theta_0); seat 1 sees a and plays b = 1
# with probability sigmoid(theta_1 + theta_2 a). Seat 0 earns R0[a][b], seat 1 earns -R0[a][b] (zero-sum), and seat 0
# has the edge (its expected return is positive). Self-play follows each seat's return through its own actions:
# g = E[r0 d log p(a) + r1 d log p(b | a)], which enumeration of the four games gives exactly.
THETA = np.array([0.3, -0.4, 0.8])
R0 = np.array([[1.0, 0.5], [2.0, -0.5]])
N, GROUPS = 8, 6000


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def scores(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    p1 = sigmoid(THETA[1] + THETA[2] * a)
    return np.array([a - sigmoid(THETA[0]), 0.0, 0.0]), np.array([0.0, b - p1, a * (b - p1)])


def exact_gradient() -> np.ndarray:
    grad = np.zeros(3)
    for a in (0, 1):
        for b in (0, 1):
            pa = sigmoid(THETA[0]) if a else 1 - sigmoid(THETA[0])
            p1 = sigmoid(THETA[1] + THETA[2] * a)
            s0, s1 = scores(a, b)
            grad += pa * (p1 if b else 1 - p1) * (R0[a, b] * s0 - R0[a, b] * s1)
    return grad


def monte_carlo(estimator, correction: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    estimates = np.zeros((GROUPS, 3))
    for g in range(GROUPS):
        a = (rng.random(N) < sigmoid(THETA[0])).astype(int)
        b = (rng.random(N) < sigmoid(THETA[1] + THETA[2] * a)).astype(int)
        group = game_group(R0[a, b].tolist())
        advantages = estimator(group)
        for i in range(N):
            s0, s1 = scores(a[i], b[i])
            estimates[g] += advantages[2 * i][0] * s0 + advantages[2 * i + 1][0] * s1
    estimates *= correction / N
    return estimates.mean(axis=0), estimates.std(axis=0) / math.sqrt(GROUPS)


def test_per_role_credit_follows_the_exact_self_play_gradient_with_less_variance():
    exact = exact_gradient()
    assert np.all(np.abs(exact) > 0.05), exact
    # per role: each seat's baseline is its own role's group mean (which includes the episode: x N / (N - 1))
    per_role, per_role_se = monte_carlo(PerRole(scale_rewards="none"), N / (N - 1))
    assert np.all(np.abs(per_role - exact) < 4 * per_role_se), (per_role, per_role_se, exact)
    # pooled over both seats: the baseline is the zero-sum 0 (unbiased, no reduction); seat 0's edge stays in
    pooled, pooled_se = monte_carlo(EpisodeAdvantage("none"), 1.0)
    assert np.all(np.abs(pooled - exact) < 4 * pooled_se), (pooled, pooled_se, exact)
    assert np.all(per_role_se < 0.9 * pooled_se), (per_role_se, pooled_se)  # 0.86, 0.73, 0.80 with these draws
    # every seat credited with the game's summed return: no signal at all, though the exact gradient is not zero
    summed, _ = monte_carlo(lambda group: [[0.0] for _ in group], 1.0)
    assert np.all(summed == 0.0)
