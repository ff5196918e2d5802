"""The agent examples, smoke-trained 2 GRPO steps (tiny model): agent_tools.py (an openai-SDK agent with a tool) and
verifiers_echo.py (verifiers' OpenEnv taskset on the echo server, offline)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))


def test_agent_tools_task_comes_from_the_seed():
    import agent_tools

    assert agent_tools.task("mul-3") == agent_tools.task("mul-3")
    assert agent_tools.multiply(*agent_tools.task("mul-3")) > 0
    assert all(2 <= n <= 9 for i in range(50) for n in agent_tools.task(f"mul-{i}"))  # the times table


def test_agent_tools_scores_the_last_number_of_the_final_reply():
    import agent_tools

    assert agent_tools.score("42", 6, 7) == agent_tools.score("6 * 7 = 42.", 6, 7) == 1.0
    assert agent_tools.score("42 is wrong, it is 41", 6, 7) == agent_tools.score("forty-two", 6, 7) == 0.0
    assert agent_tools.score("", 6, 7) == agent_tools.score("420", 6, 7) == 0.0


@pytest.mark.slow
def test_agent_tools_training_script_smoke(tmp_path):
    import agent_tools

    argv = ["--model", "tiny", "--steps", "2", "--out", str(tmp_path), "--save", str(tmp_path / "m")]
    summary = agent_tools.main(argv)
    assert summary["wall_s"] > 0
    rewards = json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]
    assert len(rewards) == 2
    from transformers import AutoTokenizer

    assert "tools" in AutoTokenizer.from_pretrained(tmp_path / "m").chat_template  # saved for trl-env eval --model


def test_agent_tools_evaluates_with_trl_env_eval(tmp_path):
    from transformers import AutoTokenizer

    from trl_env.testing import save_tiny_model
    from trl_env.testing.templates import trl_templates
    from trl_env.tools.cli import main

    model_dir = save_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout, as the example sets it
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    status = main(["eval", "--env", f"{EXAMPLES / 'agent_tools.py'}:env", "--model", str(model_dir), "--n", "4",
                   "--history", "deployed", "--processor", "auto", "--max-new-tokens", "8", "--max-turns", "4",
                   "--out", str(out)])  # fmt: skip
    assert status == 0
    lines = [json.loads(line) for p in out.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(lines) == 4 and all(not line.get("error") and line["turns"] for line in lines), lines[:1]


# -- the Responses and Messages examples: an Agents SDK agent, an Anthropic-SDK agent (issue 45 item 6) -----------


def multiply_script(tokenizer):
    """Turn 0 calls multiply with the task's numbers (read off the prompt); turn 1 answers their product."""
    import re

    def script(k, prompt):
        a, b = map(int, re.findall(r"What is (\d) \* (\d)\?", prompt)[-1])
        if k == 0:
            call = json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}})
            return f"<tool_call>\n{call}\n</tool_call><|im_end|>"
        return f"{a * b}<|im_end|>"

    return script


@pytest.mark.parametrize("name", ["agent_responses", "agent_anthropic"])
def test_the_dialect_examples_agent_calls_the_tool_and_trains_token_exact(name):
    import importlib

    from agents_support import PromptReplyGenerator, assert_token_exact

    from trl_env import agent_env_factory, from_tokenizer
    from trl_env.rollout import batch_rollout
    from trl_env.testing.templates import trl_templates
    from trl_env.testing.tokenizers import load_tokenizer

    example = importlib.import_module(name)
    tokenizer = load_tokenizer("pypi:qwen2_5")
    tokenizer.chat_template = trl_templates()["qwen2_5"]  # as the example sets it
    generator = PromptReplyGenerator(tokenizer, multiply_script(tokenizer))
    factory = agent_env_factory(example.agent)
    processor = from_tokenizer(tokenizer)
    rollouts = batch_rollout(["mul-1", "mul-2"], factory, processor, tokenizer, generator, history="deployed")
    assert [r.reward for r in rollouts] == [1.0, 1.0], [r.error for r in rollouts]
    assert all(len(r.rows) == 1 and r.info["env"]["agent_calls"] == 2 for r in rollouts)
    assert assert_token_exact(rollouts, generator) == 4
    prompts = [tokenizer.decode(q) for q in generator.requests]
    assert all(p.startswith("<|im_start|>system\nYou are a calculator.") for p in prompts)
    assert sum("<tool_response>\n" in p for p in prompts) == 2  # each tool result went back through the dialect


@pytest.mark.slow
@pytest.mark.parametrize("name", ["agent_responses", "agent_anthropic"])
def test_the_dialect_examples_training_script_smoke(tmp_path, name):
    import importlib

    summary = importlib.import_module(name).main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert summary["wall_s"] > 0
    rewards = json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]
    assert len(rewards) == 2


@pytest.mark.slow
def test_verifiers_echo_trains_offline_on_verifiers_openenv_taskset(tmp_path):
    if not (EXAMPLES.parent.parent / ".venv-verifiers" / "bin" / "python").exists():
        pytest.skip("no .venv-verifiers: run `bash scripts/install.sh`")
    import verifiers_echo

    argv = ["--model", "tiny", "--steps", "2", "--batch", "4", "--generations", "2", "--out", str(tmp_path)]
    summary = verifiers_echo.main(argv)
    rewards = json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]
    assert len(rewards) == 2 and summary["wall_s"] > 0
    assert all(r > 0 for r in rewards), rewards  # the echo server's partial credit: every episode scored, none failed
