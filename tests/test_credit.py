"""Credit estimators (trl_env.train.credit): hand-computed advantages, and which ones stay unbiased when the policy
decides how long an episode lasts (an exact policy gradient, by enumeration, against Monte Carlo estimates)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import ScriptedGenerator

from trl_env import Budgets, ChatMLProcessor, ConfigError, Ending, FinishReason, batch_rollout
from trl_env.rollout import Rollout, Row, Turn
from trl_env.train.async_grpo.samples import group_advantages
from trl_env.train.credit import (
    CREDIT_ESTIMATORS,
    DiscountedReturns,
    EpisodeAdvantage,
    EpisodeCredit,
    GiGPO,
    NaivePerTurnIndex,
    credit_metrics,
    get_estimator,
    token_advantages,
)


def approx(expected):
    return [None if e is None else pytest.approx(e, rel=1e-6, abs=1e-9) for e in expected]


# e0: 3 turns, return 3; e1: 2 turns, return 1; e2 failed; e3: 1 turn, return 0.
GROUP = [
    EpisodeCredit([1.0, 0.0, 2.0], ["s", "a", "b"]),
    EpisodeCredit([0.0, 1.0], ["s", "a"]),
    EpisodeCredit([5.0], ["s"], failed=True),
    EpisodeCredit([0.0], ["s"]),
]


def test_episode_is_trls_group_advantage_on_every_turn():
    assert EpisodeAdvantage("none")(GROUP) == approx([[5 / 3] * 3, [-1 / 3] * 2, None, [-4 / 3]])
    std = math.sqrt(7 / 3) + 1e-4  # Bessel-corrected std of the returns 3, 1, 0 (TRL GRPOTrainer's rule), eps 1e-4
    expected = [[5 / 3 / std] * 3, [-1 / 3 / std] * 2, None, [-4 / 3 / std]]
    assert EpisodeAdvantage()(GROUP) == [None if e is None else pytest.approx(e, rel=1e-6) for e in expected]
    for scale in ("group", "none"):
        trl = group_advantages([None if e.failed else e.total for e in GROUP], scale)  # type: ignore[arg-type]
        ours = EpisodeAdvantage(scale).per_episode(GROUP)  # type: ignore[arg-type]
        assert ours == [None if a is None else pytest.approx(a, abs=1e-12) for a in trl]


def test_discounted_returns_turn_baseline_counts_finished_episodes_as_zero():
    # returns-to-go e0 [3, 2, 2], e1 [1, 1], e3 [0]; baseline per turn index over all 3 scored episodes: 4/3, 1, 2/3
    assert DiscountedReturns(scale_rewards="none")(GROUP) == approx([[5 / 3, 1, 4 / 3], [-1 / 3, 0], None, [-4 / 3]])
    # gamma 0.5: e0 [1.5, 1, 2], e1 [0.5, 1], e3 [0]; baselines 2/3, 2/3, 2/3
    half = DiscountedReturns(gamma=0.5, scale_rewards="none")(GROUP)
    assert half == approx([[5 / 6, 1 / 3, 4 / 3], [-1 / 6, 1 / 3], None, [-2 / 3]])
    episode = DiscountedReturns(baseline="episode", scale_rewards="none")(GROUP)
    assert episode == approx([[5 / 3, 2 / 3, 2 / 3], [-1 / 3, -1 / 3], None, [-4 / 3]])
    # scale_rewards="group": the same, divided by the root mean square over the group's 6 scored turns, Bessel-corrected
    # over its 3 episodes (x 3/2), + 1e-4
    rms = math.sqrt((25 / 9 + 1 + 16 / 9 + 1 / 9 + 0 + 16 / 9) / 6 * 3 / 2) + 1e-4
    scaled = DiscountedReturns()(GROUP)
    assert scaled == approx([[5 / 3 / rms, 1 / rms, 4 / 3 / rms], [-1 / 3 / rms, 0], None, [-4 / 3 / rms]])


def test_discounted_with_only_a_final_reward_and_episode_baseline_is_the_episode_estimator_unscaled_only():
    group = [EpisodeCredit([0.0, 0.0, 1.0], ["s", "a", "b"]), EpisodeCredit([0.0], ["s"]), EpisodeCredit([2.0], ["s"])]
    assert DiscountedReturns(baseline="episode", scale_rewards="none")(group) == approx(EpisodeAdvantage("none")(group))
    # scale_rewards="group": the std over episodes (1, Bessel-corrected) against the root mean square over turns
    # (sqrt(2/5 x 3/2): the 3-turn episode counts 3 times), so not the same
    scaled, episode = DiscountedReturns(baseline="episode")(group), EpisodeAdvantage()(group)
    rms = math.sqrt(2 / 5 * 3 / 2) + 1e-4
    assert scaled == approx([[0.0] * 3, [-1 / rms], [1 / rms]])
    assert episode == approx([[0.0] * 3, [-1 / (1 + 1e-4)], [1 / (1 + 1e-4)]])
    # with equal lengths the two scales coincide
    even = [EpisodeCredit([0.0, r], ["s", "a"]) for r in (0.0, 1.0, 2.0)]
    assert DiscountedReturns(baseline="episode")(even) == approx(EpisodeAdvantage()(even))


def test_naive_per_turn_index_normalises_over_the_episodes_alive_at_each_index():
    # index 0: rewards 1, 0, 0 (mean 1/3); index 1: 0, 1 (mean 1/2); index 2: 2 alone (mean 2)
    assert NaivePerTurnIndex(scale_rewards="none")(GROUP) == approx(
        [[1 / 6, -1 / 2, 0], [1 / 6, 1 / 2], None, [-1 / 3]]
    )
    # Bessel-corrected stds + 1e-4: of 1, 0, 0 (index 0), of 0, 1 (index 1); index 2 has one episode: advantage 0
    s0, s1 = math.sqrt(1 / 3) + 1e-4, math.sqrt(1 / 2) + 1e-4
    expected = [[2 / 3 / s0 - 1 / 2 / s1, -1 / 2 / s1, 0], [-1 / 3 / s0 + 1 / 2 / s1, 1 / 2 / s1], None, [-1 / 3 / s0]]
    assert NaivePerTurnIndex()(GROUP) == [None if e is None else pytest.approx(e, rel=1e-6) for e in expected]


def test_gigpo_adds_a_weighted_step_advantage_over_turns_sharing_an_anchor():
    # anchor "s": returns-to-go 3, 1, 0 (mean 4/3); "a": 2, 1 (mean 3/2); "b" alone: 0
    step, formed = GiGPO(gamma=1.0, scale_rewards="none").step_advantages(GROUP)
    assert formed == 2
    assert step == approx([[5 / 3, 1 / 2, 0], [-1 / 3, -1 / 2], None, [-4 / 3]])
    total = GiGPO(weight=0.5, gamma=1.0, scale_rewards="none")(GROUP)
    assert total == approx([[5 / 3 + 5 / 6, 5 / 3 + 1 / 4, 5 / 3], [-1 / 3 - 1 / 6, -1 / 3 - 1 / 4], None, [-2]])
    # an anchor repeated inside one episode is an anchor group too; a lone episode's episode advantage is 0
    step, formed = GiGPO(gamma=1.0, scale_rewards="none").step_advantages([EpisodeCredit([1.0, 1.0], ["x", "x"])])
    assert (step, formed) == ([[0.5, -0.5]], 1)
    # scaled: (2 - 3/2) / (Bessel std sqrt(1/2) + 1e-4), x weight 2
    step = 0.5 / (math.sqrt(1 / 2) + 1e-4)
    assert GiGPO(weight=2.0, gamma=1.0)([EpisodeCredit([1.0, 1.0], ["x", "x"])]) == approx([[2 * step, -2 * step]])
    # the failed episode's anchor is out of every group: with it the "b" anchor would still be alone
    assert GiGPO(gamma=1.0).step_advantages([EpisodeCredit([1.0], ["b"]), EpisodeCredit([0.0], ["b"], True)])[1] == 0


def test_groups_with_all_equal_rewards_failed_or_empty_episodes():
    zeros = [EpisodeCredit([0.0, 0.0], ["s", "a"]), EpisodeCredit([0.0], ["s"]), EpisodeCredit([], [])]
    for name in CREDIT_ESTIMATORS:
        for scale in ("group", "none"):
            assert get_estimator(name, scale_rewards=scale)(zeros) == [[0.0, 0.0], [0.0], []], name
            assert get_estimator(name, scale_rewards=scale)([EpisodeCredit([1.0], ["s"], True)]) == [None], name
            assert get_estimator(name, scale_rewards=scale)([]) == [], name
    # equal returns, different timing: the episode advantage is 0, the per-turn ones are not
    equal = [EpisodeCredit([1.0], ["s"]), EpisodeCredit([0.0, 1.0], ["s", "a"])]
    assert EpisodeAdvantage()(equal) == [[0.0], [0.0, 0.0]]
    assert DiscountedReturns(scale_rewards="none")(equal) == approx([[0.0], [0.0, 0.5]])  # baselines 1 and 1/2
    assert NaivePerTurnIndex(scale_rewards="none")(equal) == approx([[0.5], [-0.5, 0.0]])


def test_get_estimator_and_the_protocol():
    assert get_estimator() == EpisodeAdvantage()
    assert get_estimator("discounted", gamma=0.9) == DiscountedReturns(gamma=0.9)

    def mine(group):
        return [None if e.failed else [1.0] * len(e.turn_rewards) for e in group]

    assert get_estimator(mine) is mine
    with pytest.raises(ConfigError, match="credit='ppo'"):
        get_estimator("ppo")
    with pytest.raises(ConfigError, match="gamma"):
        DiscountedReturns(gamma=1.5)
    with pytest.raises(ConfigError, match="scale_rewards"):
        GiGPO(scale_rewards="batch")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="anchors"):
        EpisodeCredit([1.0], [])


def turn(reward, delta, model=2, env=1, anchor=None):
    return Turn("t", "", "a", delta, reward, FinishReason.STOP, model, env, 0.0, 0.0, anchor=anchor)


def rollout(turns, reward=1.0, ending=Ending.ENV_DONE, rows=None):
    n = sum(t.num_model_tokens + t.num_env_tokens for t in turns)
    if rows:
        return Rollout("seed", rows, tuple(turns), reward, ending)
    return Rollout.single("seed", [1], list(range(n)), [0.0] * n, [1] * n, tuple(turns), reward, ending)


def test_from_rollout_turn_rewards_sum_to_the_episode_total_and_anchors_are_states():
    done = rollout([turn(0.5, "o1"), turn(None, None), turn(2.0, "o3", env=0)], reward=2.0)
    credit = EpisodeCredit.from_rollout(done)
    first = f"prompt:{hash((1,)):x}"  # turn 0 acted on the first prompt (the same for the whole group)
    assert credit == EpisodeCredit([0.5, 0.0, 1.5], [first, "o1", ""], failed=False)
    # a reward settled by truncate (the total differs from the steps' sum) is earned by the last turn
    assert EpisodeCredit.from_rollout(done, total=3.0).turn_rewards == [0.5, 0.0, 2.5]
    # other reward functions: env changes weighted, the rest of the weighted total at the end
    assert EpisodeCredit.from_rollout(done, total=0.25, env_weight=0.5).turn_rewards == [0.25, 0.0, 0.0]
    assert EpisodeCredit.from_rollout(done, total=1.0, env_weight=0.0).turn_rewards == [0.0, 0.0, 1.0]
    # a turn cut before its step (reward None) after reset set a reward: all of it on that turn
    cut = rollout([turn(None, None, env=0)], reward=-0.25, ending=Ending.LENGTH)
    assert EpisodeCredit.from_rollout(cut).turn_rewards == [-0.25]
    # the env's own state keys win over observation texts
    keyed = rollout([turn(1.0, "o1", anchor="cell 0"), turn(1.0, "o2")], reward=2.0)
    assert EpisodeCredit.from_rollout(keyed).anchors == ["cell 0", "o1"]
    assert EpisodeCredit.from_rollout(done, anchors=["k0", "k1", "k2"]).anchors == ["k0", "k1", "k2"]
    assert EpisodeCredit.from_rollout(rollout([turn(1.0, "x")], ending=Ending.ERROR)).failed
    assert EpisodeCredit.from_rollout(rollout([turn(None, None)], reward=None, ending=Ending.LENGTH)).failed
    assert EpisodeCredit.from_rollout(done, total=float("nan")).failed
    assert EpisodeCredit.from_rollout(rollout([], reward=None)).failed


class ResetRewardEnv:
    """0.25 at reset, then +1.0 and +3.0."""

    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        self.reward = 0.25
        return self, "start"

    def step(self, action):
        self.turn += 1
        self.reward += (1.0, 3.0)[self.turn - 1]
        self.alive = self.turn < 2
        return self, f"o{self.turn}"


def test_a_reward_the_env_sets_at_reset_is_earned_by_the_first_turn(tokenizer):
    """The first turn's reward is taken against 0, so it holds the reset reward; a group shares it (one seed), so it
    cancels against turn 0's baseline, where on the last turn it would shift later turns by how many episodes
    stopped."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generator = ScriptedGenerator([stop], stop, p_stop=1.0)
    [r] = batch_rollout(["0"], ResetRewardEnv, ChatMLProcessor(), tokenizer, generator, budgets=Budgets(4, 8))
    assert [t.reward for t in r.turns] == [1.25, 4.25] and r.reward == 4.25
    assert EpisodeCredit.from_rollout(r).turn_rewards == [1.25, 3.0]  # not [1.0, 3.25]
    # a group: this episode and one that stops after a first turn earning 0, with and without the reset reward
    estimator = DiscountedReturns(scale_rewards="none")
    with_reset = estimator([EpisodeCredit([1.25, 3.0], ["s", "a"]), EpisodeCredit([0.25], ["s"])])
    without = estimator([EpisodeCredit([1.0, 3.0], ["s", "a"]), EpisodeCredit([0.0], ["s"])])
    assert with_reset == approx([[2.0, 1.5], [-2.0]]) and without == approx([[2.0, 1.5], [-2.0]])
    at_the_end = estimator([EpisodeCredit([1.0, 3.25], ["s", "a"]), EpisodeCredit([0.25], ["s"])])
    assert at_the_end == approx([[2.0, 1.625], [-2.0]])  # turn 1's baseline counts the stopped episode as 0


