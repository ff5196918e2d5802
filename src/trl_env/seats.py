"""Games with several seats (self-play): the ``SeatedEnv`` protocol, who plays each seat, and the shared match.

Each seat the policy plays is its own episode of ``batch_rollout`` (its own conversation, rows and reward), seen
through a ``SeatEnv``; the seat episodes of one game share a ``Match``, which hands the turn from seat to seat: a
seat's ``step`` returns when that seat is to move again or the game ended (``trl_env.rollout.match``).
``trl_env.rollout.seated.play_seats`` runs them. docs/selfplay.md has the protocol, the failure rules and per-role
credit (``trl_env.train.credit.PerRole``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from trl_env.backends.base import Generator, as_generator
from trl_env.env import Action, Delta, Seed
from trl_env.errors import ConfigError

__all__ = ["POLICY", "Frozen", "Player", "SeatedEnv", "Seating"]


@runtime_checkable
class SeatedEnv(Protocol):
    """A game of ``seats`` players, text in and text out: the seed's ``Env`` with a seat to move and a reward per seat.

    ``reset(seed)`` starts a game and returns the env (usually ``self``) and the observation of the seat to move,
    ``seat``. ``step(action)`` applies that seat's action and returns the observation of the seat to move *next*
    (``seat`` after the call): everything that seat has not seen yet and may see, nothing hidden from it. ``rewards``
    holds one reward per seat (read after each call; the values after the last call are the seats' returns) and
    ``alive`` says whether the game goes on. When the game ends, the observation returned is the closing text every
    seat may see. Like an ``Env``, it may keep an ``info`` dict (its key ``"seats"``, a list of one dict per seat,
    is split: each seat's rollout gets only its own) and have ``close()``. One thread calls it at a time.

    Example::

        class Nim:  # take 1 or 2 from a pile; whoever takes the last one wins
            seats = 2

            def reset(self, seed):
                self.pile, self.seat, self.alive, self.rewards = int(seed), 0, True, [0.0, 0.0]
                return self, f"Pile: {self.pile}. Take 1 or 2."

            def step(self, action):
                self.pile -= 2 if action.strip() == "2" else 1
                if self.pile <= 0:
                    self.alive, self.rewards = False, [1.0, -1.0] if self.seat == 0 else [-1.0, 1.0]
                    return self, f"Player {self.seat} took the last one."
                self.seat = 1 - self.seat
                return self, f"Pile: {self.pile}. Take 1 or 2."
    """

    seats: int
    seat: int
    rewards: Sequence[float]
    alive: bool

    def reset(self, seed: Seed) -> tuple[SeatedEnv, Delta]:
        """Start a game from ``seed``; return the env and the observation of the seat to move."""
        ...

    def step(self, action: Action) -> tuple[SeatedEnv, Delta]:
        """Apply the action of the seat to move; return the env and the observation of the next seat to move."""
        ...


POLICY: Literal["policy"] = "policy"
"""A seat the policy being trained plays: its own episode, trainable rows."""


@dataclass(frozen=True)
class Frozen:
    """A seat played by a model that is not trained: its turns are real samples of ``generator``; it has no rows.

    The seat is an episode like a policy seat's (its own conversation, the same processor, budgets and history) in an
    engine of its own that samples with ``generator``; ``play_seats`` drops its rollout once the game is over, so it
    never reaches the loss or a group statistic. A failed or cut frozen episode ends its game as a policy seat's does.
    ``trl_env.train.snapshots.LoraSnapshots(...).seat`` is the frozen copy of the policy: a LoRA snapshot of
    the trained adapter, served by the same vLLM server and refreshed every N steps (docs/selfplay.md).
    """

    generator: Generator
    """Samples the seat's turns, e.g. ``VLLMServerGenerator(url, model="an-earlier-adapter")`` or a ``LoraSnapshots``;
    its ``session()`` wraps every ``play_seats`` call."""

    def __post_init__(self) -> None:
        try:
            as_generator(self.generator)  # a ConfigError now, not at the first game
        except ConfigError as e:
            raise ConfigError(f"Frozen(generator=...): {e}") from None


Player: TypeAlias = Literal["policy"] | Frozen | Callable[[str], str]
"""Who plays a seat: ``POLICY``; a ``Frozen`` model (an episode of its own, no rows); or a fixed function
``observation -> action`` (no episode, no rows; it gets each observation the game gives its seat, and plays inside the
step of the seat that moved before it)."""


@dataclass(frozen=True)
class Seating:
    """A game and who plays each of its seats; pass it as ``make_rollout_func``'s (or ``play_seats``') env factory.

    Args:
        game: builds a fresh ``SeatedEnv``; called once per game.
        players: one per seat: ``POLICY``, a ``Frozen`` model, or a function ``observation -> action``.
        truncated_reward: every seat's reward when a game ends before the env ended it (a seat's episode cut by
            ``max_turns`` or a token budget); a seat's episode that *failed* fails the whole game instead.
    """

    game: Callable[[], SeatedEnv]
    players: tuple[Player, ...]
    truncated_reward: float = 0.0

    def __post_init__(self) -> None:
        if not callable(self.game):
            raise ConfigError(f"Seating(game={self.game!r:.60}): give a function that builds a fresh SeatedEnv.")
        bad = [p for p in self.players if p != POLICY and not isinstance(p, Frozen) and not callable(p)]
        if len(self.players) < 2 or bad or POLICY not in self.players:
            raise ConfigError(
                f"Seating(players={self.players!r:.120}): give one player per seat (at least two), each 'policy', a "
                "Frozen(generator) or a function observation -> action, with at least one 'policy' seat; e.g. "
                "players=('policy', 'policy')."
            )

    @property
    def policy_seats(self) -> tuple[int, ...]:
        """The seats the policy plays, in order: the seat episodes of one game."""
        return tuple(i for i, p in enumerate(self.players) if p == POLICY)

    @property
    def frozen_seats(self) -> tuple[int, ...]:
        """The seats a ``Frozen`` model plays, in order: episodes without rows."""
        return tuple(i for i, p in enumerate(self.players) if isinstance(p, Frozen))
