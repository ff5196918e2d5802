"""make_rollout_func keeps one generator per trainer object: a new trainer never gets a dead one's generator."""

from __future__ import annotations

import gc

from trl_env import ChatMLProcessor, make_rollout_func
from trl_env.backends.base import FinishReason, Generation, resolved


class Echo:
    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        return self, "Say hi."

    def step(self, action):
        self.alive = False
        return self, "Bye."


class Built:
    """A generator per trainer, built by the factory ``make_rollout_func(generator=...)`` calls with the trainer."""

    continuous = False
    context_limit = None

    def __init__(self, trainer) -> None:
        self.trainer_name = trainer.name

    def submit(self, requests):
        return [resolved(Generation([1], [-0.1], FinishReason.STOP)) for _ in requests]


class Trainer:
    def __init__(self, name: str) -> None:
        self.name = name


def test_one_generator_per_live_trainer_object_and_none_kept_for_a_dead_one():
    """Keyed by the trainer object (weakly), not its id: a dead trainer's generator is dropped, so a later trainer
    that CPython puts at the same address can never be handed it."""
    func = make_rollout_func(Echo, ChatMLProcessor(), generator=Built)
    first, other = Trainer("first"), Trainer("other")
    first_generator = func._generator(first)
    assert func._generator(first) is first_generator  # one per trainer
    assert func._generator(other) is not first_generator
    del first
    gc.collect()
    assert list(func._generators.values()) == [func._generator(other)]  # only the live trainer's