def test_token_advantages_give_each_model_token_its_turns_advantage_row_by_row():
    done = rollout([turn(0.5, "o1"), turn(None, None), turn(2.0, "o3", env=0)], reward=2.0)
    assert token_advantages(done, [1.0, 2.0, 3.0]) == [[1.0, 1.0, 0.0, 2.0, 2.0, 0.0, 3.0, 3.0]]
    assert token_advantages(done, None) == [[0.0] * 8]
    with pytest.raises(ConfigError, match="one per turn"):
        token_advantages(done, [1.0])
    # history="deployed": two rows, turns 0-1 in the first (2+1 and 2+0 tokens), turn 2 alone in the second
    t = [turn(0.5, "o1"), turn(1.0, "o2", env=0), turn(2.0, "o3", env=0)]
    rows = (Row.of_turns([1], [5, 6, 7, 8, 9], [0.0] * 5, [1, 1, 0, 1, 1], t[:2]),
            Row.of_turns([1, 2], [10, 11], [0.0] * 2, [1, 1], t[2:], first=2))  # fmt: skip
    deployed = rollout(t, reward=2.0, rows=rows)
    assert token_advantages(deployed, [1.0, -1.0, 3.0]) == [[1.0, 1.0, 0.0, -1.0, -1.0], [3.0, 3.0]]
    bad = rollout(t, reward=2.0, rows=(Row.of_turns([1], [5], [0.0], [1], t),))
    with pytest.raises(ConfigError, match="tokens"):
        token_advantages(bad, [1.0, 2.0, 3.0])


