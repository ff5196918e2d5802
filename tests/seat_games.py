"""Small games of two seats for the seat tests (trl_env.seats.SeatedEnv)."""

from __future__ import annotations

import time


class SecretNim:
    """Take 1 or 2 from a pile; whoever takes the last one wins. Each seat holds a card only it may see.

    "1" or "2" takes that many; any other text takes 1 + its length mod 2, so a random model's games differ.
    """

    seats = 2

    def __init__(self, hang_at: int | None = None) -> None:
        self.hang_at = hang_at

    def reset(self, seed):
        self.pile, self.seat, self.alive, self.rewards = int(seed), 0, True, [0.0, 0.0]
        self.cards = [f"card-{seed}-A", f"card-{seed}-B"]
        return self, self._observation("")

    def step(self, action):
        if self.hang_at is not None and self.pile == self.hang_at:
            time.sleep(5)
        move = action.strip()
        taken = int(move) if move in ("1", "2") else 1 + len(move) % 2  # any text is a move (a random model plays)
        self.pile -= taken
        if self.pile <= 0:
            self.alive = False
            self.rewards = [1.0, -1.0] if self.seat == 0 else [-1.0, 1.0]
            return self, f"Player {self.seat} took the last one."
        self.seat = 1 - self.seat
        return self, self._observation(f"Opponent took {taken}. ")

    def _observation(self, lead: str) -> str:
        return f"{lead}Pile: {self.pile}. Your card: {self.cards[self.seat]}. Take 1 or 2."
