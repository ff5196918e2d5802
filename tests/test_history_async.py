"""history='deployed' through the AsyncGRPOTrainer worker: one sample per row, the episode's advantage on each.

Unit tests drive the worker with ``consume`` (test_async_grpo) and a scripted generator whose replies think one
time in two, so episodes have 1 to 3 rows; the end-to-end test runs 2 real ``AsyncGRPOTrainer`` steps against a
REAL vLLM CPU server with LoRA sync in both modes (skipped without ``.venv-vllm``).
"""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import pytest
from async_support import THINK_END_BIAS, Recorder, check_row, consume, deployed_worker, lora_async_trainer
from history_support import FlakyTalkEnv, ReplyGenerator, thinking_tokenizer
from vllm_server import make_vllm_server_fixture

from trl_env import ConfigError
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import History
from trl_env.train.async_grpo import TrlEnvRolloutWorker, group_advantages, patch_for_cpu

FATES = ("pushed", "dropped_stale", "failed", "untrainable", "truncated_masked", "dropped_unscored", "stopped")


@pytest.mark.parametrize("history", ["sampled", "deployed"])
def test_worker_pushes_every_row_token_exact_with_its_episodes_advantage(tokenizer, history):
    worker, groups = deployed_worker(tokenizer, history)
    batches, dropped, _, leftovers = consume(worker, steps=4, batch=8, max_staleness=1)
    read = [s for b in batches for _, s in b] + leftovers
    assert dropped == 0 and read
    by_group = {record.group_id: (record, rollouts) for record, rollouts in groups}
    episode_rows: dict = {}  # (group, episode) -> the samples read, in order
    for s in read:
        _, rollouts = by_group[s.group_id]
        ids = s.input_ids.tolist()
        found = [(e, k) for e, r in enumerate(rollouts) for k, row in enumerate(r.rows)
                 if row.prompt_ids + row.completion_ids == ids]  # fmt: skip
        assert found, "every sample is one of its episode's rows"
        e, k = found[0]
        row = rollouts[e].rows[k]
        n = len(row.prompt_ids)
        assert s.completion_mask.tolist() == [0] * n + row.env_mask
        assert np.array_equal(s.old_log_probs, np.asarray([0.0] * n + row.logprobs, dtype=np.float32))
        episode_rows.setdefault((s.group_id, e), []).append(k)
        # each episode counts once in its group's statistics; failed ones are out
        rewards = [None if r.ending.value == "error" else r.reward for r in rollouts]
        assert s.advantage == pytest.approx(group_advantages(rewards)[e])
    counts = dict(worker.counts)
    # An episode's rows are pushed together and read in order, all of them unless a version sync evicted some as stale
    # (as the trainer would drop them): eviction is per row, and a row's version is its oldest turn's, so it takes
    # rows not read yet from the episode's start (older) or, once its first rows were read, its tail. Every row not
    # read was evicted.
    cut = 0
    for (g, e), ks in episode_rows.items():
        assert ks == list(range(ks[0], ks[0] + len(ks))), (ks, counts)
        cut += len(by_group[g][1][e].rows) - len(ks)
    assert cut <= counts.get("evicted", 0), (cut, counts)
    assert counts["episodes"] == sum(counts.get(k, 0) for k in FATES), counts
    assert counts["failed"] > 0  # the flaky env fails some episodes: never pushed
    assert counts["rows"] == len(read) + counts.get("evicted", 0), counts  # the buffer counts rows
    assert worker._buffer.claimed == 0  # the admission rule's claims are settled to the rows really made
    if history == "deployed":
        assert counts["rows"] > counts["pushed"], counts
        assert len({len(r.rows) for _, rs in groups for r in rs if r.ending.value != "error"}) > 1
    else:
        assert counts["rows"] == counts["pushed"]
        assert all(len(r.rows) == 1 for _, rs in groups for r in rs)


def test_from_args_takes_history_and_template_kwargs_and_refusals_come_at_once(tokenizer):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    tok = thinking_tokenizer(tokenizer)
    args = AsyncGRPOConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, bf16=False)
    worker = TrlEnvRolloutWorker.from_args(args, FlakyTalkEnv, from_tokenizer(tok), tok, ["1"],
                                           generator=ReplyGenerator(tok, from_tokenizer(tok)), history="deployed",
                                           template_kwargs={"enable_thinking": True})  # fmt: skip
    assert worker.options.engine.history is History.DEPLOYED
    assert worker.options.engine.template_kwargs == {"enable_thinking": True}
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        TrlEnvRolloutWorker(FlakyTalkEnv, from_tokenizer(tok), bare, ReplyGenerator(tok, from_tokenizer(tok)), ["1"],
                            history="deployed")  # fmt: skip
    with pytest.raises(ConfigError, match="history="):
        TrlEnvRolloutWorker(FlakyTalkEnv, from_tokenizer(tok), tok, ReplyGenerator(tok, from_tokenizer(tok)), ["1"],
                            history="rendered")  # fmt: skip


# ------------------------------------------------------------------- end to end: real trainer + vLLM + LoRA

vllm_history_server = make_vllm_server_fixture(name="vllm_history_server", scope="module",
                                               extra_args=["--max-loras", "3"])  # fmt: skip