def test_credit_metrics_count_anchor_groups_flips_and_per_turn_means():
    group = [
        EpisodeCredit([0.0, 1.0], ["s", "a"]),  # return 1
        EpisodeCredit([0.0, 0.0], ["s", "a"]),  # return 0
        EpisodeCredit([0.0], ["s"], failed=True),  # out of every statistic
    ]
    advantages = [[-0.5, 1.0], [0.5, -1.0], None]
    metrics = credit_metrics([group], [advantages])
    assert metrics["credit/scored_turns"] == 4
    assert metrics["credit/anchor_groups"] == 2  # "s" and "a", each reached by both scored episodes
    assert metrics["credit/anchored_turn_frac"] == 1.0
    assert metrics["credit/flip_frac"] == 0.5  # turn 0 of each episode has the other sign than its episode
    assert metrics["credit/turn0/advantage_mean"] == 0.0
    assert metrics["credit/advantage_abs_mean"] == 0.75
    assert credit_metrics([group, group], [advantages, advantages])["credit/anchor_groups"] == 2  # per group
    assert credit_metrics([group[2:]], [[None]]) == {"credit/scored_turns": 0.0}


# The unbiasedness demonstration. At turn t (of at most T) the policy continues (reward +1) with probability
# sigmoid(theta_t), else stops (reward 0, the episode ends). The episode's return is its number of continues, and the
# policy alone decides its length. The exact gradient of the expected return enumerates the T + 1 trajectories.
T, N, GROUPS = 4, 8, 4000
THETA = np.array([1.0, 0.5, 0.0, -0.5])
P = 1 / (1 + np.exp(-THETA))


