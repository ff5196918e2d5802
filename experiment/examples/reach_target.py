"""Level 2, per-turn reward shaping: reach a target number with moves like +7, -3 or *2.

The env draws a start and a target from its seed (so a GRPO group shares one game). Each turn the model
replies with one move (+k, -k or *k, k from 1 to 9) and sees the new number and that turn's reward. Every
turn is rewarded for the distance it closes, as potential-based shaping (Ng, Harada, Russell 1999): turn
reward = phi(after) - phi(before) - STEP_COST with phi(n) = -0.5 * min(|target - n|, 2 d0) / d0, d0 the
starting distance. The phi terms telescope, so the episode reward (their sum, plus BONUS when the target
is reached) depends only on where the episode ends and how many turns it took: shaping gives a dense
signal without changing which games are best. A reply with no valid move costs 0.1 and changes nothing.
A clean solve in k turns scores 1 - 0.02 k; `Turn.reward` in the transcripts shows the sum growing turn by turn.

Hardware: a CPU (SmolLM2-135M: minutes per step on 2 cores) or, better, a GPU. See docs/examples.md.
Run:      python experiment/examples/reach_target.py --model tiny --steps 2     # smoke run, seconds
          python experiment/examples/reach_target.py                           # SmolLM2, CPU
          python experiment/examples/reach_target.py --model Qwen/Qwen2.5-0.5B-Instruct \\
              --vllm-server http://127.0.0.1:8000    # after `trl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct`
"""

from __future__ import annotations

import os
import random
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

from trl_env import Action, ChatMLProcessor, Delta, Env, Seed

MAX_TURNS = 4  # every game can be won in 3 moves
STEP_COST, BONUS, INVALID = 0.02, 0.5, 0.1
SYSTEM_PROMPT = "You play a number game. Reply with one move, such as +7, -3 or *2, and nothing else."
MOVE = re.compile(r"([-+*])\s*(\d+)")


class ReachTargetEnv(Env):
    """Walk from a start number to a target with +k / -k / *k moves; every turn is rewarded for progress."""

    def __init__(self, max_turns: int = MAX_TURNS) -> None:
        self.max_turns = max_turns
        self.reward, self.alive = 0.0, True
        self.start = self.target = self.number = self.turns = 0

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        rng = random.Random(seed)
        self.start, self.target = rng.randint(1, 9), rng.randint(20, 60)
        self.number, self.turns, self.reward, self.alive = self.start, 0, 0.0, True
        return self, (
            f"Start at {self.start} and reach {self.target} in at most {self.max_turns} moves. "
            "Each move is +k, -k or *k with k from 1 to 9. Your move?"
        )

    def potential(self, n: int) -> float:
        """phi(n): 0 at the target, -0.5 at the start, -1 at twice the starting distance or beyond."""
        d0 = abs(self.target - self.start)
        return -0.5 * min(abs(self.target - n), 2 * d0) / d0

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.turns += 1
        self.alive = self.turns < self.max_turns
        match = MOVE.search(action)
        if match is None or not 1 <= int(match.group(2)) <= 9:
            self.reward -= INVALID
            return self, f"No valid move (turn reward {-INVALID:+.2f}). Reply like +7 or *2. You are at {self.number}."
        op, k = match.group(1), int(match.group(2))
        before = self.number
        self.number = before + k if op == "+" else before - k if op == "-" else before * k
        turn_reward = self.potential(self.number) - self.potential(before) - STEP_COST
        if self.number == self.target:
            turn_reward += BONUS
            self.alive = False
        self.reward += turn_reward
        distance = abs(self.target - self.number)
        status = "Target reached!" if distance == 0 else f"Distance to {self.target}: {distance}. Your move?"
        return self, f"{before} {op} {k} = {self.number} (turn reward {turn_reward:+.2f}). {status}"


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    args = example_parser(__doc__, name="reach_target", steps=30).parse_args(argv)
    return train(
        "reach_target",
        args,
        ReachTargetEnv,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        seed_format="walk-{i}",
        max_completion_length=224,  # 4 turns of 8 model tokens and ~40 env tokens
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as a move
    )


if __name__ == "__main__":
    main()