@pytest.mark.parametrize("history", ["sampled", "deployed"])
def test_two_real_async_grpo_steps_in_both_modes_every_request_a_rows_context(vllm_history_server, tmp_path, history):
    import requests
    from transformers import AutoTokenizer

    from trl_env import VLLMServerGenerator

    patch_for_cpu()
    url, model_dir, steps = vllm_history_server.base_url, vllm_history_server.model_dir, 2
    for card in requests.get(f"{url}/v1/models", timeout=10).json()["data"]:  # the other mode's adapters
        if card["id"].startswith("trl-policy-v"):
            unloaded = requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": card["id"]}, timeout=30)
            unloaded.raise_for_status()
    tok = thinking_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    processor = from_tokenizer(tok)
    think_end = tok.convert_tokens_to_ids("</think>")
    recorder = Recorder()
    gen = VLLMServerGenerator(url, post=recorder, temperature=1.0,
                              extra_body={"logit_bias": {str(think_end): THINK_END_BIAS}})  # fmt: skip
    rollouts, seeds = [], ["1", "2", "3"]
    worker = TrlEnvRolloutWorker(FlakyTalkEnv, processor, tok, gen, seeds, num_generations=4, max_staleness=1,
                                 max_inflight_groups=2, buffer_size=8, max_turns=3, max_new_tokens=8,
                                 parse_truncated_turns=True, max_completion_length=64, history=history,
                                 on_group=lambda record, rs: rollouts.extend(rs))  # fmt: skip
    taken = []
    get = worker.rollout_buffer.get
    worker.rollout_buffer.get = lambda *a, **k: taken.append(s := get(*a, **k)) or s
    stop, stopped_at = worker.stop, []
    worker.stop = lambda: stopped_at.append(time.time()) or stop()
    trainer = lora_async_trainer(vllm_history_server, tok, worker, seeds, tmp_path / "out", steps=steps)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    counts = dict(worker.counts)
    print(f"{history}: rows {counts.get('rows')} of {counts.get('pushed')} pushed episodes;", dict(counts))
    assert trainer.state.global_step == steps and len(logs) == steps
    assert all(math.isfinite(h["loss"]) for h in logs)

    # Every sample the trainer read is a row, token-exact: each trained run is the server's answer to the row's prefix.
    answered, sent = recorder.answered()
    assert len(taken) >= steps * 8
    for s in taken:
        assert check_row(s, answered)
    # Every request the server answered before the worker stopped asked for a row's context: the row's prompt ids
    # plus its completion so far. (Requests answered later belong to turns stop() failed: no row holds them.)
    done = [r for r in rollouts if not r.info.get("placeholder")]
    contexts = {tuple(row.prompt_ids + row.completion_ids[:k]) for r in done for row in r.rows
                for k in range(len(row.completion_ids) + 1)}  # fmt: skip
    before = [prompt for _, answered_at, prompt in sent if answered_at < stopped_at[0]]
    assert len(before) >= steps * 8 and all(tuple(p) in contexts for p in before)

    trained = [r for r in done if r.ending.value != "error"]
    think_turns = sum("</think>" in t.text for r in trained for t in r.turns)
    assert think_turns > 0, "the biased sampler wrote </think>"
    if history == "deployed":
        assert counts["rows"] > counts["pushed"], counts  # several rows per episode
        split_after_think = 0  # a row that ends on a thinking turn before the episode's last turn
        for r in trained:
            first = 0
            for row in r.rows[:-1]:
                first += row.turns
                split_after_think += "</think>" in r.turns[first - 1].text
        assert split_after_think > 0
    else:
        assert counts["rows"] == counts["pushed"] and all(len(r.rows) == 1 for r in done)


@pytest.mark.parametrize("history", ["sampled", "deployed"])
def test_two_real_grpo_steps_in_both_modes_against_the_vllm_server_every_request_a_rows_context(
    vllm_history_server, tmp_path, history, monkeypatch
):
    """GRPOTrainer's side (``EpisodeGRPOTrainer``): every turn sampled by the REAL vLLM server, behind the recorder."""
    import trl
    from helpers import train_grpo
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_env import VLLMServerGenerator, make_rollout_func
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    url, model_dir = vllm_history_server.base_url, vllm_history_server.model_dir
    tok = thinking_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    recorder = Recorder()
    think_end = tok.convert_tokens_to_ids("</think>")
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0,
                              extra_body={"logit_bias": {str(think_end): THINK_END_BIAS}})  # fmt: skip
    func = make_rollout_func(FlakyTalkEnv, from_tokenizer(tok), history=history, generator=gen, max_turns=3,
                             max_new_tokens=8, parse_truncated_turns=True)  # fmt: skip
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    monkeypatch.setattr(trl, "GRPOTrainer", EpisodeGRPOTrainer)  # train_grpo builds trl.GRPOTrainer
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    log = train_grpo(tmp_path, model, tok, func, ["1", "2"] * 8, batch=8, max_completion_length=64)
    assert sum("loss" in h for h in log) == 2
    episodes = [r for batch in seen for r in batch]
    contexts = {tuple(row.prompt_ids + row.completion_ids[:k]) for r in episodes for row in r.rows
                for k in range(len(row.completion_ids) + 1)}  # fmt: skip
    answered, sent = recorder.answered()
    assert len(sent) >= 2 * 8 and all(tuple(prompt) in contexts for _, _, prompt in sent)
    for r in episodes:  # each row's model tokens are the server's answer to the row's context at that turn
        for row in r.rows:
            at = 0
            while at < len(row.completion_ids):
                if row.env_mask[at]:
                    outputs = answered[tuple(row.prompt_ids + row.completion_ids[:at])]
                    ids, logprobs, _ = next(o for o in outputs if row.completion_ids[at : at + len(o[0])] == o[0])
                    assert row.logprobs[at : at + len(ids)] == pytest.approx(logprobs)
                    at += len(ids)
                else:
                    at += 1
    if history == "deployed":
        assert sum(len(r.rows) for r in episodes) > len(episodes)  # the template dropped earlier reasoning
    else:
        assert all(len(r.rows) == 1 for r in episodes)
