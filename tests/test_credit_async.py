"""``credit=`` on the AsyncGRPOTrainer worker: one ``RolloutSample`` per model turn, each with its turn's advantage.

Unit tests score hand-built rollouts (exact ids, masks and advantages written out by hand), drive the worker with
the scripted generator (``consume`` of test_async_grpo) and with ``history="deployed"`` (test_history_async's
worker), and pack one episode's turn samples with TRL's ``TreeRow``; the end-to-end test runs 2 real
``AsyncGRPOTrainer`` steps against a REAL vLLM CPU server with LoRA sync (skipped without ``.venv-vllm``).
"""

from __future__ import annotations

import itertools
import math
import threading
import time

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
    record_pushes,
    reduce_metrics,
    scripted_seeds,
    turn_runs,
)
from helpers import ScriptedEnv
from vllm_server import make_vllm_server_fixture

from trl_env import ChatMLProcessor, ConfigError
from trl_env.backends.base import FinishReason
from trl_env.rollout import Ending, Rollout
from trl_env.rollout.records import Row, Turn
from trl_env.train.async_grpo import TrlEnvRolloutWorker, patch_for_cpu
from trl_env.train.credit import (
    DiscountedReturns,
    EpisodeAdvantage,
    EpisodeCredit,
    GiGPO,
    get_estimator,
    token_advantages,
)

FATES = ("pushed", "dropped_stale", "failed", "untrainable", "truncated_masked", "dropped_unscored", "stopped")


# ------------------------------------------------------------------------------------- hand-built rollouts


def turn(model, env, reward, anchor):
    """A stepped turn: ``model`` sampled ids, then ``env`` ids; ``env.reward`` after it; its state's anchor."""
    return Turn(text=f"t{model[0]}", reasoning="", action="a", delta="obs" if env else None, reward=reward,
                finish_reason=FinishReason.STOP, num_model_tokens=len(model), num_env_tokens=len(env),
                generation_s=0.0, env_s=0.0, anchor=anchor)  # fmt: skip


def rollout(specs, reward, ending=Ending.ENV_DONE, prompt=(1, 2)):
    """An episode of turns ``specs`` = [(model ids, env ids, env.reward after, anchor)]; logprob of id i: -i/100."""
    completion, logprobs, mask = [], [], []
    for model, env, _, _ in specs:
        completion += model + env
        logprobs += [-i / 100 for i in model] + [0.0] * len(env)
        mask += [1] * len(model) + [0] * len(env)
    turns = tuple(turn(*spec) for spec in specs)
    row = Row.of_turns(list(prompt), completion, logprobs, mask, turns)
    return Rollout(seed="s", rows=(row,), turns=turns, reward=reward, ending=ending)


def group():
    """Variable turn counts (3, 2, 1, 2), a failed episode, an unscored one, anchor states shared and revisited."""
    return [
        rollout([([10, 11], [20], 1.0, "s0"), ([12], [21, 22], 1.0, "s1"), ([13, 14], [], 3.0, "s1")], 3.0),  # A
        rollout([([30], [40, 41], 0.0, "s0"), ([31, 32, 33], [], 1.0, "s1")], 1.0),  # B
        rollout([([90], [91], 5.0, "s0")], None, ending=Ending.ERROR),  # C: failed
        rollout([([50], [], None, "s0")], None),  # D: did not fail, no reward: unscored
        rollout([([60], [70], 0.0, "s0"), ([61], [], 2.0, "s9")], 2.0),  # E
    ]


def score(worker, rollouts):
    """The worker's samples per pushed episode and its metrics for one group (versions: all 1)."""
    return worker._score(7, rollouts, [(1, 1)] * len(rollouts), 1, 1)


def lp(ids):
    return [-i / 100 for i in ids]


def as_tuple(sample):
    return (sample.input_ids.tolist(), sample.completion_mask.tolist(), sample.old_log_probs.tolist(),
            sample.advantage, sample.model_version, sample.group_id)  # fmt: skip


def expected(ids, start, advantage):
    """A turn sample by hand: ``ids``, trained from ``start`` to the end."""
    mask = [0] * start + [1] * (len(ids) - start)
    logprobs = [0.0] * start + lp(ids[start:])
    return ids, mask, np.asarray(logprobs, dtype=np.float32).tolist(), pytest.approx(advantage), 1, 7


