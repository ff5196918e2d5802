"""The one call from a trainer to the engine: a batch of episodes under ``RolloutOptions``.

``run_episodes`` dispatches to ``batch_rollout`` (an env factory) or ``play_seats`` (a ``Seating``: games of several
seats) with the engine options of ``make_rollout_func`` / ``TrlEnvRolloutWorker``; both trainers call it, so both run
episodes the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trl_env.backends.base import Generator
from trl_env.env import Env, Seed
from trl_env.render.processors.base import Processor
from trl_env.rollout import Budgets, Rollout, batch_rollout
from trl_env.rollout.seated import play_seats
from trl_env.seats import Seating
from trl_env.train.options import EngineOptions

__all__ = ["run_episodes"]


def run_episodes(
    seeds: Sequence[Seed | BaseException],
    env_factory: Callable[[], Env] | Seating,
    processor: Processor,
    tokenizer: Any,
    generator: Generator,
    engine: EngineOptions,
    budgets: Budgets,
    *,
    env_workers: int | None = None,
    on_episode_end: Callable[[int], None] | None = None,
) -> list[Rollout]:
    """One episode per seed, in order: ``batch_rollout`` for an env factory, ``play_seats`` for a ``Seating``.

    ``env_workers`` replaces ``engine.env_workers`` (the async worker caps it at its group size).
    """
    options: dict[str, Any] = {
        "budgets": budgets,
        "parse_truncated_turns": engine.parse_truncated_turns,
        "strict": engine.strict,
        "env_workers": engine.env_workers if env_workers is None else env_workers,
        "env_timeout": engine.env_timeout,
        "coalesce_s": engine.coalesce_s,
        "on_episode_end": on_episode_end,
        "history": engine.history,
        "template_kwargs": engine.template_kwargs,
    }
    if isinstance(env_factory, Seating):
        return play_seats(seeds, env_factory, processor, tokenizer, generator, **options)
    return batch_rollout(seeds, env_factory, processor, tokenizer, generator, **options)
