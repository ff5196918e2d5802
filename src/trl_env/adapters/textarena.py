"""TextArena games as trl-env envs: ``TextArenaEnv("GuessTheNumber-v0")`` (extra ``pip install 'trl-env[textarena]'``).

Tested with textarena 0.7.4. What the adapter solves once, so a user does not:

- **Seeds**: the episode's text seed becomes the game's integer seed through ``int_seed`` (stable across
  processes), so every copy of a GRPO group plays the same game.
- **Thread safety**: TextArena seeds Python's global ``random`` in ``reset`` and its games draw from it
  in ``step``; concurrent episodes on the engine's threads would get another seed's game. Every call into
  TextArena holds one module lock (its games are cheap; model turns still overlap them).
- **Observations**: TextArena's observation is the whole history so far; the env returns only what is new,
  without the player's own move echoed back (``[Player] [5]``).
- **Other seats**: multi-player games take an ``opponent(observation) -> move`` for every seat but 0
  (a fixed policy or a script); the model plays seat 0.
- **Rewards and facts**: the reward is seat 0's reward when the game ends (``close()``); ``info`` holds the
  game's end reason, ``invalid_move`` and ``turn_count``. When trl-env cuts the episode first (``max_turns``,
  ``length``), ``truncate`` records it and the reward is ``truncated_reward`` (default 0.0): TextArena
  computes a game's score only when the game itself ends.

Example::

    rollout_func = make_rollout_func(
        functools.partial(TextArenaEnv, "GuessTheNumber-v0"), ChatMLProcessor(), max_turns=10
    )
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from trl_env.env import Action, Delta, Seed, int_seed, json_safe
from trl_env.errors import ConfigError

LOCK = threading.Lock()
"""Held by every call into TextArena: it seeds and draws from the global ``random``."""


def load_textarena() -> Any:
    """The ``textarena`` module; a ``ConfigError`` naming the extra when it is not installed."""
    try:
        import textarena  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError(
            "TextArenaEnv needs the textarena package: pip install 'trl-env[textarena]' (tested: textarena 0.7.4)."
        ) from None
    return textarena


class TextArenaEnv:
    """One TextArena game per episode, the model playing seat 0.

    Args:
        game: a registered TextArena id, e.g. ``"GuessTheNumber-v0"``, ``"TicTacToe-v0"``.
        num_players: seats in the game; seats 1.. are played by ``opponent``.
        opponent: ``opponent(observation) -> move`` for the other seats (required when ``num_players > 1``).
        make_kwargs: keyword arguments for ``textarena.make``.
        truncated_reward: the reward of an episode trl-env cut before the game ended.
    """

    def __init__(
        self,
        game: str,
        *,
        num_players: int = 1,
        opponent: Callable[[str], str] | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        truncated_reward: float = 0.0,
    ) -> None:
        textarena = load_textarena()
        if num_players > 1 and opponent is None:
            raise ConfigError(
                f"TextArenaEnv({game!r}, num_players={num_players}): give opponent=(observation -> move) for seats "
                "1.., e.g. a fixed policy or a script."
            )
        try:
            with LOCK:
                self.game = textarena.make(game, **dict(make_kwargs or {}))
        except Exception as e:  # noqa: BLE001  # textarena raises plain ValueError for an unknown id
            raise ConfigError(f"TextArenaEnv({game!r}): textarena.make failed ({e}); see textarena's registry.") from e
        self.name, self.num_players, self.opponent = game, num_players, opponent
        self.truncated_reward = truncated_reward
        self.reward, self.alive, self._seen = 0.0, True, ""
        self.info: dict[str, Any] = {}

    def reset(self, seed: Seed) -> tuple[TextArenaEnv, Delta]:
        """Start the game from ``int_seed(seed)``; play the other seats up to seat 0's first turn."""
        with LOCK:
            self.game.reset(num_players=self.num_players, seed=int_seed(seed))
            done = self._play_others()
            text = self._new_text("")
        if done:
            self._finish()
        return self, text

    def step(self, action: Action) -> tuple[TextArenaEnv, Delta]:
        """Play seat 0's move, then the other seats' until seat 0 is to move again or the game ends."""
        with LOCK:
            done, _ = self.game.step(action)
            done = done or self._play_others()
            text = self._new_text(action)
        if done:
            self._finish()
        return self, text

    def truncate(self, reason: str) -> None:
        """trl-env ended the episode before the game did: record it; the reward is ``truncated_reward``."""
        self.reward = self.truncated_reward
        self.info = {**self.info, "reason": f"cut by trl-env ({reason})"}

    def _play_others(self) -> bool:
        """Play the other seats' moves until seat 0 is to move; whether the game ended."""
        while self.game.state.current_player_id != 0:
            assert self.opponent is not None, "checked in __init__"
            _, observation = self.game.get_observation()
            done, _ = self.game.step(self.opponent(observation))
            if done:
                return True
        return False

    def _new_text(self, action: str) -> str:
        """What seat 0 has not seen yet, without its own move echoed back."""
        _, observation = self.game.get_observation()
        text = str(observation)
        new = text[len(self._seen) :] if text.startswith(self._seen) else text
        self._seen = text
        echo = f"[Player] {action}".strip()
        return "\n".join(line for line in new.split("\n") if not (action and line.strip() == echo)).strip("\n")

    def _finish(self) -> None:
        with LOCK:
            rewards, game_info = self.game.close()
        self.alive = False
        self.reward = float(rewards[0]) if rewards else 0.0
        mine = game_info.get(0, {}) if isinstance(game_info, Mapping) else {}
        self.info = json_safe({k: mine[k] for k in ("reason", "invalid_move", "turn_count") if k in mine})
