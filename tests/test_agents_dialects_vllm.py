"""Issue 45 item 3: an agent of each new dialect trains 2 real EpisodeGRPOTrainer steps through the gateway, every
turn sampled by the REAL vLLM CPU server: the OpenAI Agents SDK's ``Runner.run`` on the Responses API
(experiment/examples/agent_responses.py) and an Anthropic-SDK agent on Messages
(experiment/examples/agent_anthropic.py), both with a ``multiply`` tool, and the frameworks on chat completions:
LangChain's ``ChatOpenAI`` with ``bind_tools`` and a PydanticAI agent with a tool (tests/agents_support.py). Every row
is checked token by token against what the server answered for exactly that row's context (the check of
tests/test_agents_vllm.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from agents_support import assert_served_exact, framework, langchain_program, pydantic_ai_program
from async_support import Recorder

from trl_env import VLLMServerGenerator, env_reward, make_rollout_func
from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.testing.templates import trl_templates
from trl_env.train.episode_trainer import EpisodeGRPOTrainer

sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))

EXAMPLES = {"agent_responses": "agents", "agent_anthropic": "anthropic"}  # the example, the SDK it needs
FRAMEWORKS = {  # agent programs on chat completions through a framework, over the gateway's loopback HTTP endpoint
    "langchain": (langchain_program, "langchain_openai", "agents-frameworks"),
    "pydantic_ai": (pydantic_ai_program, "pydantic_ai", "agents-frameworks"),
}


@pytest.mark.parametrize("name", [*EXAMPLES, *FRAMEWORKS])
def test_two_real_grpo_steps_of_a_dialect_agent_every_row_token_exact_against_vllm(vllm_server, tmp_path, name):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    if name in EXAMPLES:
        framework(EXAMPLES[name], "agents-dialects")
        agent = importlib.import_module(name).agent
    else:
        agent, module, extra = FRAMEWORKS[name]
        framework(module, extra)
    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout, as the examples set it
    recorder = Recorder()
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0)
    func = make_rollout_func(
        agent_env_factory(agent),
        from_tokenizer(tok),
        history="deployed",
        generator=gen,
        max_turns=4,
        max_new_tokens=12,
        env_timeout=120,
        parse_truncated_turns=True,  # the random tiny model is cut at most calls: answer them, as the API does
    )
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=160,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = EpisodeGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=env_reward,
        args=args,
        processing_class=tok,
        rollout_func=func,
        train_dataset=Dataset.from_dict({"prompt": ["mul-1", "mul-2"] * 8}),
    )
    trainer.train()

    assert sum("loss" in h for h in trainer.state.log_history) == 2
    episodes = [r for batch in seen for r in batch]
    assert len(episodes) == 8 and all(r.ending.value != "error" for r in episodes), [r.error for r in episodes]
    assert_served_exact(episodes, recorder)  # every server answer is one trained turn, token-exact
    assert all(r.info["env"]["agent_calls"] >= 1 for r in episodes)
