"""Level 1: guess the number with higher/lower hints, trained with GRPO on a CPU.

The env picks a secret number from its seed (so every copy of a GRPO group plays the same game)
and answers each guess with "Higher." or "Lower."; the episode ends when the model finds it or
runs out of turns. Reward: 1.0 for a win (minus 0.1 per extra turn), else up to 0.5 for how close
the last guess came; a reply with no number costs 0.2.

Hardware: a CPU (2 cores: 20 steps with SmolLM2-135M-Instruct in 452 s of training, idle; docs/getting-started.md,
          "What to expect") or anything bigger.
Run:      python experiment/examples/guess_number.py                 # the main job (SmolLM2, prepared offline)
          python experiment/examples/guess_number.py --model tiny --steps 2   # smoke run, seconds
"""

from __future__ import annotations

import os
import random
import re
import sys

from trl_env import Action, ChatMLProcessor, Delta, Env, Seed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

LOW, HIGH = 1, 10  # the secret number's range (inclusive)
MAX_TURNS = 3
SYSTEM_PROMPT = "You play a guessing game. Reply with a single number and nothing else."


class GuessNumberEnv(Env):
    """Guess a secret number in [LOW, HIGH] from higher/lower hints."""

    def __init__(self, low: int = LOW, high: int = HIGH, max_turns: int = MAX_TURNS) -> None:
        self.low, self.high, self.max_turns = low, high, max_turns
        self.reward, self.alive = 0.0, True
        self.secret, self.turns, self.penalty = 0, 0, 0.0

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.reward, self.alive, self.turns, self.penalty = 0.0, True, 0, 0.0
        return self, f"I am thinking of a number between {self.low} and {self.high}. What is your guess?"

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.turns += 1
        match = re.search(r"-?\d+", action)
        if match is None:
            self.penalty += 0.2
            self.reward = -self.penalty
            self.alive = self.turns < self.max_turns
            return self, f"Please reply with a number between {self.low} and {self.high}."
        guess = int(match.group())
        if guess == self.secret:
            self.reward, self.alive = 1.0 - 0.1 * (self.turns - 1) - self.penalty, False
            return self, "Correct!"
        closeness = 1.0 - min(abs(guess - self.secret), self.high - self.low) / (self.high - self.low)
        self.reward = 0.5 * closeness - self.penalty
        self.alive = self.turns < self.max_turns
        return self, "Higher." if guess < self.secret else "Lower."


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    args = example_parser(__doc__, name="guess_number", steps=20).parse_args(argv)
    return train(
        "guess_number",
        args,
        GuessNumberEnv,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        seed_format="game-{i}",
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as a guess
    )


if __name__ == "__main__":
    main()
