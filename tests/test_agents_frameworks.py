"""Agent frameworks as they are, trained through the gateway (issue 45 item 3): the OpenAI Agents SDK (``Runner.run``
with a function tool, on its default Responses model), LangChain's ``ChatOpenAI`` with ``bind_tools`` and a PydanticAI
``Agent`` with a tool (both on chat completions, over the gateway's loopback HTTP endpoint), each an unmodified agent
program run by ``agent_env_factory`` with a scripted generator on the real Qwen 3 tokenizer; every row is token-exact:
each sampled span is the generator's answer for exactly that row's context, and each context is the template's
rendering of what the program sent (the generator's request)."""

from __future__ import annotations

import pytest
from agents_support import (
    PromptReplyGenerator,
    add,
    assert_token_exact,
    framework,
    langchain_program,
    pydantic_ai_program,
    qwen3_script,
)

from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer


async def agents_sdk_program(run):
    """The OpenAI Agents SDK: an Agent with a function tool, ``Runner.run`` on its default (Responses) model."""
    from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool

    adder = Agent(name="adder", instructions="You add.", tools=[function_tool(add)], model=run.model)
    provider = OpenAIProvider(openai_client=run.async_openai(max_retries=0), use_responses=True)
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    result = await Runner.run(adder, f"What is 40 + 2? ({run.seed})", run_config=config, max_turns=4)
    return float(result.final_output == "The answer is 42")


FRAMEWORKS = {
    # name: (program, the module it needs, that module's extra, rows per episode)
    "agents_sdk": (agents_sdk_program, "agents", "agents-dialects", 1),
    # LangChain sends the assistant turn back without its reasoning (langchain-openai keeps no reasoning_content):
    # the second call's prompt is not the first's continuation, so it is a row of its own
    "langchain": (langchain_program, "langchain_openai", "agents-frameworks", 2),
    "pydantic_ai": (pydantic_ai_program, "pydantic_ai", "agents-frameworks", 1),
}


@pytest.mark.slow  # agent programs through the gateway: seconds each
@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_a_framework_agent_with_a_tool_trains_token_exact(name):
    program, module, extra, rows = FRAMEWORKS[name]
    framework(module, extra)
    tokenizer = load_tokenizer("pypi:qwen3")
    generator = PromptReplyGenerator(tokenizer, qwen3_script)
    factory = agent_env_factory(program)
    rollouts = batch_rollout(["1", "2"], factory, from_tokenizer(tokenizer), tokenizer, generator, history="deployed")
    for rollout in rollouts:
        assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
        assert rollout.info["env"]["agent_calls"] == 2 and len(rollout.rows) == rows
    assert assert_token_exact(rollouts, generator) == 4
    prompts = [tokenizer.decode(q) for q in generator.requests]
    assert all(p.startswith("<|im_start|>system\nYou add.") and '"name": "add"' in p for p in prompts)  # the tool
    assert sum("<tool_response>\n42\n</tool_response>" in p for p in prompts) == 2  # each result, by the template


def test_the_frameworks_are_pinned_in_an_extra_that_ci_installs():
    import re
    from pathlib import Path

    root = Path(__file__).parent.parent
    pyproject = (root / "pyproject.toml").read_text()
    found = re.search(r"^agents-frameworks = \[(.*?)\]$", pyproject, re.M | re.S)
    assert found is not None, "pyproject.toml has no agents-frameworks extra"
    assert re.findall(r'"([\w\-\[\]]+)==', found.group(1)) == ["langchain-openai", "pydantic-ai-slim[openai]"]
    line = next(x for x in (root / "scripts" / "install.sh").read_text().splitlines() if '-e ".[test,' in x)
    assert "agents-dialects" in line and "agents-frameworks" in line  # CI (.ci/run -> scripts/test.sh) installs them
