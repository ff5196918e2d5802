"""Issue 33 item 7 (the openai-SDK half): 2 real EpisodeGRPOTrainer steps of an agent program written with the
``openai`` SDK and a tool, through the gateway, every turn sampled by the REAL vLLM CPU server; every row checked
token by token against what the server answered."""

from __future__ import annotations

import sys
from pathlib import Path

from async_support import Recorder

from trl_env import VLLMServerGenerator, env_reward, make_rollout_func
from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.testing.templates import trl_templates
from trl_env.train.episode_trainer import EpisodeGRPOTrainer

sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))

from agent_tools import agent  # noqa: E402  # the example's agent: openai SDK, a multiply tool
from agents_support import assert_served_exact


def test_two_real_grpo_steps_of_an_openai_sdk_agent_every_row_token_exact_against_vllm(vllm_server, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout
    recorder = Recorder()
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0)
    func = make_rollout_func(agent_env_factory(agent), from_tokenizer(tok), history="deployed", generator=gen,
                             max_turns=4, max_new_tokens=12, env_timeout=120, parse_truncated_turns=True)  # fmt: skip
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=160, max_steps=2, logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = EpisodeGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=env_reward,
                                 args=args, processing_class=tok, rollout_func=func,
                                 train_dataset=Dataset.from_dict({"prompt": ["mul-1", "mul-2"] * 8}))  # fmt: skip
    trainer.train()

    assert sum("loss" in h for h in trainer.state.log_history) == 2
    episodes = [r for batch in seen for r in batch]
    assert len(episodes) == 8 and all(r.ending.value != "error" for r in episodes), [r.error for r in episodes]
    assert_served_exact(episodes, recorder)  # every server answer is one trained turn, token-exact
    assert all(r.info["env"]["agent_calls"] >= 1 for r in episodes)
