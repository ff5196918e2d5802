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


def test_agent_tools_training_script_smoke(tmp_path):
    import agent_tools

    summary = agent_tools.main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert summary["wall_s"] > 0
    rewards = json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]
    assert len(rewards) == 2
