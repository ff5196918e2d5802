"""The talk envs, reply generators and row checks the history tests share (moved from test_history.py and
test_history_grpo.py, unchanged)."""

from __future__ import annotations

import random
import re
import threading
from concurrent.futures import Future

import pytest

from trl_env import Generation
from trl_env.backends.base import FinishReason, resolved
from trl_env.errors import ConfigError
from trl_env.render.processors.derived import render
from trl_env.testing.tokenizers import official_template


class TalkEnv:
    """Three turns of plain observations; the seed picks the text (and may put special-token text in it)."""

    def __init__(self) -> None:
        self.reward, self.alive, self.turn, self.extra = 0.0, True, 0, ""

    def reset(self, seed):
        self.extra = seed
        return self, f"Start {seed}: say a number."

    def step(self, action):
        self.turn += 1
        self.reward += 1.0 if action.strip().isdigit() else 0.0
        self.alive = self.turn < 3
        return self, f"Observation {self.turn} {self.extra} after {action.strip()!r}."


class ReplyGenerator:
    """Samples the ids of ``processor.render_agent_output(reasoning, action) + stop``; records every request.

    ``reasoning(k)`` says whether reply k (counted over all requests) has a reasoning block; ``think(prompt)``,
    given, decides from the decoded prompt instead, so a reply does not depend on the order episodes run in.
    """

    continuous = False
    context_limit = None

    def __init__(self, tokenizer, processor, *, reasoning=lambda k: True, think=None, seed=0):
        self.tokenizer, self.processor, self.rng = tokenizer, processor, random.Random(seed)
        self.reasoning, self.think = reasoning, think
        self.stop = processor.stop_strings[0] if getattr(processor, "stop_strings", ()) else tokenizer.eos_token
        self.requests, self.outputs = [], []

    def submit(self, requests) -> list[Future[Generation]]:
        futures = []
        for request in requests:
            k = len(self.requests)
            prompt = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
            thinks = self.think(prompt) if self.think else self.reasoning(k)
            thought = f"step {k}: the middle is {k % 10}" if thinks else ""
            action = str(k % 10)
            text = (self.processor.render_agent_output(thought, action) if thought else action) + self.stop
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))[: request.max_tokens]
            reason = FinishReason.STOP if ids[-1] in request.stop_token_ids else FinishReason.LENGTH
            out = Generation(ids, [-self.rng.random() for _ in ids], reason)
            self.requests.append(list(request.prompt_ids))
            self.outputs.append(out)
            futures.append(resolved(out))
        return futures


def conversations(rollout, first_observation, tokenizer, processor):
    """The messages before each turn: the first observation, then per turn the reply and the env's answer."""
    from trl_env.render.history import DeployedHistory
    from trl_env.rollout.calls import EnvText

    history = DeployedHistory(tokenizer, processor, {}, EnvText(tokenizer))
    messages = history.opening(first_observation)
    out = [list(messages)]
    for turn in rollout.turns[:-1]:
        messages = [*messages, history.reply(turn.text), {"role": "user", "content": turn.delta}]
        out.append(list(messages))
    return out