# GiGPO(weight=1, gamma=1, scale_rewards="none") by hand, over A (turn rewards 1, 0, 2), B (0, 1) and E (0, 2):
# episode advantages R - mean(3, 1, 2): A +1, B -1, E 0. Returns-to-go: A 3, 2, 2; B 1, 1; E 2, 2.
# Anchor "s0": A0 3, B0 1, E0 2 (mean 2): +1, -1, 0. "s1": A1 2, A2 2 (revisited), B1 1 (mean 5/3): +1/3, +1/3, -2/3.
# "s9": E1 alone: 0. C (failed) and D (unscored) are out of every statistic: with them "s0" would have other means.
A_ADV, B_ADV, E_ADV = [2.0, 4 / 3, 4 / 3], [-2.0, -5 / 3], [0.0, 0.0]


@pytest.mark.parametrize("unscored", ["zero", "drop"])
def test_one_sample_per_turn_with_hand_computed_advantages_and_masks(tokenizer, unscored):
    worker = make_worker(tokenizer, credit=GiGPO(weight=1.0, gamma=1.0, scale_rewards="none"), unscored=unscored)
    episodes, metrics = score(worker, group())
    got = [[as_tuple(s) for s in samples] for samples in episodes]
    a = [1, 2, 10, 11, 20, 12, 21, 22, 13, 14]
    b = [1, 2, 30, 40, 41, 31, 32, 33]
    want = [
        [expected(a[:4], 2, A_ADV[0]), expected(a[:6], 5, A_ADV[1]), expected(a, 8, A_ADV[2])],
        [expected(b[:3], 2, B_ADV[0]), expected(b, 5, B_ADV[1])],
        *([[expected([1, 2, 50], 2, 0.0)]] if unscored == "zero" else []),  # D: advantage 0 on its turn, or dropped
        [expected([1, 2, 60], 2, E_ADV[0]), expected([1, 2, 60, 70, 61], 4, E_ADV[1])],
    ]
    assert got == want
    # Per-episode statistics ride on an episode's last sample only (a mean over samples would weigh turns).
    assert [sorted(s.metrics) for s in episodes[0]] == [[], [], ["env/turns", "reward", "reward_std"]]
    assert episodes[0][-1].metrics["reward"] == 3.0 and episodes[0][-1].metrics["env/turns"] == 3.0
    counts = dict(worker.counts)
    assert counts["failed"] == 1 and counts["unscored"] == 1
    assert counts.get("dropped_unscored", 0) == (unscored == "drop")

    # credit/* of the group: means and fractions as (num, den) over its 7 scored turns, the rest gauges.
    cells = A_ADV + B_ADV + E_ADV
    assert metrics["credit/scored_turns"] == 7.0 and metrics["credit/anchor_groups"] == 2.0  # s0 and s1
    assert metrics["credit/advantage_mean"] == pytest.approx((sum(cells), 7.0))
    assert metrics["credit/advantage_abs_mean"] == pytest.approx((sum(map(abs, cells)), 7.0))
    assert metrics["credit/anchored_turn_frac"] == pytest.approx((6.0, 7.0))
    assert metrics["credit/flip_frac"] == pytest.approx((0.0, 7.0))
    assert metrics["credit/advantage_std"] == pytest.approx(float(np.std(cells)))
    assert metrics["credit/turn0/advantage_mean"] == pytest.approx((2.0 - 2.0 + 0.0, 3.0))
    assert metrics["credit/turn1/advantage_mean"] == pytest.approx((4 / 3 - 5 / 3 + 0.0, 3.0))
    assert metrics["credit/turn2/advantage_mean"] == pytest.approx((4 / 3, 1.0))


