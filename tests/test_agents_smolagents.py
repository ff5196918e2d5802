"""Issue 33 item 7 (the agent-framework half): a smolagents agent (``ToolCallingAgent`` on ``OpenAIServerModel``, a
``multiply`` tool; experiment/examples/agent_smolagents.py), first against the real vLLM CPU server's own OpenAI
endpoint, then through the gateway in 2 real EpisodeGRPOTrainer steps, every row checked token by token against what
the server answered (the check of tests/test_agents_vllm.py, the openai-SDK half)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("smolagents", reason="smolagents is not installed: pip install 'trl-env[test]'")

from agents_support import assert_served_exact  # noqa: E402
from async_support import Recorder  # noqa: E402
from vllm_server import make_vllm_server_fixture  # noqa: E402

from trl_env import VLLMServerGenerator, env_reward, make_rollout_func  # noqa: E402
from trl_env.agents import AgentRun, agent_env_factory  # noqa: E402
from trl_env.render.processors import from_tokenizer  # noqa: E402
from trl_env.testing.templates import trl_templates  # noqa: E402
from trl_env.train.episode_trainer import EpisodeGRPOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))

import agent_smolagents  # noqa: E402  # the example's agent: smolagents, a multiply tool

# smolagents' ToolCallingAgent sends tool_choice="required", which vLLM's own endpoint serves only with a tool parser.
# The session server has these flags (vllm_server.SESSION_EXTRA_ARGS), so this fixture yields it: no server of its own.
TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
vllm_tool_server = make_vllm_server_fixture(name="vllm_tool_server", scope="module", extra_args=TOOL_ARGS)


def test_smolagents_agent_runs_against_the_vllm_servers_own_endpoint(vllm_tool_server):
    vllm_server = vllm_tool_server
    from smolagents import ActionStep, OpenAIServerModel, ToolCallingAgent

    model = OpenAIServerModel(model_id=vllm_server.model, api_base=vllm_server.base_url + "/v1", api_key="EMPTY",
                              client_kwargs={"max_retries": 0}, max_tokens=12)  # fmt: skip
    solver = ToolCallingAgent(tools=[], model=model, max_steps=agent_smolagents.MAX_STEPS, verbosity_level=0,
                              prompt_templates=agent_smolagents.prompt_templates())  # fmt: skip
    solver.run("What is 3 * 4?")
    steps = [step for step in solver.memory.steps if isinstance(step, ActionStep)]
    assert len(steps) == agent_smolagents.MAX_STEPS + 1  # the tool-calling steps, then the final-answer call
    assert all(step.token_usage is not None and step.token_usage.output_tokens > 0 for step in steps)  # served
    assert agent_smolagents.agent(
        AgentRun("mul-1", "mul-1", vllm_server.base_url + "/v1", "EMPTY", vllm_server.model)
    ) in (0.0, 1.0)


def test_two_real_grpo_steps_of_a_smolagents_agent_every_row_token_exact_against_vllm(vllm_server, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout
    recorder = Recorder()
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0)
    func = make_rollout_func(agent_env_factory(agent_smolagents.agent), from_tokenizer(tok), history="deployed",
                             generator=gen, max_turns=agent_smolagents.MAX_STEPS + 1, max_new_tokens=12,
                             env_timeout=120, parse_truncated_turns=True)  # fmt: skip  # cut replies go to the agent
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=768, max_steps=2, logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = EpisodeGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=env_reward,
                                 args=args, processing_class=tok, rollout_func=func,
                                 train_dataset=Dataset.from_dict({"prompt": ["mul-1", "mul-2"] * 8}))  # fmt: skip
    trainer.train()

    assert sum("loss" in h for h in trainer.state.log_history) == 2
    episodes = [r for batch in seen for r in batch]
    assert len(episodes) == 8 and all(r.ending.value != "error" for r in episodes), [r.error for r in episodes]
    assert_served_exact(episodes, recorder)  # every server answer is one trained turn, token-exact
    assert all(r.info["env"]["agent_calls"] == agent_smolagents.MAX_STEPS + 1 for r in episodes)  # steps + final
