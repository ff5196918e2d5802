"""Misconfigurations whose cause is knowable fail when the trainer is built (issue 47 item 1), not after a step:
an agent env declaring tools on a template that renders none, and an opening prompt no budget has room for."""

from __future__ import annotations

import copy

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_env import (
    Action,
    ChatMLProcessor,
    ConfigError,
    Delta,
    Env,
    EpisodeGRPOTrainer,
    Seed,
    agent_env_factory,
    env_reward,
    from_tokenizer,
    make_rollout_func,
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def agent(run):  # never runs: the trainer refuses first
    raise AssertionError("an episode started")


class Say(Env):
    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        return self, "Say something."

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.reward, self.alive = 1.0, False
        return self, "Thanks."


def config(tmp_path, **kwargs) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=32, max_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                      bf16=False, **kwargs)  # fmt: skip


def trainer(cls, model, tokenizer, tmp_path, func):
    return cls(model=model, reward_funcs=env_reward, args=config(tmp_path), processing_class=tokenizer,
               rollout_func=func, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))  # fmt: skip


def test_an_agent_env_declaring_tools_on_a_template_without_tools_is_refused_when_the_trainer_is_built(
    model, tokenizer, tmp_path
):
    func = make_rollout_func(agent_env_factory(agent, tools=[multiply]), from_tokenizer(tokenizer), history="deployed")
    with pytest.raises(ConfigError, match=r"tools=\[multiply\].*renders no tool-calling conversation.*chat_template"):
        trainer(EpisodeGRPOTrainer, model, tokenizer, tmp_path, func)


def test_the_same_agent_env_on_a_template_with_tools_is_built(model, tokenizer, tmp_path):
    from trl_env.testing.templates import trl_templates

    with_tools = copy.deepcopy(tokenizer)  # a copy: the session's tokenizer is shared
    with_tools.chat_template = trl_templates()["qwen2_5"]
    func = make_rollout_func(agent_env_factory(agent, tools=[multiply]), from_tokenizer(with_tools), history="deployed")
    assert [tool["function"]["name"] for tool in func.env_factory.tools] == ["multiply"]  # read as JSON schemas
    trainer(EpisodeGRPOTrainer, model, with_tools, tmp_path, func)


def test_an_opening_prompt_longer_than_max_context_is_refused_when_the_trainer_is_built(model, tokenizer, tmp_path):
    long_system = "You are a helpful assistant. " * 40  # ~200 tokens
    func = make_rollout_func(Say, ChatMLProcessor(system_prompt=long_system), max_context=64, max_new_tokens=8)
    with pytest.raises(ConfigError, match=r"opening prompt.* \d+ tokens.*max_context=64.*system prompt"):
        trainer(EpisodeGRPOTrainer, model, tokenizer, tmp_path, func)


def test_grpo_trainer_refuses_it_at_its_first_step_before_any_episode(model, tokenizer, tmp_path):
    long_system = "You are a helpful assistant. " * 40
    func = make_rollout_func(Say, ChatMLProcessor(system_prompt=long_system), max_context=64, max_new_tokens=8)
    built = trainer(GRPOTrainer, model, tokenizer, tmp_path, func)  # GRPOTrainer does not tell us at construction
    with pytest.raises(ConfigError, match=r"opening prompt.*max_context=64"):
        built.train()
    assert built.state.global_step == 0


def test_an_opening_prompt_within_max_context_is_built(model, tokenizer, tmp_path):
    func = make_rollout_func(Say, ChatMLProcessor(system_prompt="Be brief."), max_context=64, max_new_tokens=8)
    trainer(EpisodeGRPOTrainer, model, tokenizer, tmp_path, func)