def test_episode_credit_is_todays_one_row_per_episode_bit_for_bit(tokenizer):
    default, named = make_worker(tokenizer), make_worker(tokenizer, credit="episode")
    (today, today_metrics), (got, got_metrics) = score(default, group()), score(named, group())
    assert [[as_tuple(s) + (s.metrics, s.completion) for s in e] for e in got] == [
        [as_tuple(s) + (s.metrics, s.completion) for s in e] for e in today
    ]
    assert got_metrics == today_metrics and not any(k.startswith("credit/") for k in got_metrics)
    # ...which is one sample per episode: the whole row, every model token trained, the episode's group advantage.
    std = float(np.std([3.0, 1.0, 2.0], ddof=1))  # the one rule (trl_env.train.advantages): Bessel, eps 1e-4
    ids = [[1, 2, 10, 11, 20, 12, 21, 22, 13, 14], [1, 2, 30, 40, 41, 31, 32, 33], [1, 2, 50], [1, 2, 60, 70, 61]]
    masks = [[0, 0, 1, 1, 0, 1, 0, 0, 1, 1], [0, 0, 1, 0, 0, 1, 1, 1], [0, 0, 1], [0, 0, 1, 0, 1]]
    advantages = [1 / (std + 1e-4), -1 / (std + 1e-4), 0.0, 0.0]  # D (unscored): 0, as TRL
    assert [len(e) for e in got] == [1, 1, 1, 1]
    for [s], i, m, adv in zip(got, ids, masks, advantages, strict=True):
        assert s.input_ids.tolist() == i and s.completion_mask.tolist() == m
        assert s.advantage == pytest.approx(adv, abs=1e-12)
    # An EpisodeAdvantage instance goes the per-turn way: each turn gets its episode's advantage, the same numbers.
    per_turn, _ = score(make_worker(tokenizer, credit=EpisodeAdvantage()), group())
    assert [[s.advantage for s in e] for e in per_turn] == [
        [pytest.approx(advantages[0])] * 3, [pytest.approx(advantages[1])] * 2, [0.0], [0.0, 0.0]]  # fmt: skip


def test_bad_credit_fails_at_construction_and_names_build_with_the_workers_scale_rewards(tokenizer):
    for bad in ("gipgo", 3, ["gigpo"], None):
        with pytest.raises(ConfigError, match=r"credit=.*CreditEstimator"):
            make_worker(tokenizer, credit=bad)
    assert make_worker(tokenizer, credit="gigpo").estimator == GiGPO(scale_rewards="group")
    assert make_worker(tokenizer, credit="discounted", scale_rewards="none").estimator == DiscountedReturns(
        scale_rewards="none")  # fmt: skip
    assert make_worker(tokenizer).estimator is None and make_worker(tokenizer, credit="episode").estimator is None

    def custom(g):
        return [None if e.failed else [1.0] * len(e.turn_rewards) for e in g]

    assert make_worker(tokenizer, credit=custom).estimator is custom
    from trl.experimental.async_grpo import AsyncGRPOConfig

    args = AsyncGRPOConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, bf16=False)
    worker = TrlEnvRolloutWorker.from_args(args, ScriptedEnv, ChatMLProcessor(), tokenizer, scripted_seeds(),
                                           generator=PolicyGenerator(tokenizer), credit="per_turn_index")  # fmt: skip
    assert worker.credit == "per_turn_index" and worker.estimator == get_estimator("per_turn_index")
    # An estimator that does not give one advantage per turn is a bug in it: said, with the numbers.
    with pytest.raises(ConfigError, match="2 advantages for 3 turns"):
        score(make_worker(tokenizer, credit=lambda g: [None if e.failed else [0.0, 0.0] for e in g]), group())


def test_trie_packing_forwards_an_episodes_turn_samples_once_plus_one_token_per_fork(tokenizer):
    from trl.experimental.async_grpo.packing import TreeRow

    worker = make_worker(tokenizer, credit=GiGPO(weight=1.0, gamma=1.0, scale_rewards="none"))
    episodes, _ = score(worker, group())
    a = group()[0]
    row = TreeRow()
    for s in episodes[0]:
        row.add({"input_ids": s.input_ids, "completion_mask": s.completion_mask, "old_log_probs": s.old_log_probs,
                 "advantage": s.advantage, "group_id": s.group_id})  # fmt: skip
    full = len(a.prompt_ids) + len(a.completion_ids)
    assert len(row.tokens) == full + len(episodes[0]) - 1  # the shared prefix once; a sample's end forks one token
    packed = row.pack()
    assert int(packed["token_index"].numel()) == sum(a.env_mask)  # every model token trained exactly once
    per_token = [x for x, m in zip(token_advantages(a, A_ADV)[0], a.env_mask, strict=True) if m]
    assert packed["advantages"].tolist() == pytest.approx(per_token)  # the turn advantages, token by token


