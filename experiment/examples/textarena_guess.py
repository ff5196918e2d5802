"""Level 2b: a real env library: TextArena's GuessTheNumber-v0 through TextArenaEnv, trained with GRPO on a CPU.

The game (TextArena 0.7.4, ``pip install 'trl-env[textarena]'``) picks a number between 1 and 20 from the
episode's seed and answers each bracketed guess (``[10]``) with "higher" or "lower"; reward 1.0 for finding it
within the turn budget. TextArenaEnv takes care of what the library leaves to its user: seeds, the history it
repeats, the global ``random`` it seeds, and the end reason (``info``, logged as metrics).

Hardware: a CPU (2 cores, ~15 min with SmolLM2-135M-Instruct) or a GPU with a vLLM server.
Run:      python experiment/examples/textarena_guess.py                          # SmolLM2, offline
          python experiment/examples/textarena_guess.py --model tiny --steps 2    # smoke run, seconds
"""

from __future__ import annotations

import functools
import os
import sys

from trl_env import ChatMLProcessor
from trl_env.adapters import TextArenaEnv

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

SYSTEM_PROMPT = "You play a guessing game. Reply with one number in square brackets, like [10], and nothing else."
MAX_TURNS = 5
GuessTheNumber = functools.partial(TextArenaEnv, "GuessTheNumber-v0")


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    args = example_parser(__doc__, name="textarena_guess", steps=20).parse_args(argv)
    return train(
        "textarena_guess",
        args,
        GuessTheNumber,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        seed_format="game-{i}",
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        max_completion_length=160,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as a guess
    )


if __name__ == "__main__":
    main()
