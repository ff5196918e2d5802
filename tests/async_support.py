"""The async worker's test drivers (make_worker, consume, Recorder, ...) shared by the async, credit, history, agents
and self-play tests (moved from test_async_grpo.py, test_credit_async.py and test_history_async.py, unchanged)."""

from __future__ import annotations

import dataclasses
import json
import math
import queue
import threading
import time
from concurrent.futures import Future

import numpy as np
from helpers import ScriptedEnv, ScriptedGenerator
from history_support import NumberedTalkEnv, ReplyGenerator, thinking_tokenizer, thinks_by_episode

from trl_env import ChatMLProcessor
from trl_env.backends.base import resolved
from trl_env.backends.vllm_server import parse_completion
from trl_env.render.processors import from_tokenizer
from trl_env.train.async_grpo import TrlEnvRolloutWorker

IM_END = "<|im_end|>"


def vocab_of(tokenizer):
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


class PolicyGenerator:
    """A scripted generator that names its policy like vLLM does: ``policy = self.model`` read at submit.

    ``delay``: seconds before each answer (on a timer thread), so turns are in flight across version changes.
    ``log``: every (request, generation) it answered.
    """

    continuous = True

    def __init__(self, tokenizer, *, seed=0, p_stop=0.3, delay=0.0, named=True, nan_every=0) -> None:
        self.inner = ScriptedGenerator(vocab_of(tokenizer), tokenizer.convert_tokens_to_ids(IM_END), seed=seed,
                                       p_stop=p_stop, continuous=True)  # fmt: skip
        self.delay, self.named, self.nan_every = delay, named, nan_every
        self.model = "base"
        self.log: list = []
        self.submitted_at: dict = {}
        self.lock = threading.Lock()

    @property
    def context_limit(self):
        return 1024

    def submit(self, requests):
        model = self.model
        futures = []
        for request in requests:
            with self.lock:
                generation = self.inner.sample(request)
                if self.nan_every and len(self.log) % self.nan_every == 0:  # a logprob the server did not give
                    generation = dataclasses.replace(generation, logprobs=[*generation.logprobs[:-1], math.nan])
                if self.named:
                    generation = dataclasses.replace(generation, policy=model)
                self.log.append((request, generation))
                self.submitted_at[id(generation)] = time.monotonic()
            if self.delay:
                future = Future()
                threading.Timer(self.delay, future.set_result, (generation,)).start()
                futures.append(future)
            else:
                futures.append(resolved(generation))
        return futures


def scripted_seeds(n=6, turns=3):
    return [json.dumps({"n": turns, "deltas": [f"level {i}", " again", "\nnext"]}) for i in range(n)]


def make_worker(tokenizer, env=ScriptedEnv, gen=None, seeds=None, **kwargs):
    defaults = dict(num_generations=4, max_staleness=1, max_inflight_groups=2, max_turns=3, max_new_tokens=6,
                    parse_truncated_turns=True, max_completion_length=96)  # fmt: skip
    return TrlEnvRolloutWorker(env, ChatMLProcessor(), tokenizer, gen or PolicyGenerator(tokenizer),
                               seeds or scripted_seeds(), **(defaults | kwargs))  # fmt: skip


def consume(worker, *, steps, batch, max_staleness, bump=1, stale_after_s=30.0, poll_s=0.5, bumps=None, train_s=0.0):
    """The trainer's side: cold sync, start, then per step a batch (dropping stale samples) and a version sync.

    Returns (batches, dropped, metrics, leftovers): every batch as (version at read, sample) pairs, the
    samples the consumer dropped as stale, every metric dict drained, and what was left in the buffer.
    """
    version = 1
    if bumps is not None:
        bumps.append((time.monotonic(), version))
    worker.update_model_version(version)  # the trainer's cold sync happens before start()
    worker.start()
    batches, dropped, metrics = [], 0, []
    try:
        for _ in range(steps):
            b = []
            while len(b) < batch:
                try:
                    sample = worker.rollout_buffer.get(timeout=poll_s)
                except queue.Empty:
                    worker.check_health(stale_after_s)  # must raise on a dead or hung worker
                    continue
                if version - sample.model_version > max_staleness:
                    dropped += 1
                    continue
                b.append((version, sample))
            batches.append(b)
            time.sleep(train_s)  # "training"
            version += bump  # "weight sync"
            if bumps is not None:
                bumps.append((time.monotonic(), version))  # noted before the worker hears of it
            worker.update_model_version(version)
            while True:
                try:
                    metrics.append(worker.metrics_queue.get_nowait())
                except queue.Empty:
                    break
    finally:
        worker.stop()
    leftovers = []
    while True:
        try:
            leftovers.append(worker.rollout_buffer.get_nowait())
        except queue.Empty:
            break
    while True:
        try:
            metrics.append(worker.metrics_queue.get_nowait())
        except queue.Empty:
            break
    return batches, dropped, metrics, leftovers


def turn_runs(sample):
    """(start, end) of each run of trained positions."""
    mask = sample.completion_mask.tolist()
    runs, start = [], None
    for p, m in enumerate(mask + [0]):
        if m and start is None:
            start = p
        elif not m and start is not None:
            runs.append((start, p))
            start = None
    return runs


