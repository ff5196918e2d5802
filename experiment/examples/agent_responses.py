"""An unmodified OpenAI Agents SDK agent (``Agent`` with a ``function_tool``, ``Runner.run``) trained through the
gateway, on the Responses API (``POST /v1/responses``).

The agent below is ordinary Agents SDK code on the SDK's default model, ``OpenAIResponsesModel``: it talks the
Responses API (input items, ``function_call`` / ``function_call_output`` items). Its client is the episode's
(``run.async_openai()``, handed to the SDK by an ``OpenAIProvider`` in the run's ``RunConfig``; one per episode, since
every episode has its own key: the process-wide ``set_default_openai_client`` would be shared by all of them), and
tracing is off (nothing leaves the machine). trl-env runs it once per episode (``agent_env_factory``); every model call
the SDK makes is a turn, rendered with the model's chat template (``history="deployed"``) and trained token-exactly
with ``EpisodeGRPOTrainer``. The task, the tool and the reward are agent_tools.py's (multiply two numbers). See
docs/agents.md, "Dialects".

Hardware: a CPU (2 cores). Run:
    python experiment/examples/agent_responses.py --model tiny --steps 2    # smoke run
    python experiment/examples/agent_responses.py                          # SmolLM2-135M-Instruct, offline
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples/

from agent_tools import SYSTEM_PROMPT, multiply, score, task, train_agent  # noqa: E402  # the same task and run

from trl_env import AgentRun  # noqa: E402

MAX_TURNS = 3
"""Model calls per episode (the SDK's ``max_turns``): the tool calls and the final answer."""


async def agent(run: AgentRun) -> float:
    """The agent program: an Agents SDK agent with a tool, run with ``Runner.run`` on the Responses API."""
    from agents import Agent, AgentsException, OpenAIProvider, RunConfig, Runner, function_tool

    a, b = task(run.seed)
    calculator = Agent(name="calculator", instructions=SYSTEM_PROMPT, tools=[function_tool(multiply)], model=run.model)
    provider = OpenAIProvider(openai_client=run.async_openai(max_retries=0), use_responses=True)
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    try:
        result = await Runner.run(calculator, f"What is {a} * {b}?", run_config=config, max_turns=MAX_TURNS)
    except AgentsException:  # out of turns, or a call of a tool the agent does not have: no answer
        return 0.0
    return score(str(result.final_output or ""), a, b)


def main(argv: list[str] | None = None) -> dict[str, float]:
    return train_agent(
        agent, __doc__, name="agent_responses", max_turns=MAX_TURNS + 1, max_completion_length=256, argv=argv
    )


if __name__ == "__main__":
    main()
