"""A game shared by its seat episodes: the ``Match`` that hands the turn from seat to seat, and ``SeatEnv``, one seat.

The protocol a game implements (``SeatedEnv``) and who plays each seat (``Seating``) are in ``trl_env.seats``;
``trl_env.rollout.seated.play_seats`` builds the matches and runs the seat episodes (docs/selfplay.md).
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trl_env.env import Action, Delta, Seed, json_safe
from trl_env.errors import EnvError, EpisodeFailure
from trl_env.rollout.workers import waiting
from trl_env.seats import POLICY, Frozen, SeatedEnv, Seating

__all__ = ["Match", "SeatEnv", "View"]


class View(NamedTuple):
    """What one seat learns when its turn comes (or the game ends)."""

    delta: str
    alive: bool
    reward: float
    info: dict[str, Any]
    """The game's ``info`` as this seat may see it (``play_seats`` records the seat in ``Rollout.info["seat"]``)."""


@dataclass
class Match:
    """One game shared by its seat episodes: starts it, runs the fixed seats, and hands the turn between seats.

    Only the thread of the seat to move (or the seat that starts the game) calls the game, never under the lock,
    so a hung game call is timed out by the engine like any env call; waiting for a turn happens inside
    ``trl_env.rollout.workers.waiting()`` (untimed, and a spare worker takes the thread's place).
    """

    seating: Seating
    seed: Seed
    env: SeatedEnv | None = None
    rewards: list[float] = field(default_factory=list)
    over: bool = False
    reason: str = ""
    """Why the game ended early (a seat's episode ended first); empty when the game itself ended."""
    info: dict[str, Any] = field(default_factory=dict)
    _started: bool = False
    _to_move: int = -1
    _closing: str = ""
    _pending: dict[int, str] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def open(self, seat: int) -> View:
        """The seat's first observation, once it is its turn (the first seat to arrive starts the game)."""
        with self._cond:
            start, self._started = not self._started, True
        if start:
            self._call("reset", lambda: self.seating.game().reset(self.seed), seat)
        return self._await(seat)

    def step(self, seat: int, action: Action) -> View:
        """Play the seat's action, then wait until it is the seat's turn again or the game ended."""
        with self._cond:
            if self.over:
                return self._view(seat)
            if self._to_move != seat:
                raise EpisodeFailure(
                    "env_exception", RuntimeError(f"seat {seat} stepped out of turn ({self._to_move})")
                )
        assert self.env is not None, "a game is started before any seat steps"
        game = self.env
        self._call("step", lambda: game.step(action), seat)
        return self._await(seat)

    def leave(self, seat: int) -> None:
        """Seat ``seat``'s episode ended (however it ended): a game still going ends for every seat."""
        with self._cond:
            if not self.over:
                self.over, self.reason = True, f"seat {seat}'s episode ended before the game did"
                self.rewards = [self.seating.truncated_reward] * len(self.seating.players)
                self._cond.notify_all()

    def _call(self, method: str, fn: Callable[[], object], seat: int) -> None:
        """Call the game (and the fixed seats after it) outside the lock; a failure ends the game, then re-raises."""
        try:
            result = fn()
            while True:
                env, delta, alive, to_move = self._check(result, method, seat)
                player = self.seating.players[to_move] if alive else POLICY
                if player == POLICY or isinstance(player, Frozen):  # a seat episode: it moves in its own step
                    break
                assert callable(player), "Seating checks its players"
                result, method = env.step(player(delta)), "step"
        except BaseException:
            self.leave(seat)
            raise
        with self._cond:
            self.env, self._to_move = env, to_move
            if alive and not self.over:
                self._pending[to_move] = self._pending.get(to_move, "") + delta
            elif not self.over:
                self.over, self._closing = True, delta
            self._cond.notify_all()

    def _check(self, result: object, method: str, seat: int) -> tuple[SeatedEnv, str, bool, int]:
        """Read what the game left after a call: its env, text, ``alive``, ``seat`` and ``rewards``."""
        seats = len(self.seating.players)

        def fail(problem: str) -> EpisodeFailure:
            error = EnvError(f"{problem}; see trl_env.seats.SeatedEnv.", env_index=seat, turn=-1, method=method)
            return EpisodeFailure("env_bad_return", error)

        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str)):
            raise fail(f"{method} returned {result!r:.80}; it must return (env, observation text)")
        env, delta = result
        rewards = list(getattr(env, "rewards", ()))
        numeric = all(isinstance(r, numbers.Real) and not isinstance(r, bool) and math.isfinite(r) for r in rewards)
        if len(rewards) != seats or not numeric:  # numpy numbers too, as env.check_result takes them
            raise fail(f"{type(env).__name__}.rewards = {rewards!r:.80} after {method}; give {seats} finite numbers")
        alive, to_move = getattr(env, "alive", None), getattr(env, "seat", None)
        if not isinstance(alive, bool) or not isinstance(to_move, int) or not 0 <= to_move < seats:
            raise fail(f"{type(env).__name__} left alive={alive!r}, seat={to_move!r}; need a bool and 0..{seats - 1}")
        info = getattr(env, "info", None)
        with self._cond:
            self.rewards = [float(r) for r in rewards] if not self.over else self.rewards
            self.info = json_safe(info) if isinstance(info, dict) else {}
        return env, delta, alive, to_move

    def _await(self, seat: int) -> View:
        def turn() -> bool:
            return self.over or (self._to_move == seat and seat in self._pending)

        with self._cond:
            if turn():
                return self._view(seat)
        with waiting(), self._cond:  # untimed; the scheduler sends the next wave without this call
            self._cond.wait_for(turn)
            return self._view(seat)

    def _view(self, seat: int) -> View:
        info = {k: v for k, v in self.info.items() if k != "seats"}
        own = self.info.get("seats")
        if isinstance(own, list) and len(own) == len(self.seating.players) and isinstance(own[seat], dict):
            info.update(own[seat])
        if self.reason:
            info["reason"] = self.reason
        if self.over:
            return View(self._closing, False, self.rewards[seat], info)
        return View(self._pending.pop(seat), True, self.rewards[seat], info)


class SeatEnv:
    """One seat of a ``Match`` as a plain ``Env``: what ``batch_rollout`` runs for each seat the policy plays.

    ``reset(key)`` takes the key ``play_seats`` gives the episode (it names the match and the seat).
    """

    def __init__(self, table: Callable[[str], tuple[Match, int]]) -> None:
        self._table = table
        self.reward, self.alive = 0.0, True
        self.info: dict[str, Any] = {}
        self.match: Match | None = None
        self.seat = -1

    def reset(self, seed: Seed) -> tuple[SeatEnv, Delta]:
        """Join the match the key names; return the seat's first observation when it is its turn."""
        self.match, self.seat = self._table(seed)
        return self, self._take(self.match.open(self.seat))

    def step(self, action: Action) -> tuple[SeatEnv, Delta]:
        """Play the seat's action; return what the seat sees when its turn comes again (or the game ended)."""
        assert self.match is not None, "reset first"
        return self, self._take(self.match.step(self.seat, action))

    def truncate(self, reason: str) -> None:
        """trl-env cut this seat's episode: the game ends for every seat, each scored ``truncated_reward``."""
        assert self.match is not None, "truncate follows a reset"
        self.match.leave(self.seat)
        self.reward = self.match.seating.truncated_reward
        self.info = {**self.info, "reason": f"cut by trl-env ({reason}) at seat {self.seat}"}

    def _take(self, view: View) -> str:
        self.alive, self.reward, self.info = view.alive, view.reward, view.info
        return view.delta
