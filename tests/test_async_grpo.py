"""trl-env as the rollout worker of TRL's AsyncGRPOTrainer (trl_env.train.async_grpo).

Unit tests drive the worker with the trainer's consumer semantics (``consume``: the memo's minimal loop, the
same get / staleness / version-sync order as ``RolloutQueueDataset``) and scripted generators; one test runs
the real ``AsyncGRPOTrainer`` on CPU with a scripted generator; the end-to-end test runs it against a REAL
vLLM CPU server with LoRA sync (skipped without ``.venv-vllm``, see tests/vllm_server.py).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
from async_support import (
    PolicyGenerator,
    Recorder,
    answered_by,
    check_row,
    consume,
    lora_async_trainer,
    make_worker,
    reduce_metrics,
    scripted_seeds,
    turn_runs,
)
from helpers import ScriptedEnv
from vllm_server import make_vllm_server_fixture

from trl_env import ChatMLProcessor, ConfigError, EnvError
from trl_env.train.async_grpo import TrlEnvRolloutWorker, group_advantages, patch_for_cpu

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ------------------------------------------------------------------------------------------ stand-ins


class HungGenerator:
    """Never answers (a server that hangs): only ``stop()`` can end its episodes."""

    continuous = True

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, requests):
        self.submitted += len(requests)
        return [Future() for _ in requests]


class RewardEnv:
    """One step; reward 10 + len(action). Every 4th instance takes a second step that raises (a failed episode)."""

    count = itertools.count()

    def __init__(self) -> None:
        self.reward, self.alive, self.steps = 0.0, True, 0
        self.fails = next(RewardEnv.count) % 4 == 3

    def reset(self, seed):
        return self, f"Say something long (seed {seed})."

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            raise ValueError("boom in step 2")
        self.reward = 10.0 + len(action)
        self.alive = self.fails
        return self, "again" if self.fails else "done"


class CoinEnv:
    """Lives until an action of even length (so some episodes hit max_turns); reward = 1 + the action's length."""

    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        return self, "flip"

    def step(self, action):
        self.reward = 1.0 + len(action)
        self.alive = len(action) % 2 == 1
        return self, "again"


class HangEnv:
    """Hangs in ``step`` until ``release`` is set (a stuck env call)."""

    release = threading.Event()

    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        return self, "go"

    def step(self, action):
        HangEnv.release.wait(60)
        self.reward, self.alive = 1.0, False
        return self, "done"


class RaiseEnv:
    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        return self, "go"

    def step(self, action):
        raise ValueError("env crashed")


FATES = ("pushed", "dropped_stale", "failed", "untrainable", "truncated_masked", "dropped_unscored", "stopped")


def assert_counts_add_up(worker, *, read, left):
    """Every episode has exactly one fate in ``worker.counts``; every pushed row was ``read``, evicted or ``left``."""
    counts = dict(worker.counts)
    assert counts["episodes"] == sum(counts.get(k, 0) for k in FATES), counts
    assert counts["groups"] == len(worker.groups)
    assert counts.get("pushed", 0) == read + counts.get("evicted", 0) + left, counts


# ----------------------------------------------------------------------------------------- unit tests


def test_group_advantages_are_the_one_rule_over_scored_members():
    rewards = [1.0, None, 3.0, 2.0, float("nan")]
    scored = np.array([1.0, 3.0, 2.0])
    expected = (scored - scored.mean()) / (scored.std(ddof=1) + 1e-4)  # TRL GRPOTrainer's rule, under every trainer
    got = group_advantages(rewards)
    assert got[1] is None and got[4] is None
    assert np.allclose([got[0], got[2], got[3]], expected, rtol=0, atol=1e-12)
    assert group_advantages(rewards, "none")[0] == pytest.approx(1.0 - 2.0)
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([5.0, 5.0]) == [0.0, 0.0]


