"""The credit tasks (trl_env.testing.credit_tasks): each env played by hand, and its exact advantages on a small
case checked against values worked out by hand (uniform policy: each move and an invalid reply 1/3)."""

from __future__ import annotations

import random

import pytest

from trl_env.testing.credit_tasks import (
    TASKS,
    EarlyDecision,
    Exact,
    Ring,
    Rounds,
    TaskEnv,
    credit_quality,
    parse_move,
    sample_group,
    uniform,
)
from trl_env.train.credit import DiscountedReturns, EpisodeAdvantage


def test_rounds_env_pays_each_round_on_its_own_turn():
    env = TaskEnv(Rounds(key="AB"))
    _, text = env.reset("0")
    assert text == "Round 1 of 2. Reply A or B." and env.info == {"anchor": "round 0"}
    env.step("a!")  # the first letter of A/B in any case: A, round 0's letter
    assert (env.reward, env.alive, env.info) == (1.0, True, {"anchor": "round 1"})
    env.step("xyz")  # no letter: an invalid reply earns nothing
    assert (env.reward, env.alive) == (1.0, False)


def test_rounds_exact_advantages_by_hand():
    exact = Exact(Rounds(key="AB"))
    assert exact.value(0, 0) == pytest.approx(2 / 3)  # two rounds, 1/3 each
    # the other round's luck is independent: Q(A) = 1 + 1/3, V = 2/3
    assert exact.advantage(0, 0, "A") == pytest.approx(2 / 3)
    assert exact.advantage(0, 0, "B") == pytest.approx(-1 / 3)
    assert exact.advantage(1, 1, "B") == pytest.approx(2 / 3)
    assert exact.advantage(1, 1, None) == pytest.approx(-1 / 3)
    assert exact.best() == 2.0


def test_ring_env_goes_back_to_the_start_at_the_goal():
    env = TaskEnv(Ring(nodes=4, goal=1, max_turns=3))
    env.reset("0")
    _, text = env.step("R")
    assert env.reward == 1.0 and text.startswith("Node 0 of a ring of 4") and env.info == {"anchor": "node 0"}
    _, text = env.step("left")  # the first of L/R: L, to node 3
    assert env.reward == 1.0 and text.startswith("Node 3") and env.alive
    env.step("r")  # node 0; the third turn is the last
    assert (env.reward, env.alive) == (1.0, False)


def test_ring_exact_advantages_by_hand():
    exact = Exact(Ring(nodes=4, goal=1, max_turns=2))
    # last turn: from node 0 only R pays (1/3); from node 3 nothing does
    assert exact.value(0, 1) == pytest.approx(1 / 3) and exact.value(3, 1) == 0.0
    # V(0, 0) = 1/3 (1 + 1/3) + 1/3 (0 + 0) + 1/3 (0 + 1/3) = 5/9
    assert exact.value(0, 0) == pytest.approx(5 / 9)
    assert exact.advantage(0, 0, "R") == pytest.approx(4 / 3 - 5 / 9)
    assert exact.advantage(0, 0, "L") == pytest.approx(-5 / 9)
    assert exact.advantage(0, 0, None) == pytest.approx(1 / 3 - 5 / 9)
    assert exact.best() == 2.0


def test_early_decision_pays_the_first_turns_choice_on_the_last_turn():
    env = TaskEnv(EarlyDecision(max_turns=3))
    _, first = env.reset("0")
    env.step("A")
    _, later = env.step("B")  # changes nothing
    assert env.reward == 0.0 and env.alive and later == "Turn 3 of 3. Reply anything."
    env.step("anything")
    assert (env.reward, env.alive) == (1.0, False)
    lost = TaskEnv(EarlyDecision(max_turns=3))
    lost.reset("0")
    _, text = lost.step("b")
    assert text == later.replace("3 of", "2 of")  # the observation does not say what was decided
    assert lost.info == {"anchor": "Turn 2 of 3. Reply anything."}  # GiGPO groups won and lost episodes here


def test_early_decision_exact_advantages_by_hand():
    exact = Exact(EarlyDecision(max_turns=3))
    assert exact.value("undecided", 0) == pytest.approx(1 / 3)
    assert exact.advantage("undecided", 0, "A") == pytest.approx(2 / 3)
    assert exact.advantage("undecided", 0, "B") == pytest.approx(-1 / 3)
    assert exact.advantage("undecided", 0, None) == pytest.approx(-1 / 3)
    for state in ("win", "loss"):  # the turns after the decision do not matter
        for turn in (1, 2):
            assert all(exact.advantage(state, turn, m) == 0.0 for m in ("A", "B", None))
    assert exact.best() == 1.0


def test_parse_move_and_uniform_policy():
    task = Ring()
    assert parse_move(task, "go right") == "R" and parse_move(task, "xyz") is None
    assert uniform(task) == {"L": 1 / 3, "R": 1 / 3, None: 1 / 3}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_sampled_groups_match_the_env(name):
    """The simulated episodes the quality check uses are the env's own: same rewards, anchors and lengths."""
    task = TASKS[name]
    exact = Exact(task)
    group, advantages = sample_group(exact, 4, random.Random(1))
    assert len(group) == len(advantages) == 4
    for episode, adv in zip(group, advantages, strict=True):
        assert len(episode.turn_rewards) == len(adv) == len(episode.anchors) <= task.max_turns
    assert sum(e.total for e in group) / 4 <= exact.best()


def test_credit_quality_ranks_a_per_turn_estimator_above_the_episode_one_on_independent_rounds():
    """On independent rounds, discounting with gamma=0 gives each turn its own reward minus the round's mean: close
    to the exact advantage (r_t - 1/3); the episode advantage mixes in every other round's luck."""
    rows = credit_quality(
        Rounds(), {"episode": EpisodeAdvantage(), "own": DiscountedReturns(gamma=0.0)}, groups=40, size=8
    )
    by = {r["credit"]: r for r in rows}
    assert by["own"]["correlation"] > 0.85 > 0.5 > by["episode"]["correlation"] > 0.1
    assert by["own"]["anchor_groups"] == 8 and by["own"]["anchored_turn_frac"] == 1.0  # every round is an anchor
