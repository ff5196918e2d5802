"""An unmodified smolagents agent (``ToolCallingAgent`` on ``OpenAIServerModel``, a ``multiply`` tool), trained through
the gateway.

smolagents is Hugging Face's agent framework, written against any OpenAI-compatible server through its
``OpenAIServerModel``: the agent below is ordinary smolagents code, given the episode's ``base_url`` and key. trl-env
runs it once per episode (``agent_env_factory``); every model call smolagents makes (each tool-calling step, and its
final-answer call when the steps run out) is a turn, rendered with the model's chat template (``history="deployed"``)
and trained token-exactly. The task is agent_tools.py's (multiply two numbers with the tool); smolagents' own 3.8k-
character system prompt is replaced by a short one so that a turn fits the small models' context.

Hardware: a CPU (2 cores). Run:
    python experiment/examples/agent_smolagents.py --model tiny --steps 2    # smoke run
    python experiment/examples/agent_smolagents.py                          # SmolLM2-135M-Instruct, offline
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples/

from agent_tools import task, train_agent  # noqa: E402  # the same seeded task, the same training run

from trl_env import AgentRun  # noqa: E402

MAX_STEPS = 2  # tool-calling steps; smolagents then asks once more for a final answer
SYSTEM_PROMPT = (
    "You solve tasks with tools. Call the multiply tool, then call final_answer with the number.\n"
    "Tools:\n{%- for tool in tools.values() %}\n- {{ tool.name }}: {{ tool.description }}{%- endfor %}"
)


def prompt_templates() -> dict:
    """smolagents' own ToolCallingAgent templates, with the short system prompt above."""
    import importlib.resources

    import yaml

    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    templates = yaml.safe_load(text)
    templates["system_prompt"] = SYSTEM_PROMPT
    return templates


def agent(run: AgentRun) -> float:
    """The agent program: plain smolagents code against the episode's OpenAI-compatible endpoint."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a * b

    a, b = task(run.seed)
    model = OpenAIServerModel(
        model_id=run.model, api_base=run.base_url, api_key=run.api_key, client_kwargs={"max_retries": 0}
    )
    solver = ToolCallingAgent(
        tools=[multiply], model=model, max_steps=MAX_STEPS, verbosity_level=0, prompt_templates=prompt_templates()
    )
    answer = solver.run(f"What is {a} * {b}?")
    return float(str(answer).strip() == str(a * b))


def main(argv: list[str] | None = None) -> dict[str, float]:
    return train_agent(
        agent, __doc__, name="agent_smolagents", max_turns=MAX_STEPS + 1, max_completion_length=512, argv=argv
    )


if __name__ == "__main__":
    main()