def test_samples_are_exact_rows_with_trl_fields(tokenizer):
    gen = PolicyGenerator(tokenizer)
    worker = make_worker(tokenizer, gen=gen, lora_name="trl-policy")
    batches, dropped, metrics, leftovers = consume(worker, steps=3, batch=8, max_staleness=1)
    samples = [s for b in batches for _, s in b] + leftovers
    assert len(samples) >= 24 and dropped == 0
    answered = answered_by(gen)
    by_group: dict = {}
    for s in samples:
        policies = check_row(s, answered)
        assert len(policies) >= 2  # multi-turn rows: every turn is in the row
        assert s.model_version == min(int(p.rsplit("-v", 1)[1]) for p in policies)
        assert isinstance(s.advantage, float) and isinstance(s.group_id, int)
        assert s.enqueued_at is not None and s.prompt[0]["role"] == "user"
        assert s.completion[0]["role"] == "assistant"
        assert all(isinstance(v, float) for v in s.metrics.values())
        by_group.setdefault(s.group_id, []).append(s)
    for group in by_group.values():  # a group shares its prompt (one seed, num_generations fresh envs)
        first = group[0]
        n = int(np.argmax(first.completion_mask))  # the prompt ends where the first trained run starts
        assert all(s.input_ids[:n].tolist() == first.input_ids[:n].tolist() for s in group)
    reduced = reduce_metrics(metrics)
    assert reduced["rollout/failed_frac"] == 0.0
    assert reduced["rollout/pushed_total"] >= 24
    assert reduced["env/turns_mean"] >= 2 and "env/ending_max_turns_rate" in reduced
    assert reduced["rollout/version_span_max"] >= 0


def test_advantages_exclude_failed_episodes_which_are_counted_not_pushed(tokenizer):
    worker = make_worker(tokenizer, env=RewardEnv, seeds=["a", "b", "c"], max_turns=2, num_generations=4,
                         max_staleness=100)  # fmt: skip
    batches, dropped, metrics, leftovers = consume(worker, steps=4, batch=6, max_staleness=100)
    samples = [s for b in batches for _, s in b] + leftovers
    records = {r.group_id: r for r in worker.groups}
    checked = 0
    for group_id, record in records.items():
        if not record.complete:
            continue  # cut short by stop()
        group = [s for s in samples if s.group_id == group_id]
        failed = record.endings.count("error")
        assert record.pushed == 4 - failed  # failed episodes are never pushed
        if len(group) != record.pushed:
            continue  # partly consumed when the run stopped
        rewards = np.array([s.metrics["reward"] for s in group])
        assert (rewards >= 10).all()
        expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)
        assert np.allclose([s.advantage for s in group], expected, rtol=0, atol=1e-9)
        assert all(s.metrics["reward_std"] == pytest.approx(rewards.std()) for s in group)
        checked += 1
    assert checked >= 3
    scored = [r for r in records.values() if r.stopped < len(r.endings)]  # a group stopped unscored: all stopped
    assert worker.counts["failed"] > 0 and worker.counts["failed"] == sum(r.endings.count("error") for r in scored)
    assert_counts_add_up(worker, read=sum(map(len, batches)) + dropped, left=len(leftovers))
    reduced = reduce_metrics(metrics)
    assert reduced["rollout/failed_frac"] == pytest.approx(worker.counts["failed"] / reduced["rollout/episodes_total"])
    assert reduced["env/error_env_exception_rate"] > 0


