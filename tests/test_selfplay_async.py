"""Self-play through the async worker (TrlEnvRolloutWorker): a group of num_generations seat episodes is
num_generations / 2 games, each row token-exact, and credit="per_role" normalises each seat apart."""

from __future__ import annotations

import pytest
from async_support import answered_by, check_row, consume, make_worker, record_pushes
from seat_games import SecretNim

from trl_env import ConfigError
from trl_env.seats import POLICY, Seating
from trl_env.train.advantages import group_advantages

SELF_PLAY = Seating(SecretNim, (POLICY, POLICY))


def test_worker_plays_games_and_pushes_per_role_advantages(tokenizer):
    from async_support import PolicyGenerator

    groups: list = []
    gen = PolicyGenerator(tokenizer, p_stop=0.5)
    worker = make_worker(tokenizer, env=SELF_PLAY, gen=gen, seeds=["5", "6", "7"], num_generations=4,
                         max_inflight_groups=1, max_turns=4, max_staleness=100, credit="per_role",
                         on_group=lambda record, rollouts: groups.append((record, rollouts)))  # fmt: skip
    pushed = record_pushes(worker)
    batches, dropped, _, leftovers = consume(worker, steps=2, batch=6, max_staleness=100)
    read = [s for b in batches for _, s in b] + leftovers
    answered = answered_by(gen)
    assert dropped == 0 and read and all(check_row(s, answered) for s in read)  # every trained run as answered
    checked = 0
    for record, rollouts in groups:
        assert [r.info["seat"] for r in rollouts] == [0, 1, 0, 1] and len({r.seed for r in rollouts}) == 1
        rewards = [r.reward for r in rollouts]
        expected = [None] * 4
        for seat in (0, 1):  # each seat against the same seat of the group's other game, the one rule
            pair = group_advantages([rewards[seat], rewards[seat + 2]])
            expected[seat], expected[seat + 2] = pair
        for samples in pushed.get(record.group_id, []):
            episode = next(e for e, r in enumerate(rollouts) if _holds(r, samples))  # a tie: the same tokens, reward
            assert all(s.advantage == pytest.approx(expected[episode]) for s in samples)
            checked += 1
    assert checked >= 4


def _holds(rollout, samples) -> bool:
    """The samples are prefixes of the rollout's one row (history="sampled")."""
    ids = rollout.rows[0].prompt_ids + rollout.rows[0].completion_ids
    return all(ids[: len(s.input_ids)] == s.input_ids.tolist() for s in samples)


def test_a_group_must_divide_into_games(tokenizer):
    with pytest.raises(ConfigError, match="make num_generations a multiple of 2"):
        make_worker(tokenizer, env=SELF_PLAY, seeds=["5"], num_generations=3)
    with pytest.raises(ConfigError, match="env_executor='process' with a Seating"):
        make_worker(tokenizer, env=SELF_PLAY, seeds=["5"], env_executor="process")