# ------------------------------------------------------------------------ the worker, scripted generator


def episode_of(samples, rollouts):
    """The index of the episode whose rows hold ``samples``: each a row's prompt and a prefix of its completion.

    Episodes with the very same tokens are interchangeable here: their turns earned the same and had the same anchors.
    """
    for e, r in enumerate(rollouts):
        rows = [row.prompt_ids + row.completion_ids for row in r.rows]
        if all(any(ids[: len(s.input_ids)] == s.input_ids.tolist() for ids in rows) for s in samples):
            return e
    raise AssertionError("no episode of the group holds these samples")


def check_turn_samples(samples, r):
    """``samples`` are ``r``'s turns, one each, in order: each a row's prompt + its completion up to the end of that
    turn's model tokens, trained on exactly those (the sampler's logprobs), so every model token is trained once."""
    assert len(samples) == len(r.turns)
    it = iter(samples)
    for row in r.rows:
        n, trained = len(row.prompt_ids), []
        for _ in range(row.turns):
            s = next(it)
            ((start, end),) = turn_runs(s)  # one run of trained tokens, and the sample ends with it
            assert end == len(s.input_ids) and s.input_ids.tolist() == row.prompt_ids + row.completion_ids[: end - n]
            assert s.completion_mask.tolist() == [0] * start + [1] * (end - start)
            assert s.old_log_probs.tolist() == pytest.approx([0.0] * start + row.logprobs[start - n : end - n])
            trained += range(start - n, end - n)
        assert trained == [p for p, m in enumerate(row.env_mask) if m]


def checked_episodes(pushed, groups, estimator):
    """Each pushed episode's samples, checked against its rollout (``check_turn_samples``), with that rollout and the
    advantages ``estimator`` gives its turns: (samples, rollout, advantages)."""
    by_group = {record.group_id: rollouts for record, rollouts in groups}
    for g, episodes in pushed.items():
        rollouts = by_group[g]
        advantages = estimator([EpisodeCredit.from_rollout(r) for r in rollouts])
        for samples in episodes:
            e = episode_of(samples, rollouts)
            check_turn_samples(samples, rollouts[e])
            yield samples, rollouts[e], advantages[e]


class CreditEnv:
    """One of five kinds per group of five (instances in order): A, B, E score; C fails; D is over at reset.

    ``info["anchor"]`` names the states: A acts on s0, s1, s1 (a revisit), B on s0, s1, C on s0, s1, E on s0, s9.
    """

    count = itertools.count()
    lock = threading.Lock()
    KINDS = {  # env.reward after each step, and the anchor after it
        "A": [(2.0, "s1"), (0.0, "s1"), (3.0, None)],
        "B": [(0.0, "s1"), (1.0, None)],
        "C": [(5.0, "s1"), None],  # None: the step raises
        "D": [],
        "E": [(0.0, "s9"), (2.0, None)],
    }

    def __init__(self) -> None:
        with CreditEnv.lock:
            self.kind = "ABCDE"[next(CreditEnv.count) % 5]
        self.reward, self.turn, self.info = 0.0, 0, {"anchor": "s0"}
        self.alive = bool(self.KINDS[self.kind])

    def reset(self, seed):
        return self, "play"

    def step(self, action):
        script = self.KINDS[self.kind][self.turn]
        if script is None:
            raise ValueError("boom")
        self.reward, anchor = script
        self.info = {"anchor": anchor}
        self.turn += 1
        self.alive = self.turn < len(self.KINDS[self.kind])
        return self, "ok"


# GiGPO(weight=2, gamma=1, scale_rewards="none") over A (turn rewards 2, -2, 3), B (0, 1), E (0, 2): episode
# advantages A +1, B -1, E 0; returns-to-go A 3, 1, 3; B 1, 1; E 2, 2. "s0": A0 3, B0 1, E0 2 (mean 2): +1, -1, 0.
# "s1": A1 1, A2 3, B1 1 (mean 5/3): -2/3, +4/3, -2/3. "s9": 0. Advantage = episode + 2 x step:
KIND_ADV = {"A": [3.0, -1 / 3, 11 / 3], "B": [-3.0, -7 / 3], "E": [0.0, 0.0]}  # A1's flips against A's +1