def test_first_turn_cut_episodes_are_scored_and_turnless_ones_are_unscored(tokenizer):
    # Every turn is cut by max_new_tokens and not given to the env: scored with the reward after reset (0.0).
    gen = PolicyGenerator(tokenizer, p_stop=0.0)
    worker = make_worker(tokenizer, gen=gen, parse_truncated_turns=False, max_new_tokens=4)
    batches, _, _, _ = consume(worker, steps=1, batch=8, max_staleness=1)
    assert all(s.advantage == 0.0 and s.metrics["reward"] == 0.0 for _, s in batches[0])
    assert worker.counts["unscored"] == 0

    # An episode over at reset has no model turn, so no reward: unscored, and no row whatever `unscored` says.
    for unscored, fate in (("zero", "untrainable"), ("drop", "dropped_unscored")):
        over = make_worker(tokenizer, seeds=[json.dumps({"n": 0, "deltas": ["over before it starts"]})],
                           unscored=unscored)  # fmt: skip
        over.update_model_version(1)
        over.start()
        deadline = time.monotonic() + 20
        while over.counts["groups"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        over.stop()
        counts = over.counts
        assert counts["groups"] >= 3 and counts["pushed"] == 0 and over.rollout_buffer.empty()
        assert counts["unscored"] == counts[fate] == counts["episodes"] - counts["stopped"] > 0, dict(counts)
        assert_counts_add_up(over, read=0, left=0)


def test_rows_without_a_trained_token_or_with_a_nan_logprob_are_never_pushed(tokenizer):
    groups = []
    seeds = [json.dumps({"n": 0, "deltas": ["over before it starts"]}), *scripted_seeds(n=2, turns=2)]
    worker = make_worker(tokenizer, gen=PolicyGenerator(tokenizer, nan_every=7), seeds=seeds,
                         on_group=lambda record, rs: groups.append((record, rs)))  # fmt: skip
    batches, dropped, _, leftovers = consume(worker, steps=3, batch=4, max_staleness=1)
    worker.stop()
    samples = [s for b in batches for _, s in b] + leftovers
    assert all(np.isfinite(s.old_log_probs).all() and s.completion_mask.sum() > 0 for s in samples)

    def untrainable(rs):
        return sum(bool(r.info.get("placeholder")) or any(math.isnan(x) for x in r.logprobs) for r in rs)

    # A group with stopped < its size was scored; one stopped whole was not, or had no untrainable episode.
    scored = [(record, rs) for record, rs in groups if record.stopped < len(rs)]
    assert sum(bool(r.info.get("placeholder")) for _, rs in scored for r in rs) >= 4
    assert sum(any(math.isnan(x) for x in r.logprobs) for _, rs in scored for r in rs) >= 1
    assert worker.counts["untrainable"] == sum(untrainable(rs) for _, rs in scored)
    assert all(record.pushed == len(rs) - untrainable(rs) for record, rs in groups if record.complete)
    assert_counts_add_up(worker, read=sum(map(len, batches)) + dropped, left=len(leftovers))


def test_worker_drops_stale_samples_itself_and_tags_the_oldest_turn_version(tokenizer):
    # Turns take 20 ms, versions jump by 2 per step with max_staleness=1: whatever was in flight goes stale.
    gen = PolicyGenerator(tokenizer, delay=0.02)
    worker = make_worker(tokenizer, gen=gen, max_staleness=1, max_inflight_groups=3)
    batches, dropped, metrics, leftovers = consume(worker, steps=6, batch=4, max_staleness=1, bump=2, train_s=0.03)
    assert dropped == 0  # the worker dropped every stale sample before the consumer could see it
    assert worker.counts["dropped_stale"] + worker.counts["evicted"] > 0
    reduced = reduce_metrics(metrics)
    assert reduced["rollout/dropped_stale_total"] == worker.counts["dropped_stale"] + worker.counts["evicted"]
    assert_counts_add_up(worker, read=sum(map(len, batches)) + dropped, left=len(leftovers))
    answered = answered_by(gen)
    for version, s in [pair for b in batches for pair in b]:
        assert version - s.model_version <= 1
        versions = [int(p.rsplit("-v", 1)[1]) for p in check_row(s, answered)]
        assert s.model_version == min(versions)
    spans = [v[1] - v[0] for r in worker.groups for v in r.versions if v is not None]
    assert max(spans) > 0  # some episodes had turns from two policies


def test_no_group_is_started_that_could_not_be_read_within_the_staleness_bound(tokenizer):
    # A slow trainer (8 rows per version) and more group threads than it can use: 6 x 4 rows in flight would run
    # (max_staleness + 1) x 8 = 16 rows ahead at most before the trainer's reads make them stale.
    for max_staleness in (1, 2):
        worker = make_worker(tokenizer, max_staleness=max_staleness, max_inflight_groups=6, buffer_size=8)
        batches, dropped, _, leftovers = consume(worker, steps=5, batch=8, max_staleness=max_staleness, train_s=0.2)
        read = sum(map(len, batches)) + dropped
        assert dropped == 0 and worker.counts["evicted"] == worker.counts["dropped_stale"] == 0, dict(worker.counts)
        # Never more rows started than the trainer reads before they go stale (those left at the end included).
        assert worker.counts["episodes"] <= read + (max_staleness + 1) * 8, dict(worker.counts)
        assert_counts_add_up(worker, read=read, left=len(leftovers))


def test_without_adapter_names_the_version_is_the_one_live_at_the_first_turn(tokenizer):
    gen = PolicyGenerator(tokenizer, delay=0.02, named=False)
    worker = make_worker(tokenizer, gen=gen, lora_name=None, max_inflight_groups=3)
    bumps: list = []
    batches, dropped, _, _ = consume(worker, steps=8, batch=4, max_staleness=1, bumps=bumps, train_s=0.03)
    assert dropped == 0 and gen.model == "base"  # lora_name=None: the requests' model name is left alone

    def version_at(t):  # the newest version announced by time t (an upper bound of what the worker had read)
        return max(v for tb, v in bumps if tb <= t)

    submitted_at = {}  # (prompt ids, sampled ids, float32 logprobs) -> when that turn was submitted
    with gen.lock:
        for request, generation in gen.log:
            key = (tuple(request.prompt_ids), tuple(generation.token_ids), tuple(np.float32(generation.logprobs)))
            submitted_at[key] = gen.submitted_at[id(generation)]
    for version, s in [pair for b in batches for pair in b]:
        start, end = turn_runs(s)[0]  # the episode's first turn
        key = (tuple(s.input_ids[:start].tolist()), tuple(s.input_ids[start:end].tolist()),
               tuple(s.old_log_probs[start:end]))  # fmt: skip
        assert 1 <= s.model_version <= version_at(submitted_at[key]) <= version
    spans = [v[1] - v[0] for r in worker.groups for v in r.versions if v is not None]
    assert max(spans) > 0  # groups ran across a version change (so "first" and "last" differ)


def test_buffer_is_bounded_and_waits_for_the_trainer(tokenizer):
    worker = make_worker(tokenizer, buffer_size=5)  # 2 threads, groups of 4
    worker.update_model_version(1)
    worker.start()
    try:
        deadline, seen = time.monotonic() + 20, (-1, -1)
        while time.monotonic() < deadline:  # until the worker settles: a full buffer, no group finishing
            time.sleep(0.3)
            now = (worker.rollout_buffer.qsize(), worker.counts["groups"])
            if now == seen and now[0] == 5:
                break
            seen = now
        assert worker.rollout_buffer.qsize() == 5
        groups = worker.counts["groups"]
        assert groups <= 4  # 5 rows pushed, then each thread holds at most one finished group
        time.sleep(1.5)
        assert worker.counts["groups"] == groups and worker.rollout_buffer.qsize() == 5  # nothing dispatched
        worker.check_health(stale_after_s=1.0)  # waiting on a full buffer for > 1.5 s is not a hang
    finally:
        worker.stop()


def test_check_health_raises_after_a_worker_crash(tokenizer):
    worker = make_worker(tokenizer, env=RaiseEnv, seeds=["x"], strict=True)  # strict: the env error escapes
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rollout worker failed") as info:
        consume(worker, steps=1, batch=4, max_staleness=1, poll_s=0.2)
    assert time.monotonic() - t0 < 10
    assert isinstance(info.value.__cause__, EnvError)
    assert not any(t.is_alive() for t in worker._threads)


def test_one_failing_thread_stops_the_worker_so_the_trainer_notices(tokenizer):
    calls = itertools.count()

    def on_group(record, rollouts):
        if next(calls) == 0:
            raise RuntimeError("bug in a logging hook")

    worker = make_worker(tokenizer, on_group=on_group, max_inflight_groups=3)
    with pytest.raises(RuntimeError, match="rollout worker failed") as info:
        consume(worker, steps=50, batch=4, max_staleness=1, poll_s=0.2)
    assert "bug in a logging hook" in str(info.value.__cause__)


def test_mask_truncated_keeps_rewards_in_the_statistics_but_does_not_push(tokenizer):
    rollouts = {}
    worker = make_worker(tokenizer, env=CoinEnv, seeds=["a", "b"], mask_truncated=True, max_turns=2,
                         max_staleness=100, on_group=lambda r, rs: rollouts.update({r.group_id: rs}))  # fmt: skip
    batches, _, _, leftovers = consume(worker, steps=3, batch=4, max_staleness=100)
    samples = [s for b in batches for _, s in b] + leftovers
    checked = 0
    for record in worker.groups:
        if not record.complete:
            continue  # cut short by stop()
        rs = rollouts[record.group_id]
        kept = [r for r in rs if not r.truncated]
        assert record.pushed == len(kept)
        group = [s for s in samples if s.group_id == record.group_id]
        if len(group) != record.pushed or not kept or len(kept) == len(rs):
            continue
        rewards = np.array([r.reward for r in rs])  # truncated episodes count in the statistics
        expected = sorted((r.reward - rewards.mean()) / (rewards.std(ddof=1) + 1e-4) for r in kept)
        assert np.allclose(sorted(s.advantage for s in group), expected, rtol=0, atol=1e-9)
        checked += 1
    assert checked >= 1 and worker.counts["truncated_masked"] > 0


def test_check_health_raises_on_a_stalled_heartbeat_and_stop_is_bounded(tokenizer):
    HangEnv.release.clear()
    worker = make_worker(tokenizer, env=HangEnv, seeds=["x"], env_timeout=None, stop_timeout=1.0)
    try:
        worker.update_model_version(1)
        worker.start()
        worker.check_health(stale_after_s=5.0)  # just started: fresh
        deadline, raised = time.monotonic() + 15, None
        while raised is None and time.monotonic() < deadline:  # every env is stuck in step: no more ticks
            time.sleep(0.2)
            try:
                worker.check_health(stale_after_s=0.5)
            except RuntimeError as e:
                raised = e
        assert raised is not None and "heartbeat stale" in str(raised)
        worker.check_health(stale_after_s=60.0)  # the same worker is fine with a longer allowance
        t0 = time.monotonic()
        worker.stop()  # the threads are stuck in env.step: stop gives up after stop_timeout
        assert time.monotonic() - t0 < 3.0
        assert any(t.is_alive() for t in worker._threads)  # still stuck: left as daemons
    finally:
        HangEnv.release.set()
    for thread in worker._threads:
        thread.join(10)
    assert not any(t.is_alive() for t in worker._threads)


def test_stop_ends_groups_waiting_on_a_hung_server_at_once(tokenizer):
    gen = HungGenerator()
    records = []
    worker = make_worker(tokenizer, gen=gen, on_group=lambda record, rollouts: records.append((record, rollouts)))
    worker.update_model_version(1)
    worker.start()
    deadline = time.monotonic() + 10
    while gen.submitted < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    worker.stop()
    assert time.monotonic() - t0 < 3.0
    assert not any(t.is_alive() for t in worker._threads)
    assert len(records) == 2 and all(not record.complete and record.pushed == 0 for record, _ in records)
    assert worker.counts["episodes"] == worker.counts["stopped"] == 8 and all(r.stopped == 4 for r, _ in records)
    assert_counts_add_up(worker, read=0, left=0)
    assert all(r.info.get("error_kind") == "server_error" for _, rollouts in records for r in rollouts)
    assert worker.rollout_buffer.empty()


def test_stop_while_a_finished_group_waits_for_room_counts_its_rows_and_marks_it_incomplete(tokenizer):
    records = []
    worker = make_worker(tokenizer, max_inflight_groups=1, buffer_size=2, max_staleness=100,
                         on_group=lambda record, rollouts: records.append(record))  # fmt: skip
    worker.update_model_version(1)
    worker.start()
    deadline = time.monotonic() + 20
    while worker.rollout_buffer.qsize() < 2 and time.monotonic() < deadline:  # 2 of the group's 4 rows pushed
        time.sleep(0.05)
    time.sleep(0.5)  # the group's thread now waits for room with 2 finished rows
    worker.stop()
    leftovers = [worker.rollout_buffer.get_nowait() for _ in range(2)]
    assert len(records) == 1 and records[0].pushed == 2
    assert not records[0].complete  # stop() cut it short: 2 rows were never pushed
    assert worker.counts["stopped"] == 2 and worker.counts["episodes"] == 4
    assert_counts_add_up(worker, read=0, left=len(leftovers))


def test_bad_arguments_fail_at_once(tokenizer):
    gen = PolicyGenerator(tokenizer)
    with pytest.raises(ConfigError, match="num_generations"):
        make_worker(tokenizer, gen=gen, num_generations=0)
    with pytest.raises(ConfigError, match="seeds is empty"):
        TrlEnvRolloutWorker(ScriptedEnv, ChatMLProcessor(), tokenizer, gen, [])
    with pytest.raises(ConfigError, match="scale_rewards"):
        make_worker(tokenizer, gen=gen, scale_rewards="batch")
    with pytest.raises(ConfigError, match="unknown option"):
        make_worker(tokenizer, gen=gen, max_turn=3)
    with pytest.raises(ConfigError, match="generator"):
        make_worker(tokenizer, gen=gen, base_url="http://x")
    worker = make_worker(tokenizer, gen=gen)
    worker.update_model_version(1)
    worker.start()
    with pytest.raises(RuntimeError, match="twice"):
        worker.start()
    worker.stop()


def test_from_args_reads_the_trainer_config(tokenizer):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    args = AsyncGRPOConfig(output_dir="unused", per_device_train_batch_size=6, gradient_accumulation_steps=2,
                           num_generations=3, max_staleness=2, max_completion_length=77, bf16=False)  # fmt: skip
    worker = TrlEnvRolloutWorker.from_args(args, ScriptedEnv, ChatMLProcessor(), tokenizer, scripted_seeds(),
                                           generator=PolicyGenerator(tokenizer), max_turns=2)  # fmt: skip
    assert (worker.num_generations, worker.max_staleness, worker.buffer_size) == (3, 2, 12)
    assert worker.budgets.max_completion_tokens == 77 and worker.budgets.max_turns == 2


class NoopTransfer:
    """A weight transfer that moves nothing (the trainer's syncs only bump its version)."""

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, iterator):
        for _ in iterator:
            pass

    def resume(self):
        pass

    def destroy(self):
        pass


