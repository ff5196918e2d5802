"""The seed's text environment protocol, and the checks the engine applies to what an Env returns.

An Env is anything with ``reward``, ``alive``, ``reset(seed)`` and ``step(action)``; subclassing
``Env`` is optional. See README.md for a complete example.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

from trl_env.errors import EnvError

Action: TypeAlias = str
Delta: TypeAlias = str
Seed: TypeAlias = str
Language: TypeAlias = str


class RowSeed(str):
    """A seed that carries the dataset row it came from (``prompt_to_seed`` of a row): ``row`` holds every column.

    It is the seed text itself (``prompt_to_seed(row["prompt"])``), so an env that reads only ``str`` sees no
    difference; an env that wants the row's other columns (an answer, a difficulty) reads ``seed.row``.
    """

    row: Mapping[str, Any]

    def __new__(cls, seed: str, row: Mapping[str, Any]) -> RowSeed:
        """``seed``: the row's seed text; ``row``: the whole dataset row."""
        self = super().__new__(cls, seed)
        self.row = row
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the row across a process boundary (``isolated``)
        return (RowSeed, (str(self), self.row))


@runtime_checkable
class Env(Protocol):
    """A text environment, exactly as the seed defines it.

    ``reset(seed)`` starts an episode and returns the env to use from then on (usually ``self``)
    and the first observation text. ``step(action)`` applies the model's action and returns the
    env and the observation text for the next turn. After each call, ``reward`` is the episode's
    reward so far (the engine reads it once, when the call returns, and reports the value after the
    last step as the episode reward) and ``alive`` says whether the episode goes on. An env may also
    have a ``close()`` method: the engine calls it (on a worker thread, bounded by ``env_timeout``)
    once its episode has ended, however it ended. An env may also keep an ``info`` dict of env-side
    facts (a game-over reason, won/lost, per-attempt scores): read after each call, its last value is
    ``Rollout.info["env"]`` (values JSON cannot hold are written as their ``repr``). Env code runs on
    worker threads, several episodes at once: guard state shared between instances (the global
    ``random``, a parser) with a lock, or run envs in processes (``trl_env.rollout.isolation``).

    Example::

        class Countdown(Env):
            def __init__(self) -> None:
                self.reward, self.alive, self.left = 0.0, True, 0

            def reset(self, seed: Seed) -> tuple[Env, Delta]:
                self.left = int(seed)
                return self, f"Say 'tick' {self.left} times, one per turn."

            def step(self, action: Action) -> tuple[Env, Delta]:
                self.reward += 1.0 if action.strip() == "tick" else 0.0
                self.left -= 1
                self.alive = self.left > 0
                return self, f"{self.left} to go."
    """

    reward: float
    alive: bool

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Start an episode from ``seed``; return the env and the first observation."""
        ...

    def step(self, action: Action) -> tuple[Env, Delta]:
        """Apply ``action``; return the env and the next observation."""
        ...


@runtime_checkable
class Closable(Protocol):
    """An env with the optional ``close()``: the engine calls it once the episode has ended, however it ended."""

    def close(self) -> None:
        """Give back what the env holds (sessions, processes, files)."""
        ...


@runtime_checkable
class Truncatable(Protocol):
    """An env told when trl-env ends its episode first (``max_turns`` or a token budget), before its reward is read.

    ``truncate(reason)`` runs once, on a worker thread bounded by ``env_timeout``, with ``reason`` ``"max_turns"``
    or ``"length"``, then ``close()``; the ``reward`` (and ``info``) it leaves is the episode's. An env that scores
    only when its own game ends (partial credit in TextArena) settles the score here.
    """

    def truncate(self, reason: str) -> None:
        """Settle the episode's final reward (and info): trl-env ended it for ``reason``."""
        ...


def int_seed(seed: Seed, bits: int = 32) -> int:
    """A stable integer for a text seed (SHA-256, the same in every process and run, unlike ``hash()``).

    For libraries that take integer seeds (``random.Random``, numpy, TextArena, reasoning-gym): every copy of a
    GRPO group gets the same seed string, so it gets the same game. A seed that is already a non-negative decimal
    integer below ``2**bits`` maps to itself, so ``"7"`` plays game 7.
    """
    if seed.isascii() and seed.isdigit() and int(seed) < 2**bits:  # "²" and "١٢" are digits to isdigit()
        return int(seed)
    return int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest()[:8], "big") % 2**bits


class Checked(NamedTuple):
    """What an env call left behind, checked and converted to plain Python types."""

    env: Env
    delta: Delta
    reward: float
    alive: bool
    info: dict[str, Any] | None = None
    """A JSON-safe copy of the env's optional ``info`` (env-side facts: a game-over reason, won/lost, counts)."""


def check_result(result: object, env: object, *, method: str, env_index: int, turn: int) -> Checked:
    """Validate what ``env.reset``/``env.step`` returned and the env's ``reward``/``alive`` after it.

    Any real number is a reward (``numpy.float32`` too) and any boolean is a flag (``numpy.bool_`` too);
    they come back as ``float`` and ``bool``, read once, so later changes to the env (a ``close()``
    that releases state) cannot alter what this step reported.

    Raises:
        EnvError: naming the class, the method, the value received and the fix.
    """
    name = f"{type(env).__name__}.{method}"

    def fail(problem: str, fix: str) -> EnvError:
        return EnvError(f"{name} {problem}; {fix}.", env_index=env_index, turn=turn, method=method)

    if not (isinstance(result, tuple) and len(result) == 2):
        raise fail(
            f"returned {_short(result)} ({type(result).__name__})",
            "it must return a 2-tuple (env, delta_text), e.g. `return self, 'observation'`",
        )
    new_env, delta = result
    if not isinstance(delta, str):
        raise fail(
            f"returned a delta of type {type(delta).__name__} ({_short(delta)})",
            "the second item must be the observation text (str)",
        )
    try:
        delta.encode("utf-8")
    except UnicodeEncodeError as e:
        raise fail(
            f"returned a delta that is not valid text ({e.reason} at {e.start}: {_short(delta[e.start : e.end])})",
            "return text that encodes as UTF-8 (e.g. `text.encode('utf-8', 'replace').decode()`)",
        ) from None
    missing = [a for a in ("reward", "alive", "step") if not hasattr(new_env, a)]
    if missing:
        raise fail(
            f"returned an env of type {type(new_env).__name__} without {', '.join(missing)}",
            "the first item must be the env itself (usually `self`)",
        )
    reward, alive = new_env.reward, new_env.alive
    if not _is_bool(reward) and isinstance(reward, numbers.Real) and math.isfinite(reward):
        reward = float(reward)
    else:
        raise fail(
            f"left reward = {_short(reward)} ({type(reward).__name__})",
            "reward must be a finite float (any real number); set `self.reward` to a number",
        )
    if not _is_bool(alive):
        raise fail(f"left alive = {_short(alive)} ({type(alive).__name__})", "alive must be a bool")
    info = getattr(new_env, "info", None)  # optional: env-side facts, copied into Rollout.info["env"]
    if info is not None and not isinstance(info, Mapping):
        raise fail(f"left info = {_short(info)} ({type(info).__name__})", "info must be a dict of facts (or absent)")
    return Checked(new_env, delta, reward, bool(alive), None if info is None else json_safe(info))


def json_safe(info: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``info`` that JSON can write: keys as str, values JSON can't hold as their ``repr``."""
    return dict(json.loads(json.dumps({str(k): v for k, v in info.items()}, default=repr)))


def _is_bool(value: object) -> bool:
    """``bool`` or ``numpy.bool_`` (without importing numpy)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
