"""Coalescing: turns that become ready together reach a continuous generator in one ``submit`` call.

The vLLM client sends one ``submit``'s turns as one batched request (tests/test_vllm_client.py), so the engine
decides the batches: it holds a ready turn while other envs are still stepping, at most ``coalesce_s``.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers import ScriptedEnv, ScriptedGenerator, SpyGenerator

from trl_env import Budgets, ChatMLProcessor, ConfigError, Ending, batch_rollout

IM_END = "<|im_end|>"


def spy(tokenizer):
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    inner = ScriptedGenerator(vocab, tokenizer.convert_tokens_to_ids(IM_END), p_stop=0.3, continuous=True)
    return SpyGenerator(inner)


def seeds(n, turns=3):
    return [json.dumps({"n": turns, "deltas": [f"ok {i}"]}) for i in range(n)]


def test_turns_ready_together_go_to_the_generator_in_one_submit_per_turn(tokenizer):
    gen = spy(tokenizer)
    rollouts = batch_rollout(
        seeds(32), ScriptedEnv, ChatMLProcessor(), tokenizer, gen, budgets=Budgets(max_turns=3, max_new_tokens=6),
        parse_truncated_turns=True, coalesce_s=5.0,
    )  # fmt: skip
    assert all(len(r.turns) == 3 and r.ending is Ending.ENV_DONE for r in rollouts), [r.error for r in rollouts]
    assert gen.waves == [32, 32, 32]  # every env steps in the window, so each turn is one batch


class Gate:
    """Episode 0's first step waits until every other episode has ended (or 20 s: then the engine held them)."""

    def __init__(self) -> None:
        self.others_done = threading.Event()
        self.waited: list[bool] = []

    def factory(self):
        gate = self

        class Env(ScriptedEnv):
            def step(self, action):
                if self.deltas == ["slow"] and self.turn == 0:
                    gate.waited.append(gate.others_done.wait(20))
                return super().step(action)

        return Env()


def test_a_slow_env_never_holds_back_the_turns_of_the_others(tokenizer):
    gate, ended = Gate(), set()
    n = 9
    specs = [json.dumps({"n": 3, "deltas": ["slow"]})] + seeds(n - 1)

    def on_end(i):
        ended.add(i)
        if ended >= set(range(1, n)):
            gate.others_done.set()

    rollouts = batch_rollout(
        specs, gate.factory, ChatMLProcessor(), tokenizer, spy(tokenizer),
        budgets=Budgets(max_turns=3, max_new_tokens=6), parse_truncated_turns=True, coalesce_s=0.05,
        on_episode_end=on_end,
    )  # fmt: skip
    assert gate.waited == [True], "the other episodes were held back by the slow one"
    assert all(len(r.turns) == 3 for r in rollouts)


class SlowSteps(ScriptedEnv):
    """Each step takes 200 ms plus 6 ms per position in its seed: the turns of one round get ready 6 ms apart."""

    def step(self, action):
        time.sleep(0.2 + 0.006 * json.loads(self.seed_text)["i"])
        return super().step(action)

    def reset(self, seed):
        self.seed_text = seed
        return super().reset(seed)


def test_auto_window_gathers_the_turns_of_slow_envs_into_one_request(tokenizer):
    """With slow env steps, turns get ready spread over ~40 ms: "auto" holds a third of a step (up to 50 ms)."""
    specs = [json.dumps({"n": 3, "deltas": ["ok"], "i": i}) for i in range(8)]
    waves = {}
    for window in ("auto", 0.01):
        gen = spy(tokenizer)
        rollouts = batch_rollout(
            specs, SlowSteps, ChatMLProcessor(), tokenizer, gen, budgets=Budgets(max_turns=3, max_new_tokens=6),
            parse_truncated_turns=True, coalesce_s=window, env_workers=8,
        )  # fmt: skip
        assert all(len(r.turns) == 3 for r in rollouts), [r.error for r in rollouts]
        waves[window] = gen.waves
    assert waves["auto"] == [8, 8, 8], waves  # the first round follows the (instant) resets
    assert len(waves[0.01]) > 3, waves  # a fixed 10 ms window splits the later rounds


def test_a_negative_window_fails_early_naming_the_value(tokenizer):
    with pytest.raises(ConfigError, match="coalesce_s=-1"):
        batch_rollout(seeds(1), ScriptedEnv, ChatMLProcessor(), tokenizer, spy(tokenizer), coalesce_s=-1)
    with pytest.raises(ConfigError, match="coalesce_s='fast'"):
        batch_rollout(seeds(1), ScriptedEnv, ChatMLProcessor(), tokenizer, spy(tokenizer), coalesce_s="fast")