def test_async_grpo_trainer_trains_on_the_workers_samples_on_cpu(tokenizer, tmp_path):
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trl_env.testing import save_tiny_model

    patch_for_cpu()
    model_dir = save_tiny_model(tmp_path / "tiny")
    gen = PolicyGenerator(tokenizer)
    seeds = scripted_seeds()
    worker = make_worker(tokenizer, gen=gen, seeds=seeds, lora_name=None)
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8,
                           num_generations=4, token_budget=0, bf16=False, gradient_checkpointing=False,
                           report_to=[], logging_steps=1, save_strategy="no", max_staleness=1)  # fmt: skip
    trainer = AsyncGRPOTrainer(model=model_dir, args=args, processing_class=tokenizer, rollout_worker=worker,
                               train_dataset=Dataset.from_dict({"prompt": seeds}),
                               weight_transfer=NoopTransfer())  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == 2 and len(logs) == 2
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["sample/staleness_max"] <= 1 for h in logs) and "sample/dropped_stale_total" not in logs[-1]
    assert "rollout/failed_frac" in logs[0] and "env/turns_mean" in logs[0]  # the worker's metrics reached log()
    assert not any(t.is_alive() for t in worker._threads)  # the trainer stopped the worker


# ------------------------------------------------------------------- end to end: real trainer + vLLM + LoRA

