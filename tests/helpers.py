"""Toy envs, generator stand-ins for the engine seam, and the token-exactness check used across tests."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import trl
from datasets import Dataset
from trl import GRPOConfig

from trl_env import Generation, GenerationRequest, env_reward
from trl_env.backends.base import FinishReason, resolved


class GuessEnv:
    """Guess the number from the seed; 'higher'/'lower' hints; reward 1 when guessed. Counts its instances."""

    instances: list[GuessEnv] = []

    def __init__(self) -> None:
        self.reward, self.alive, self.target, self.steps, self.seeds = 0.0, True, 0, 0, []
        GuessEnv.instances.append(self)

    def reset(self, seed):
        self.seeds.append(seed)
        self.target = int(seed)
        return self, f"Guess my number between 0 and 9 (seed {seed})."

    def step(self, action):
        self.steps += 1
        digits = [c for c in action if c.isdigit()]
        guess = int(digits[0]) if digits else -1
        if guess == self.target:
            self.reward, self.alive = 1.0, False
            return self, "Correct!"
        self.reward -= 0.1
        return self, "higher" if guess < self.target else "lower"


class ScriptedEnv:
    """An env whose deltas and lifetime come from its JSON seed: {"n": turns, "deltas": [...]}."""

    def __init__(self) -> None:
        self.reward, self.alive, self.deltas, self.turn, self.n_turns = 0.0, True, ["x"], 0, 0

    def reset(self, seed):
        spec = json.loads(seed)
        self.n_turns, self.deltas = spec["n"], spec["deltas"] or ["x"]
        self.alive = self.n_turns > 0
        return self, self.deltas[0]

    def step(self, action):
        self.turn += 1
        self.reward += len(action) % 3
        self.alive = self.turn < self.n_turns
        return self, self.deltas[self.turn % len(self.deltas)]


class ScriptedGenerator:
    """Generator stand-in for engine unit tests: random ids/logprobs, stops at random, records requests.

    ``continuous`` and per-request completion order are configurable to exercise both schedulers.
    """

    def __init__(self, vocab: Sequence[int], stop_id: int, *, seed: int = 0, p_stop: float = 0.2, continuous=False):
        self.vocab, self.stop_id, self.rng, self.p_stop = list(vocab), stop_id, random.Random(seed), p_stop
        self.continuous = continuous
        self.requests: list[GenerationRequest] = []
        self.outputs: list[Generation] = []

    def sample(self, request: GenerationRequest) -> Generation:
        ids = []
        while len(ids) < request.max_tokens:
            if self.rng.random() < self.p_stop:
                ids.append(self.stop_id)
                break
            ids.append(self.rng.choice(self.vocab))
        reason = FinishReason.STOP if ids[-1] == self.stop_id else FinishReason.LENGTH
        return Generation(ids, [-self.rng.random() * 5 for _ in ids], reason)

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        out = []
        for r in requests:
            g = self.sample(r)
            self.requests.append(r)
            self.outputs.append(g)
            out.append(resolved(g))
        return out


class SpyGenerator:
    """Wraps a real generator and records every request and result (for token-exactness checks)."""

    def __init__(self, inner) -> None:
        self.inner, self.continuous = inner, inner.continuous
        self.requests: list[GenerationRequest] = []
        self.outputs: list[Generation] = []
        self.waves: list[int] = []

    @property
    def context_limit(self):
        return getattr(self.inner, "context_limit", None)

    def submit(self, requests):
        futures = self.inner.submit(requests)
        self.waves.append(len(requests))
        self.requests += requests
        self.outputs += [f.result() for f in futures]
        return futures


def assert_token_exact(rollouts, requests, outputs) -> int:
    """Every turn k of every rollout was sampled from exactly prompt_ids + completion_ids[:offset_k].

    Also: the sampled ids and logprobs sit verbatim in the completion with env_mask 1, env text has
    env_mask 0 and logprob 0.0, and no request was sent that is not a recorded turn. Returns the turn count.
    """
    by_prompt = defaultdict(list)
    for request, output in zip(requests, outputs, strict=True):
        by_prompt[tuple(request.prompt_ids)].append(output)
    turns = 0
    for r in rollouts:
        assert len(r.completion_ids) == len(r.logprobs) == len(r.env_mask)
        if r.info.get("placeholder"):
            assert r.env_mask == [0] and not r.turns
            continue
        offset = 0
        for k, turn in enumerate(r.turns):
            candidates = by_prompt[tuple(r.prompt_ids + r.completion_ids[:offset])]
            n = turn.num_model_tokens
            sampled = (r.completion_ids[offset : offset + n], r.logprobs[offset : offset + n])
            match = [o for o in candidates if (o.token_ids, o.logprobs) == sampled]
            assert match, f"turn {k} of seed {r.seed!r}: no request equals prompt_ids + completion_ids[:{offset}]"
            output = match[0]
            candidates.remove(output)
            assert r.env_mask[offset : offset + n] == [1] * n
            env = slice(offset + n, offset + n + turn.num_env_tokens)
            assert r.env_mask[env] == [0] * turn.num_env_tokens
            assert r.logprobs[env] == [0.0] * turn.num_env_tokens
            offset += n + turn.num_env_tokens
            turns += 1
        assert offset == len(r.completion_ids), f"seed {r.seed!r}: completion has tokens no turn accounts for"
    assert sum(len(v) for v in by_prompt.values()) == 0, "a request was sent that no rollout records"
    return turns


class CrashEnv:
    """Misbehaves as its seed says (ok, raise, segv, exit, hang, write, memory), for the isolation tests."""

    def __init__(self) -> None:
        self.reward, self.alive, self.mode = 0.0, True, "ok"

    def reset(self, seed):
        import os

        self.mode = seed
        if seed == "exit":
            os._exit(3)
        if seed == "write":
            with open("save.txt", "w") as f:
                f.write("model-chosen file")
            return self, os.getcwd()
        return self, f"mode {seed}, pid {os.getpid()}"

    def step(self, action):
        import os
        import signal
        import time

        if self.mode == "raise":
            raise ValueError("boom in step")
        if self.mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.mode == "hang":
            time.sleep(120)
        if self.mode == "memory":
            self.hog = bytearray(2**33)
        self.reward, self.alive = 1.0, False
        return self, "done"


class InfoEnv:
    """Reports env-side facts in ``info`` after each call (a game-over reason, a flag, a count)."""

    def __init__(self) -> None:
        self.reward, self.alive, self.info, self.moves = 0.0, True, {}, 0

    def reset(self, seed):
        self.info = {"phase": "start", "bad": object()} if seed == "odd" else {"phase": "start"}
        if seed == "broken":
            self.info = ["not", "a", "dict"]
        return self, "go"

    def step(self, action):
        self.moves += 1
        self.alive = self.moves < 2
        self.info = {"phase": "over" if not self.alive else "play", "moves": self.moves, "won": not self.alive}
        return self, "next"


class ReplyGenerator:
    """Answers each request with ``reply(prompt_text)`` (the model's turn, stop token included), tokenised."""

    continuous = False

    def __init__(self, tokenizer, reply) -> None:
        self.tokenizer, self.reply = tokenizer, reply
        self.requests: list[GenerationRequest] = []
        self.outputs: list[Generation] = []

    def submit(self, requests):
        out = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
            ids = self.tokenizer.encode(self.reply(prompt), add_special_tokens=False)[: request.max_tokens]
            generation = Generation(ids, [-0.5] * len(ids), FinishReason.STOP)
            self.requests.append(request)
            self.outputs.append(generation)
            out.append(resolved(generation))
        return out


def train_grpo(tmp_path, model, tokenizer, rollout_func, prompts, *, batch=8, max_completion_length=256, steps=2):
    """A real GRPOTrainer run on CPU (float32, ``steps`` optimizer steps, groups of 4); returns its log history.

    Every loss it logs must be finite.
    """

    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=batch, num_generations=4,
                      max_completion_length=max_completion_length, max_steps=steps, logging_steps=1, report_to=[],
                      save_strategy="no", use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = trl.GRPOTrainer(model=model, reward_funcs=env_reward, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": list(prompts)}),
                          rollout_func=rollout_func)  # fmt: skip
    trainer.train()
    history = trainer.state.log_history
    assert all(math.isfinite(h["loss"]) for h in history if "loss" in h)
    return history


def grpo_config(tmp_path, **overrides):
    args = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    args.update(overrides)
    return GRPOConfig(**args)


SCRIPT = Path(__file__).parent / "scripts" / "dist_grpo.py"


NO_TORCHRUN = shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists()


def run_two_processes(tmp_path, *args: str) -> dict:
    out = tmp_path / "log.json"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(SCRIPT), str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


REPO = Path(__file__).resolve().parent.parent


BENCH = REPO / "benchmarks"


def run_quick(script: str, out: Path, *args: str, timeout: float = 120) -> str:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    stem = script.removesuffix(".py")
    assert "|---|" in proc.stdout, proc.stdout  # a markdown table
    assert (out / f"{stem}.png").stat().st_size > 10_000
    json.loads((out / f"{stem}.json").read_text())
    return proc.stdout


FAST_TEMPLATES = frozenset({"qwen3", "llama3", "gemma3", "gptoss"})
"""The official templates a sweep over every TRL template keeps in the fast tier (``-m "not slow"``); the rest of
the sweep is ``slow`` (the whole suite and CI run every template)."""


def sweep(cases, template_of, ids=None):
    """``cases`` as pytest params, each marked ``slow`` unless ``template_of(case)`` is in ``FAST_TEMPLATES``."""
    import pytest

    ids = ids or [None] * len(cases)
    return [
        pytest.param(
            *(c if isinstance(c, tuple) else (c,)),
            id=i,
            marks=() if template_of(c) in FAST_TEMPLATES else pytest.mark.slow,
        )
        for c, i in zip(cases, ids, strict=True)
    ]