def kind_of(r):
    if r.ending is Ending.ERROR:
        return "C"
    return {3: "A", 0: "D"}.get(len(r.turns)) or ("B" if r.reward == 1.0 else "E")


def test_worker_pushes_one_sample_per_turn_token_exact_with_hand_computed_advantages(tokenizer):
    CreditEnv.count = itertools.count()
    groups: list = []
    gen = PolicyGenerator(tokenizer)
    worker = make_worker(tokenizer, env=CreditEnv, gen=gen, seeds=["x"], num_generations=5, max_inflight_groups=1,
                         max_turns=4, max_staleness=100, credit=GiGPO(weight=2.0, gamma=1.0, scale_rewards="none"),
                         on_group=lambda record, rollouts: groups.append((record, rollouts)))  # fmt: skip
    pushed = record_pushes(worker)
    batches, dropped, metrics, leftovers = consume(worker, steps=3, batch=7, max_staleness=100)
    read = [s for b in batches for _, s in b] + leftovers
    assert dropped == 0 and len(read) >= 21
    answered = answered_by(gen)
    assert all(check_row(s, answered) for s in read)  # each trained run is the generator's answer to its prefix
    assert {id(s) for s in read} <= {id(s) for episodes in pushed.values() for samples in episodes for s in samples}
    by_group = {record.group_id: (record, rollouts) for record, rollouts in groups}
    checked = 0
    for g, episodes in pushed.items():
        record, rollouts = by_group[g]
        assert sorted(kind_of(rollouts[episode_of(samples, rollouts)]) for samples in episodes) == ["A", "B", "E"]
        assert record.pushed == 3 or not record.complete  # C failed, D (unscored, no model token) untrainable
        for samples in episodes:
            r = rollouts[episode_of(samples, rollouts)]
            check_turn_samples(samples, r)
            assert [s.advantage for s in samples] == pytest.approx(KIND_ADV[kind_of(r)])
            checked += 1
    assert checked >= 9
    counts = dict(worker.counts)
    assert counts["episodes"] == sum(counts.get(k, 0) for k in FATES), counts
    assert counts["failed"] == counts["untrainable"] == counts["unscored"] == len(pushed), counts
    assert counts["rows"] == len(read) + counts.get("evicted", 0), counts  # rows: the samples pushed
    assert worker._buffer.claimed == 0  # the admission rule's claims settled to the samples really made
    reduced = reduce_metrics(metrics)
    cells = [x for adv in KIND_ADV.values() for x in adv]
    assert reduced["credit/advantage_mean"] == pytest.approx(np.mean(cells))
    assert reduced["credit/advantage_abs_mean"] == pytest.approx(np.mean(np.abs(cells)))
    assert reduced["credit/flip_frac"] == pytest.approx(1 / 7)  # A1
    assert reduced["credit/anchored_turn_frac"] == pytest.approx(6 / 7)  # all but E1 (s9)
    assert reduced["credit/anchor_groups"] == 2.0 and reduced["credit/scored_turns"] == 7.0  # per group
    assert reduced["credit/advantage_std"] == pytest.approx(np.std(cells))
    assert reduced["credit/turn1/advantage_mean"] == pytest.approx((-1 / 3 - 7 / 3 + 0.0) / 3)
    assert reduced["credit/turn2/advantage_mean"] == pytest.approx(11 / 3)
    assert reduced["rollout/rows_pushed_total"] == counts["rows"]


def test_deployed_history_splits_every_row_per_turn(tokenizer):
    from async_support import deployed_worker

    worker, groups = deployed_worker(tokenizer, "deployed", credit="discounted")
    pushed = record_pushes(worker)
    batches, dropped, _, leftovers = consume(worker, steps=4, batch=8, max_staleness=1)
    read = [s for b in batches for _, s in b] + leftovers
    assert dropped == 0 and read
    assert {id(s) for s in read} <= {id(s) for episodes in pushed.values() for samples in episodes for s in samples}
    split = 0
    for samples, rollout, advantages in checked_episodes(pushed, groups, DiscountedReturns(scale_rewards="group")):
        assert [s.advantage for s in samples] == pytest.approx(advantages)  # the worker's scale_rewards
        split += len(rollout.rows) > 1
    assert split > 0  # some episodes had several rows
    counts = dict(worker.counts)
    assert counts["failed"] > 0 and counts["episodes"] == sum(counts.get(k, 0) for k in FATES), counts
    assert counts["rows"] == len(read) + counts.get("evicted", 0) and worker._buffer.claimed == 0, counts