def check_row(sample, answered):
    """The row is exact: each trained run is one answered request's output, sampled from the row's prefix.

    ``answered``: {prompt ids tuple: [(token ids, logprobs, policy), ...]}. Returns the runs' policies.
    """
    ids, mask, lp = sample.input_ids, sample.completion_mask, sample.old_log_probs
    assert ids.dtype == np.int64 and mask.dtype == np.int64 and lp.dtype == np.float32
    assert ids.ndim == mask.ndim == lp.ndim == 1 and len(ids) == len(mask) == len(lp)
    assert mask[0] == 0 and mask[1:].sum() > 0 and set(np.unique(mask)) <= {0, 1}
    assert (lp[mask == 0] == 0).all() and np.isfinite(lp).all()
    policies = []
    for start, end in turn_runs(sample):
        outputs = answered[tuple(ids[:start].tolist())]
        match = [o for o in outputs if list(o[0]) == ids[start:end].tolist()
                 and np.array_equal(lp[start:end], np.asarray(o[1], dtype=np.float32))]  # fmt: skip
        assert match, f"trained run {start}:{end} is no answer (ids and logprobs) to a request for the row's prefix"
        policies.append(match[0][2])
    return policies


def answered_by(gen):
    answered: dict = {}
    with gen.lock:
        for request, generation in gen.log:
            answered.setdefault(tuple(request.prompt_ids), []).append(
                (generation.token_ids, generation.logprobs, generation.policy)
            )
    return answered


class Recorder:
    """A `post` that goes to the real server and keeps every completion request: (sent, answered, body, answer)."""

    def __init__(self) -> None:
        self.calls: list = []
        self.lock = threading.Lock()

    def __call__(self, url, json, timeout):
        import requests

        sent = time.time()
        response = requests.post(url, json=json, timeout=timeout)
        if url.endswith("/v1/completions") and response.status_code == 200:
            with self.lock:
                self.calls.append((sent, time.time(), json, response.json()))
        return response

    def answered(self):
        """{prompt ids: [(token ids, logprobs, adapter name), ...]} and each request's (sent, answered, prompt)."""
        answered, requests_ = {}, []
        for sent, done, body, answer in self.calls:
            prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
            assert len(answer["choices"]) == len(prompts)  # a batched request: one choice per prompt, in order
            for prompt, choice in zip(prompts, sorted(answer["choices"], key=lambda c: c["index"]), strict=True):
                out = parse_completion({"choices": [choice]}, url="recorded", max_tokens=body["max_tokens"])
                answered.setdefault(tuple(prompt), []).append((out.token_ids, out.logprobs, body["model"]))
                requests_.append((sent, done, prompt))
        return answered, requests_


def lora_async_trainer(server, tokenizer, worker, seeds, output_dir, *, steps, max_staleness=1, **kwargs):
    """A real ``AsyncGRPOTrainer`` on ``server``'s tiny model: a LoRA adapter synced to the vLLM server over HTTP,
    groups of 4, batches of 8, ``steps`` optimizer steps, pulling from ``worker`` (``kwargs``: more trainer args)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    args = AsyncGRPOConfig(output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=8,
                           num_generations=4, token_budget=0, bf16=False, gradient_checkpointing=False,
                           report_to=[], logging_steps=1, save_strategy="no", max_staleness=max_staleness,
                           learning_rate=5e-2, vllm_server_base_url=server.base_url, temperature=1.0,
                           heartbeat_stale_after_s=120)  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return AsyncGRPOTrainer(model=server.model_dir, args=args, processing_class=tokenizer, rollout_worker=worker,
                            train_dataset=Dataset.from_dict({"prompt": seeds}), peft_config=lora, **kwargs)  # fmt: skip


def reduce_metrics(metrics):
    """Reduce drained metrics with TRL's own reduction (shape per key must not change)."""
    from collections import defaultdict

    from trl.experimental.async_grpo.async_grpo_trainer import _reduce_metric

    by_key = defaultdict(list)
    for item in metrics:
        for key, value in item.items():
            by_key[key].append(value)
    for key, values in by_key.items():
        assert len({isinstance(v, tuple) for v in values}) == 1, f"{key} changes shape"
        assert all(isinstance(v, tuple) or isinstance(v, float) for v in values), key
    valid = {key: [v for v in values if isinstance(v, tuple) or not math.isnan(v)] for key, values in by_key.items()}
    return {key: _reduce_metric(key, values) for key, values in valid.items() if values}


def record_pushes(worker):
    """Every episode's samples as the worker handed them to its buffer, by group: {group_id: [[sample, ...], ...]}."""
    pushed: dict = {}
    push = worker._push

    def recorded(episodes):
        for samples in episodes:
            pushed.setdefault(samples[0].group_id, []).append(samples)
        return push(episodes)

    worker._push = recorded
    return pushed


def deployed_worker(tokenizer, history, **kwargs):
    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
    groups: list = []
    defaults = dict(num_generations=4, max_staleness=1, max_inflight_groups=2, max_turns=3,
                    max_completion_length=128, buffer_size=8, lora_name=None, history=history,
                    on_group=lambda record, rollouts: groups.append((record, rollouts)))  # fmt: skip
    worker = TrlEnvRolloutWorker(NumberedTalkEnv, processor, tok, gen, ["1", "2", "3"], **(defaults | kwargs))
    return worker, groups


THINK_END_BIAS = 5.0
"""Logit bias on ``</think>``: the random tiny model writes it about once in 1,000 tokens unbiased, about 12% of
tokens with +5, so Qwen 3's template drops earlier reasoning and deployed episodes split."""
