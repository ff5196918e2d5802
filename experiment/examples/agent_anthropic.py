"""An unmodified Anthropic-SDK agent (``messages.create`` with a tool) trained through the gateway, on the Messages
API (``POST /v1/messages``).

The agent below is ordinary ``anthropic`` code: a top-level ``system``, a ``multiply`` tool (``input_schema``), and a
loop that runs each ``tool_use`` block the model writes and sends a ``tool_result`` back. Its client is the episode's
(``run.anthropic()``: a real ``anthropic.Anthropic`` on the episode's key). trl-env runs it once per episode
(``agent_env_factory``); every call is a turn, rendered with the model's chat template (``history="deployed"``) and
trained token-exactly with ``EpisodeGRPOTrainer``. The task, the tool and the reward are agent_tools.py's (multiply
two numbers). See docs/agents.md, "Dialects".

Hardware: a CPU (2 cores). Run:
    python experiment/examples/agent_anthropic.py --model tiny --steps 2    # smoke run
    python experiment/examples/agent_anthropic.py                          # SmolLM2-135M-Instruct, offline
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples/

from agent_tools import MAX_CALLS, SYSTEM_PROMPT, multiply, score, task, train_agent  # noqa: E402  # the same task

from trl_env import AgentRun  # noqa: E402


def agent(run: AgentRun) -> float:
    """The agent program: plain Anthropic-SDK code with a tool loop."""
    from transformers.utils import get_json_schema

    a, b = task(run.seed)
    client = run.anthropic(max_retries=0)
    schema = get_json_schema(multiply)["function"]
    tools: Any = [{"name": "multiply", "description": schema["description"], "input_schema": schema["parameters"]}]
    messages: list[Any] = [{"role": "user", "content": f"What is {a} * {b}?"}]
    for _ in range(MAX_CALLS):
        answer = client.messages.create(
            model=run.model, max_tokens=1024, system=SYSTEM_PROMPT, messages=messages, tools=tools
        )
        uses = [block for block in answer.content if block.type == "tool_use"]
        if not uses:
            return score("".join(block.text for block in answer.content if block.type == "text"), a, b)
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
        )
        results = []
        for use in uses:
            try:
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": str(multiply(**use.input))})
            except (TypeError, ValueError) as e:
                results.append(
                    {"type": "tool_result", "tool_use_id": use.id, "content": f"Error: {e}", "is_error": True}
                )
        messages.append({"role": "user", "content": results})
        if answer.stop_reason == "max_tokens":
            return 0.0
    return 0.0


def main(argv: list[str] | None = None) -> dict[str, float]:
    return train_agent(
        agent, __doc__, name="agent_anthropic", max_turns=MAX_CALLS + 1, max_completion_length=256, argv=argv
    )


if __name__ == "__main__":
    main()