# max_staleness=1 needs --max-loras >= 3 (the trainer refuses fewer): a server of this module's own.
vllm_async_server = make_vllm_server_fixture(name="vllm_async_server", scope="module", extra_args=["--max-loras", "3"])


class StepClock:
    """When each optimizer step's forward/backward began and its optimizer step ended (a TrainerCallback)."""

    def __init__(self) -> None:
        self.begin: list[float] = []
        self.optimizer: list[float] = []

    def __getattr__(self, name):  # every other TrainerCallback event is a no-op
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin.append(time.time())

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer.append(time.time())


def test_async_grpo_with_vllm_lora_sync_trains_on_token_exact_fresh_samples(vllm_async_server, tmp_path):
    import requests
    from transformers import AutoTokenizer

    from trl_env import VLLMServerGenerator

    patch_for_cpu()
    url, model_dir, max_staleness, steps = vllm_async_server.base_url, vllm_async_server.model_dir, 1, 5
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    recorder = Recorder()
    gen = VLLMServerGenerator(url, post=recorder, temperature=1.0)
    rollouts, seeds = [], scripted_seeds(n=6, turns=3)
    worker = TrlEnvRolloutWorker(ScriptedEnv, ChatMLProcessor(), tokenizer, gen, seeds, num_generations=4,
                                 max_staleness=max_staleness, max_inflight_groups=2, buffer_size=8, max_turns=3,
                                 max_new_tokens=8, parse_truncated_turns=True, max_completion_length=64,
                                 on_group=lambda record, rs: rollouts.extend(rs))  # fmt: skip
    taken = []  # (trainer version when read, sample): what the trainer pulled from the buffer
    get = worker.rollout_buffer.get
    worker.rollout_buffer.get = lambda *a, **k: taken.append((trainer.model_version, s := get(*a, **k))) or s
    clock = StepClock()
    trainer = lora_async_trainer(vllm_async_server, tokenizer, worker, seeds, tmp_path / "out", steps=steps,
                                 max_staleness=max_staleness, callbacks=[clock])  # fmt: skip
    assert trainer._lora_sync and trainer.weight_transfer is None  # the trainer syncs adapters over HTTP
    t0 = time.time()
    trainer.train()
    train_s = time.time() - t0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    print(f"trained {steps} steps in {train_s:.1f} s;", [(h["step"], round(h["ratio"], 4), round(h["kl"], 5),
          h["sample/staleness_max"]) for h in logs])  # fmt: skip
    assert trainer.state.global_step == steps and len(logs) == steps
    assert all(math.isfinite(h["loss"]) for h in logs)
    # Step 1 trains on samples of adapter v1 (= the base model): vLLM's logprobs are the trainer's.
    assert abs(logs[0]["ratio"] - 1) < 1e-3 and abs(logs[0]["kl"]) < 1e-3

    # Staleness: every sample the trainer read was within the bound; the worker dropped the stale ones itself.
    assert len(taken) >= steps * 8
    assert all(version - s.model_version <= max_staleness for version, s in taken)
    assert all(h["sample/staleness_max"] <= max_staleness for h in logs)
    assert not any(h.get("sample/dropped_stale_total") for h in logs)
    assert max(version - s.model_version for version, s in taken) >= 1  # off-policy samples were trained

    # Token-exactness: each trained row's turns are the server's answers to the row's own prefixes, each
    # sampled by the adapter named when the request was sent; model_version is the oldest of them.
    answered, sent = recorder.answered()
    for _, s in taken:
        policies = check_row(s, answered)
        assert len(policies) >= 2 and all(p.startswith("trl-policy-v") for p in policies)
        assert s.model_version == min(int(p.rsplit("-v", 1)[1]) for p in policies)
    assert len({p for outputs in answered.values() for _, _, p in outputs}) >= 3  # the worker followed the syncs
    # ...and every request the server saw asked for a prefix of an episode's row (its prompt, or prompt + turns).
    rows = [r.prompt_ids + r.completion_ids for r in rollouts if not r.info.get("placeholder")]
    prompts = {tuple(r.prompt_ids) for r in rollouts if not r.info.get("placeholder")}
    for _, _, prompt in sent:
        assert tuple(prompt) in prompts or any(row[: len(prompt)] == prompt for row in rows), "not a row prefix"

    # Asynchrony: the server answered turns while the trainer ran forward/backward passes.
    busy = list(zip(clock.begin, clock.optimizer, strict=True))
    overlapping = [sum(begin < done and sent_at < end for sent_at, done, _ in sent) for begin, end in busy]
    print("requests answered during each step's forward/backward:", overlapping)
    assert sum(n > 0 for n in overlapping) >= steps // 2

    reduced = [h for h in trainer.state.log_history if "rollout/failed_frac" in h]
    assert reduced and all(h["rollout/failed_frac"] == 0 for h in reduced) and "env/turns_mean" in reduced[0]
    assert not any(t.is_alive() for t in worker._threads)
    served = {c["id"] for c in requests.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert f"trl-policy-v{steps + 1}" in served and "trl-policy-v1" not in served  # the trainer's unload schedule
