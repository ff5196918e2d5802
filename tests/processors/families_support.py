"""The engine run and messages the processor family tests share (moved from processors/test_families.py,
unchanged)."""

from __future__ import annotations

from concurrent.futures import Future

from trl_env import Budgets, Generation, batch_rollout
from trl_env.backends.base import FinishReason, resolved

USERS = [" Guess a number.\n", "line\nbreak\n", "日本 → é ✓ naïve", "  42 ", "3.14, -5 and 1000!"]


class ScriptedEnv:
    """Sends USERS[0] at reset and USERS[k] after the k-th action; records the actions."""

    def __init__(self, users):
        self.users, self.k, self.reward, self.alive, self.actions = users, 0, 0.0, True, []

    def reset(self, seed):
        return self, self.users[0]

    def step(self, action):
        self.actions.append(action)
        self.k += 1
        self.alive = self.k < len(self.users)
        return self, self.users[self.k] if self.alive else "done"


class ReplayGenerator:
    """Stands in for a model: turn k "samples" tok(replies[k] + end-of-turn), with logprob 0."""

    continuous = False

    def __init__(self, tokenizer, replies, stop):
        self.turns = [tokenizer.encode(r + stop, add_special_tokens=False) for r in replies]
        self.k = 0

    def submit(self, requests) -> list[Future[Generation]]:
        out = []
        for _ in requests:
            ids, self.k = self.turns[self.k], self.k + 1
            out.append(resolved(Generation(ids, [0.0] * len(ids), FinishReason.STOP)))
        return out


def run_engine(tokenizer, processor, users, replies):
    """The engine's ids up to the generation prompt after the last user text, and the actions the env received."""
    stop = processor.stop_strings[0]
    envs = []

    def factory():
        envs.append(ScriptedEnv(users))
        return envs[-1]

    generator = ReplayGenerator(tokenizer, [*replies, "the last reply"], stop)
    (rollout,) = batch_rollout(
        ["0"], factory, processor, tokenizer, generator,
        budgets=Budgets(max_turns=len(users), max_new_tokens=512, max_completion_tokens=4096), strict=True,
    )  # fmt: skip
    assert rollout.turns[-1].num_env_tokens == 0  # the last turn is sampled, then the episode ends
    ids = rollout.prompt_ids + rollout.completion_ids
    return ids[: len(ids) - rollout.turns[-1].num_model_tokens], envs[0].actions[:-1]


def messages_for(system, users, replies):
    messages = [] if system is None else [{"role": "system", "content": system}]
    for k, user in enumerate(users):
        if k:
            messages.append({"role": "assistant", "content": replies[k - 1]})
        messages.append({"role": "user", "content": user})
    return messages


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)