# ------------------------------------------------------------------- end to end: real trainer + vLLM + LoRA

vllm_credit_server = make_vllm_server_fixture(name="vllm_credit_server", scope="module",
                                              extra_args=["--max-loras", "3"])  # fmt: skip


def test_two_real_async_grpo_steps_train_each_turn_with_its_own_advantage(vllm_credit_server, tmp_path, monkeypatch):
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo.packing import TreeRow

    from trl_env import VLLMServerGenerator

    patch_for_cpu()
    url, model_dir, steps = vllm_credit_server.base_url, vllm_credit_server.model_dir, 2
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    recorder = Recorder()
    gen = VLLMServerGenerator(url, post=recorder, temperature=1.0)
    groups, seeds = [], scripted_seeds(n=6, turns=3)
    worker = TrlEnvRolloutWorker(ScriptedEnv, ChatMLProcessor(), tokenizer, gen, seeds, num_generations=4,
                                 max_staleness=1, max_inflight_groups=2, buffer_size=8, max_turns=3,
                                 max_new_tokens=8, parse_truncated_turns=True, max_completion_length=64,
                                 credit="gigpo", on_group=lambda record, rs: groups.append((record, rs)))  # fmt: skip
    pushed = record_pushes(worker)
    taken = []
    get = worker.rollout_buffer.get
    worker.rollout_buffer.get = lambda *a, **k: taken.append(s := get(*a, **k)) or s
    packed = []  # what TRL's packer made of each micro-batch row: (its samples, unique tokens, its loss terms)
    pack = TreeRow.pack
    monkeypatch.setattr(TreeRow, "pack", lambda self: packed.append((list(self.samples), len(self.tokens),
                                                                     out := pack(self))) or out)  # fmt: skip
    trainer = lora_async_trainer(vllm_credit_server, tokenizer, worker, seeds, tmp_path / "out", steps=steps)
    t0 = time.time()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    print(f"trained {steps} steps in {time.time() - t0:.1f} s; counts {dict(worker.counts)}")
    assert trainer.state.global_step == steps and len(logs) == steps
    assert all(math.isfinite(h["loss"]) for h in logs)

    # Every sample the trainer read is one model turn, token-exact (the server's answer to the sample's prefix),
    # trained on that turn only, with the advantage GiGPO gives that turn of its episode.
    answered, _ = recorder.answered()
    expected_of = {}  # id(sample) -> the advantage of its turn
    varied = 0
    for samples, _, advantages in checked_episodes(pushed, groups, get_estimator("gigpo", scale_rewards="group")):
        expected_of.update({id(s): a for s, a in zip(samples, advantages, strict=True)})
        varied += len({round(a, 6) for a in advantages}) > 1
    assert len(taken) >= steps * 8 and varied > 0  # some episodes' turns got different advantages
    for s in taken:
        assert check_row(s, answered) and s.advantage == pytest.approx(expected_of[id(s)])

    # TRL's packer gave each trained token its own sample's (turn's) advantage, and shared the turns' prefixes.
    assert packed
    for samples, unique, out in packed:
        advantages = [samples[i]["advantage"] for i in out["segment_id"].tolist()]
        assert out["advantages"].tolist() == pytest.approx(advantages)
        assert unique < sum(len(x["input_ids"]) for x in samples)

    credit_logs = [h for h in trainer.state.log_history if "credit/advantage_mean" in h]
    assert credit_logs and all(math.isfinite(h["credit/advantage_mean"]) for h in credit_logs)
    assert any(h["credit/anchor_groups"] > 0 for h in credit_logs)  # the group's episodes share observations
    assert "credit/turn0/advantage_mean" in credit_logs[0] and "credit/flip_frac" in credit_logs[0]
    assert not any(t.is_alive() for t in worker._threads)
