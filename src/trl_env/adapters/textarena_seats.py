"""TextArena games of several seats as a ``trl_env.seats.SeatedEnv``: ``TextArenaGame("KuhnPoker-v0")``.

Tested with textarena 0.7.4 on ``TicTacToe-v0``, ``KuhnPoker-v0`` and ``SimpleNegotiation-v0`` (two seats; docs/
selfplay.md). Beyond what ``TextArenaEnv`` solves (seeds, the module lock, only new text), each game keeps its own
state of Python's global ``random`` (saved after every call, restored before the next), because TextArena games draw
from it during play (Kuhn Poker shuffles a new deck each round): concurrent games then play exactly what each would
alone. Each seat gets only the new part of its own observation, without its own move echoed back. Invalid moves
are TextArena's: with its default error allowance a seat's first invalid move is answered with a retry, the next
one loses the game; each seat's ``info["seats"][s]`` carries TextArena's ``invalid_move`` and ``turn_count`` for
that player (``invalid_move`` is what ``env/seat{s}/invalid_move_rate`` counts). Rewards are TextArena's (win 1,
loss -1, draw 0), known when the game ends.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping
from typing import Any

from trl_env.adapters.textarena import LOCK, load_textarena
from trl_env.env import Action, Delta, Seed, int_seed, json_safe
from trl_env.errors import ConfigError


class TextArenaGame:
    """One TextArena game of ``num_players`` seats per episode of every seat (a ``SeatedEnv``).

    Args:
        game: a registered TextArena id of a game for ``num_players`` players, e.g. ``"TicTacToe-v0"``.
        num_players: seats in the game.
        make_kwargs: keyword arguments for ``textarena.make``.
    """

    def __init__(self, game: str, *, num_players: int = 2, make_kwargs: Mapping[str, Any] | None = None) -> None:
        textarena = load_textarena()
        if num_players < 2:
            raise ConfigError(f"TextArenaGame({game!r}, num_players={num_players}): use TextArenaEnv for one player.")
        try:
            with LOCK:
                self.game = textarena.make(game, **dict(make_kwargs or {}))
        except Exception as e:  # noqa: BLE001  # textarena raises plain ValueError for an unknown id
            raise ConfigError(f"TextArenaGame({game!r}): textarena.make failed ({e}); see textarena's registry.") from e
        self.name, self.seats = game, num_players
        self.seat, self.alive = 0, True
        self.rewards: list[float] = [0.0] * num_players
        self.info: dict[str, Any] = {}
        self._seen = [""] * num_players
        self._moved = [""] * num_players  # each seat's last action, not echoed back to it
        self._random: Any = None

    def reset(self, seed: Seed) -> tuple[TextArenaGame, Delta]:
        """Start the game from ``int_seed(seed)``; return the observation of the seat to move."""
        with LOCK:
            self.game.reset(num_players=self.seats, seed=int_seed(seed))
            self._random = random.getstate()
            return self, self._turn()

    def step(self, action: Action) -> tuple[TextArenaGame, Delta]:
        """Play the action of the seat to move; return the next seat's observation (or the closing text)."""
        self._moved[self.seat] = action
        with LOCK:
            random.setstate(self._random)
            done, _ = self.game.step(action)
            self._random = random.getstate()
            if done:
                return self, self._finish()
            return self, self._turn()

    def _turn(self) -> str:
        """The seat to move now, and the part of its observation it has not seen (its own last move not echoed)."""
        self.seat, observation = self.game.get_observation()
        text, seat = str(observation), self.seat
        new = text[len(self._seen[seat]) :] if text.startswith(self._seen[seat]) else text
        self._seen[seat], own, self._moved[seat] = text, self._moved[seat], ""
        echo = f"[Player {seat}] {own}"
        return "\n".join(line for line in new.split("\n") if not (own and line.strip() == echo)).strip("\n")

    def _finish(self) -> str:
        """The game ended: rewards and facts from TextArena, and the closing text every seat may see."""
        rewards, game_info = self.game.close()
        self.alive = False
        self.rewards = [float(rewards.get(s, 0.0)) if isinstance(rewards, Mapping) else 0.0 for s in range(self.seats)]
        per_seat = game_info if isinstance(game_info, Mapping) else {}
        facts = [{k: per_seat.get(s, {}).get(k) for k in ("invalid_move", "turn_count")} for s in range(self.seats)]
        reason = next((str(i["reason"]) for i in per_seat.values() if isinstance(i, Mapping) and "reason" in i), "")
        self.info = json_safe({"reason": reason, "seats": facts})
        return f"[GAME] {reason}".strip() if reason else "[GAME] The game is over."


def random_move(observation: str) -> str:
    """A fixed player for ``Seating``: one of the moves the observation's last list offers, drawn at random.

    Reads TicTacToe's ``Available Moves: '[0]', '[4]'`` and Kuhn Poker's ``Your available actions are: '[check]', ..``
    (the last such list). The draw depends only on the observation text (its SHA-256), so an evaluation replays
    exactly; ``"[Deny]"`` where no list is found (SimpleNegotiation). The baseline opponent of docs/selfplay.md.
    """
    lists = re.findall(r"(?:Available Moves|available actions are): ((?:'\[[^\]]*\]'(?:, )?)+)", observation)
    if not lists:
        return "[Deny]"
    moves = re.findall(r"'(\[[^\]]*\])'", lists[-1])
    draw = int.from_bytes(hashlib.sha256(observation.encode("utf-8")).digest()[:8], "big")
    return str(moves[draw % len(moves)])
