"""Level 2: arithmetic with native tool calls: the model calls add/subtract/multiply in its template's own format.

Each seed is an expression such as ``(17 * 23) - 45``. The model may call the calculator tools as many times
as it likes (up to the turn budget); its tool calls are parsed in the format its chat template defines
(``ToolProcessor.from_tokenizer``: Qwen's ``<tool_call>`` JSON here), each result comes back as the template's
tool turn, and a reply without a call is its final answer. Reward: 1.0 for the right number, plus 0.2 if it
used a tool successfully on the way (a shaping term small models need to discover the tools).

The offline models (SmolLM2, the tiny test model) have a ChatML template without tool support, so this
example gives their tokenizer TRL's Qwen 2.5 template, which writes the same ChatML tokens and adds the tool
layout. A tool-capable instruct model (Qwen 2.5/3, Llama 3.1, GLM, gpt-oss, Gemma 4) keeps its own template.

Hardware: a CPU (2 cores, ~20 min with SmolLM2-135M-Instruct) or a GPU with a vLLM server (docs/tools.md).
Run:      python experiment/examples/calculator_tools.py                          # SmolLM2, offline
          python experiment/examples/calculator_tools.py --model tiny --steps 2    # smoke run, seconds
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from trl_env import Action, Delta, ToolCalls, ToolEnv, ToolProcessor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

SYSTEM_PROMPT = "Use the calculator tools for arithmetic. When you know the result, reply with the number only."
MAX_TURNS = 4


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def subtract(a: int, b: int) -> int:
    """Subtract b from a.

    Args:
        a: the number to subtract from
        b: the number to subtract
    """
    return a - b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


TOOLS = [add, subtract, multiply]


def expression(seed: str) -> str:
    """The arithmetic task for ``seed`` (the same for every copy of a GRPO group)."""
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(1, 50)
    op = rng.choice(["+", "-"])
    return f"({a} * {b}) {op} {c}"


def score(answer: str, seed: str) -> float:
    """1.0 when the answer's last number is the expression's value."""
    words = answer.replace(",", " ").split()
    numbers = [w.strip(".!") for w in words if w.strip(".!").lstrip("-").isdigit()]
    return float(bool(numbers) and int(numbers[-1]) == eval(expression(seed)))  # noqa: S307  # our own expression


class CalculatorEnv(ToolEnv):
    """Compute an expression with the calculator tools; a reply without a call is the answer."""

    def __init__(self) -> None:
        super().__init__(TOOLS, task=lambda seed: f"Compute {expression(seed)}.", score=score, tool_timeout=5.0)
        self.used_tool = False

    def step(self, action: Action) -> tuple[ToolEnv, Delta]:
        env, delta = super().step(action)
        if isinstance(action, ToolCalls) and self.info["tool_calls"] > self.info["tool_errors"]:
            self.used_tool = True
        if not self.alive and self.used_tool:
            self.reward += 0.2
        return env, delta


def processor_for(tokenizer: Any) -> ToolProcessor:
    """The tool processor for the model's template; a ChatML template without tools gets TRL's Qwen 2.5 one."""
    from trl.chat_template_utils import supports_tool_calling

    from trl_env.testing.templates import trl_templates

    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = trl_templates()["qwen2_5"]
    return ToolProcessor.from_tokenizer(tokenizer, TOOLS, system_prompt=SYSTEM_PROMPT)


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    args = example_parser(__doc__, name="calculator_tools", steps=20).parse_args(argv)
    return train(
        "calculator_tools",
        args,
        CalculatorEnv,
        processor_for,
        seed_format="calc-{i}",
        max_turns=MAX_TURNS,
        max_new_tokens=64,
        max_completion_length=384,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as its answer
    )


if __name__ == "__main__":
    main()
