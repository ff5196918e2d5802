"""The calculator example (native tool calls): its rules, a smoke run, and real GRPO steps on tool-calling episodes."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

from tests.helpers import ReplyGenerator
from trl_env.render.tools import ToolCall, ToolCalls, ToolResults

EXAMPLES = Path(__file__).parent.parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))

import calculator_tools  # noqa: E402  # the examples folder is not a package
import pytest  # noqa: E402
from calculator_tools import CalculatorEnv, expression, processor_for, score  # noqa: E402

pytestmark = pytest.mark.slow  # GRPO steps and the calculator example script


def test_the_task_comes_from_the_seed_and_the_answer_is_scored():
    assert expression("calc-3") == expression("calc-3") != expression("calc-4")
    value = eval(expression("calc-3"))  # noqa: S307
    assert score(f"The result is {value}.", "calc-3") == 1.0 and score("no idea", "calc-3") == 0.0


def test_a_correct_answer_after_a_tool_call_earns_the_shaping_bonus():
    env = CalculatorEnv()
    _, task = env.reset("calc-3")
    assert task == f"Compute {expression('calc-3')}."
    a, b = (int(x) for x in expression("calc-3").split(")")[0].strip("(").split(" * "))
    _, delta = env.step(ToolCalls("", [ToolCall("multiply", {"a": a, "b": b})]))
    assert isinstance(delta, ToolResults) and delta.results[0].content == str(a * b)
    env.step(str(eval(expression("calc-3"))))  # noqa: S307
    assert not env.alive and env.reward == 1.2


def test_calculator_training_script_smoke(tmp_path):
    summary = calculator_tools.main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert math.isfinite(summary["wall_s"])
    rows = [json.loads(line) for line in (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()]
    assert rows and "# Tools" in rows[0]["conversation"]  # the opening lists the tools as the template does


def test_grpo_trains_on_episodes_with_native_tool_calls(tmp_path, model, tokenizer):
    """Real GRPOTrainer steps; the sampler (scripted) calls the tools in Qwen's format, env results are masked."""
    from tests.helpers import train_grpo
    from trl_env import make_rollout_func

    tok = copy.deepcopy(tokenizer)
    processor = processor_for(tok)  # gives the tiny tokenizer TRL's Qwen 2.5 template

    def reply(prompt: str) -> str:
        seed = prompt.split("Compute ", 1)[1].split(".", 1)[0]
        a, b = (int(x) for x in seed.split(")")[0].strip("(").split(" * "))
        if "<tool_response>" not in prompt:
            return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call><|im_end|>'
        return f"{eval(seed)}<|im_end|>"  # noqa: S307

    generator = ReplyGenerator(tok, reply)
    rollout_func = make_rollout_func(CalculatorEnv, processor, max_turns=3, max_new_tokens=64, generator=generator)
    history = train_grpo(tmp_path, model, tok, rollout_func, ["calc-1", "calc-2"], batch=4, max_completion_length=512)
    logged = [h for h in history if "env/tool_calls_mean" in h]
    assert len(logged) == 2 and all(
        h["env/tool_calls_mean"] == 1.0 and h["env/tool_errors_rate"] == 0.0 for h in logged
    )
    assert all(abs(h["reward"] - 1.2) < 1e-6 for h in logged)  # logged in float32