def exact_gradient() -> np.ndarray:
    grad = np.zeros(T)
    for k in range(T + 1):  # k continues, then a stop (k < T) or the turn budget (k = T)
        probability = np.prod(P[:k]) * (1 - P[k] if k < T else 1.0)
        score = np.zeros(T)  # d log p(trajectory) / d theta
        score[:k] = 1 - P[:k]
        if k < T:
            score[k] = -P[k]
        grad += probability * k * score
    return grad


def monte_carlo(estimator, anchor=str) -> tuple[np.ndarray, np.ndarray]:
    """Mean over groups of (1/N) sum_i sum_t A_it d log pi(a_it) / d theta, x N / (N - 1) (the group mean includes
    the episode itself: docs/credit.md), and its standard error. ``anchor(t)``: the state of turn t (its index)."""
    rng = np.random.default_rng(0)
    cont = rng.random((GROUPS, N, T)) < P
    continues = np.where(cont.all(axis=2), T, cont.argmin(axis=2))
    estimates = np.zeros((GROUPS, T))
    for g in range(GROUPS):
        ks = continues[g].tolist()
        group = [EpisodeCredit([1.0] * k + [0.0] * (k < T), [anchor(t) for t in range(min(k + 1, T))]) for k in ks]
        for k, advantages in zip(ks, estimator(group), strict=True):
            for t, a in enumerate(advantages):
                estimates[g, t] += a * (1 - P[t] if t < k else -P[t])
    estimates *= 1 / (N - 1)
    return estimates.mean(axis=0), estimates.std(axis=0) / math.sqrt(GROUPS)


