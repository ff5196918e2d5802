"""experiment/examples/agent_tools.py: an openai-SDK agent with a tool, smoke-trained 2 GRPO steps (tiny model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
