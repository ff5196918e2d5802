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


def test_one_generator_per_live_trainer_and_never_a_dead_ones_to_a_new_trainer_at_its_address():
    func = make_rollout_func(Echo, ChatMLProcessor(), generator=Built)
    first, other = Trainer("first"), Trainer("other")
    first_generator = func._generator(first)
    assert func._generator(first) is first_generator  # one per trainer
    assert func._generator(other) is not first_generator
    dead = id(first)
    del first
    gc.collect()
    second = Trainer("second")
    # what CPython's allocator often does: the new trainer at the dead one's address (forced here, by its entry)
    func._generators[id(second)] = func._generators.pop(dead)
    assert func._generator(second) is not first_generator
    assert func._generator(second) is func._generator(second)


def test_a_trainer_that_takes_no_weak_reference_keeps_its_generator():
    from types import SimpleNamespace

    func = make_rollout_func(Echo, ChatMLProcessor(), generator=lambda trainer: Built(Trainer("stand-in")))
    stand_in = SimpleNamespace(name="stand-in")
    assert func._generator(stand_in) is func._generator(stand_in)