def check_rows(rollouts, generator, tokenizer, processor, seeds, *, template_kwargs=None, ids_level=True):
    """Every row token-exact with the sampler, and every turn's prompt the template's rendering."""
    sent = {}
    for request, output in zip(generator.requests, generator.outputs, strict=True):
        sent.setdefault(tuple(request), []).append(output)
    for rollout, seed in zip(rollouts, seeds, strict=True):
        assert sum(row.turns for row in rollout.rows) == len(rollout.turns)
        prompts = conversations(rollout, f"Start {seed}: say a number.", tokenizer, processor)
        k = 0
        for row in rollout.rows:
            assert len(row.completion_ids) == len(row.logprobs) == len(row.env_mask)
            offset = 0
            for _ in range(row.turns):
                request = row.prompt_ids + row.completion_ids[:offset]
                outputs = sent.get(tuple(request), [])
                match = [o for o in outputs if o.token_ids == row.completion_ids[offset : offset + len(o.token_ids)]]
                assert match, "the row's context at each of its turns is a request"
                output = match[0]
                outputs.remove(output)
                rendering = render(tokenizer, prompts[k], template_kwargs)
                if ids_level:
                    assert request == list(tokenizer.encode(rendering, add_special_tokens=False))
                    assert request == list(tokenizer.apply_chat_template(
                        prompts[k], add_generation_prompt=True, tokenize=True, return_dict=False,
                        **(template_kwargs or {})))  # fmt: skip
                else:
                    assert tokenizer.decode(request, skip_special_tokens=False) == rendering
                n = len(output.token_ids)
                assert row.completion_ids[offset : offset + n] == output.token_ids
                assert row.logprobs[offset : offset + n] == output.logprobs
                assert row.env_mask[offset : offset + n] == [1] * n
                offset += n
                k += 1
                if k < len(rollout.turns):  # env text up to the next turn's prompt (if it extends this row)
                    nxt = prompts[k]
                    env = render(tokenizer, nxt, template_kwargs)
                    so_far = row.prompt_ids + row.completion_ids[:offset]
                    if ids_level:
                        ids = list(tokenizer.encode(env, add_special_tokens=False))
                        extra = len(ids) - len(so_far) if ids[: len(so_far)] == so_far else None
                    else:  # env text spelling special tokens is plain text in the row: find it by its text
                        extra = next((t for t in range(len(row.completion_ids) - offset + 1) if tokenizer.decode(
                            so_far + row.completion_ids[offset : offset + t], skip_special_tokens=False) == env),
                            None)  # fmt: skip
                    if extra is not None:
                        assert row.env_mask[offset : offset + extra] == [0] * extra
                        assert row.logprobs[offset : offset + extra] == [0.0] * extra
                        offset += extra
            assert offset == len(row.completion_ids)
        if len(rollout.rows) == 1:  # the rollout's own lists are its one row's; of several rows, it has none
            assert rollout.completion_ids is rollout.rows[0].completion_ids
        else:
            with pytest.raises(ConfigError, match=r"has \d+ training rows .*read rollout\.rows"):
                _ = rollout.completion_ids
    assert not any(sent.values()), "every request is a turn of some row"


SEEDS = ["1", "2", "3", "4"]


class FlakyTalkEnv:
    """TalkEnv's turns; every 5th instance fails at its first step (an env exception)."""

    count, lock = 0, threading.Lock()

    def __init__(self) -> None:
        with FlakyTalkEnv.lock:
            FlakyTalkEnv.count += 1
            self.number = FlakyTalkEnv.count
            self.fail = self.number % 5 == 0
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Start {seed}: say a number."

    def step(self, action):
        if self.fail:
            raise RuntimeError("flaky env")
        self.turn += 1
        self.reward += 1.0 if action.strip() in "13579" else 0.0
        self.alive = self.turn < 3
        return self, f"Observation {self.turn} after {action.strip()!r}."


class NumberedTalkEnv(FlakyTalkEnv):
    """FlakyTalkEnv that says its instance number, so a reply can depend on its episode (see ``thinks_by_episode``)."""

    def reset(self, seed):
        return self, f"Start {seed}: env {self.number}, say a number."


def thinks_by_episode(prompt: str) -> bool:
    """Env n's turns before turn ``n % 3`` think: among any 3 of 4 consecutive envs, episodes get different rows."""
    number = int(re.search(r"env (\d+),", prompt).group(1))
    return prompt.count("Observation ") < number % 3


def thinking_tokenizer(tokenizer):
    """The tiny tokenizer with Qwen 3's official (thinking) template: it drops earlier reasoning."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = official_template("qwen3")
    return tok


def turns_reward(completions, env_turns, **kwargs):
    return [t / 3 for t in env_turns]


def none_for_short(completions, env_turns, **kwargs):
    return [None if t < 3 else float(len(c)) % 2 for c, t in zip(completions, env_turns, strict=True)]