def test_only_the_per_turn_index_normalisation_is_biased_when_the_policy_controls_length():
    exact = exact_gradient()
    for estimator in (EpisodeAdvantage("none"), DiscountedReturns(scale_rewards="none")):
        mean, se = monte_carlo(estimator)
        assert np.all(np.abs(mean - exact) < 4 * se), (estimator, mean, se, exact)
    mean, se = monte_carlo(DiscountedReturns(baseline="episode", scale_rewards="none"))
    assert np.all(np.abs(mean - exact) < 4 * se), (mean, se, exact)
    # the naive estimator is off by far more than its sampling error, and not by a constant factor either
    mean, se = monte_carlo(NaivePerTurnIndex(scale_rewards="none"))
    assert np.all(np.abs(mean - exact) > 20 * se), (mean, se, exact)
    ratio, ratio_se = mean / exact, se / exact
    assert ratio.max() - ratio.min() > 4 * (ratio_se[ratio.argmax()] + ratio_se[ratio.argmin()]), ratio


def test_gigpos_step_term_is_biased_per_turn_index_and_with_revisited_states():
    """GiGPO's step term alone (weight x it is what GiGPO adds to the episode advantage), gamma=1, scaled by N/(N-1)
    as the others. Anchored by turn index (no state recurs within an episode), its group at index t holds only the
    m_t episodes alive there, episode i's own return included: the factor (m_t - 1)/m_t shrinks late turns (0.60 x
    the exact gradient at t = 3, 30 standard errors off). With one state for every turn (each episode revisits it),
    the group holds the episode's own later turns, whose returns its action moves: off the other way at t = 0.
    docs/credit.md quotes these ratios."""
    exact = exact_gradient()

    def step(scale):
        gigpo = GiGPO(gamma=1.0, scale_rewards=scale)
        return lambda group: gigpo.step_advantages(group)[0]

    mean, se = monte_carlo(step("none"))
    ratio = mean / exact
    assert abs(ratio[0] - 1) < 4 * se[0] / exact[0]  # at t = 0 every episode is alive: unbiased there
    assert np.all(np.abs(mean - exact)[1:] > 4 * se[1:]), (mean, se, exact)
    assert ratio[3] < 0.65 and ratio[1] > ratio[2] > ratio[3], ratio  # not a constant factor: no lr fixes it
    mean, se = monte_carlo(step("none"), anchor=lambda t: "the one state")
    assert mean[0] - exact[0] > 10 * se[0], (mean, se, exact)
    mean, se = monte_carlo(step("group"))
    assert np.all(np.abs(mean - exact)[:3] > 4 * se[:3]), (mean, se, exact)
