"""Issue 34 item 2: a seat played by a frozen copy of the policy (trl_env.train.snapshots.LoraSnapshots), a LoRA
snapshot of the trained adapter served by the REAL vLLM CPU server next to the policy, refreshed every N steps; its
moves are the snapshot's own samples, and it gives the trainer no row."""

from __future__ import annotations

import collections
import time
import types
import zlib

import pytest
import requests
import torch
from async_support import Recorder
from seat_games import SecretNim

from trl_env import ConfigError, VLLMServerGenerator, make_rollout_func
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Budgets, Ending
from trl_env.rollout.seated import play_seats
from trl_env.seats import POLICY, Seating
from trl_env.train.snapshots import LoraSnapshots

MOVES: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)  # per game seed: (seat, action), in order


class LoggedNim(SecretNim):
    """SecretNim that logs every action it is given (the moves each seat played)."""

    def step(self, action):
        MOVES[self.cards[0].split("-")[1]].append((self.seat, action))
        return super().step(action)


def peft_tiny(model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


def served(url):
    return {m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]}


def prompt_logprobs(url, model, context, ids):
    """The server's logprobs of ``ids`` after ``context`` under ``model`` (vLLM's prompt_logprobs)."""
    body = {"model": model, "prompt": context + ids, "max_tokens": 1, "prompt_logprobs": 0}
    answer = requests.post(f"{url}/v1/completions", json=body, timeout=60).json()
    scored = answer["choices"][0]["prompt_logprobs"][len(context) :]
    return [entry[str(i)]["logprob"] for entry, i in zip(scored, ids, strict=True)]


def frozen_answers(recorder, adapter):
    """{prompt ids: [(token ids, logprobs)]} of the recorded requests that named ``adapter``."""
    answered, _ = recorder.answered()
    return {p: [(ids, lps) for ids, lps, m in outs if m == adapter] for p, outs in answered.items()}


def check_frozen_moves_are_snapshot_samples(url, recorder, adapter, tokenizer, processor, seeds, base, differs=True):
    """Every frozen-seat move is the parsed text of one of the snapshot's answers, which the snapshot scores with
    exactly the sampled logprobs (and, ``differs``, the base model does not); returns how many moves were checked."""
    answers = frozen_answers(recorder, adapter)
    texts = {processor.parse_agent_output(tokenizer.decode(ids, skip_special_tokens=False))[1]
             for outs in answers.values() for ids, _ in outs}  # fmt: skip
    moves = [a for seed in seeds for seat, a in MOVES[seed] if seat == 1]
    assert moves and all(m in texts for m in moves), (moves, texts)
    context, (ids, lps) = next((list(p), outs[0]) for p, outs in answers.items() if outs)
    assert prompt_logprobs(url, adapter, context, ids) == pytest.approx(lps, abs=1e-3)
    gap = max(abs(a - b) for a, b in zip(prompt_logprobs(url, base, context, ids), lps, strict=True))
    assert gap > 1e-2 if differs else gap < 1e-3, gap
    return len(moves)


def test_a_frozen_seat_samples_the_snapshot_refreshed_every_n_steps(vllm_server, tmp_path):
    from transformers import AutoTokenizer

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tokenizer, recorder = AutoTokenizer.from_pretrained(model_dir), Recorder()
    processor, model = from_tokenizer(tokenizer), peft_tiny(model_dir)
    snapshots = LoraSnapshots(VLLMServerGenerator(url, post=recorder), every=2, adapter_dir=tmp_path, name="snap")
    seating = Seating(LoggedNim, (POLICY, snapshots.seat))
    policy = VLLMServerGenerator(url, model=model_dir)

    def play(seeds):
        with policy.session():
            return play_seats(seeds, seating, processor, tokenizer, policy, parse_truncated_turns=True,
                              budgets=Budgets(max_turns=4, max_new_tokens=6))  # fmt: skip

    args, state = types.SimpleNamespace(use_vllm=False), types.SimpleNamespace(global_step=0)
    snapshots.on_train_begin(args, state, None, model=model)
    assert snapshots.served == "snap-0" and "snap-0" in served(url)
    with torch.no_grad():  # "training": the adapter moves away from the base model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
    state.global_step = 1
    snapshots.on_step_end(args, state, None, model=model)
    assert snapshots.served == "snap-0"  # not a multiple of every=2: no refresh
    state.global_step, started = 2, time.perf_counter()
    snapshots.on_step_end(args, state, None, model=model)
    print(f"refresh (save a rank-8 adapter, load it, unload the old one): {time.perf_counter() - started:.2f} s")
    assert snapshots.served == "snap-2" and "snap-2" in served(url) and "snap-0" not in served(url)
    assert not (tmp_path / "snap-0").exists() and (tmp_path / "snap-2" / "adapter_config.json").exists()

    seeds = ["5", "6", "7"]
    MOVES.clear()
    started = time.perf_counter()
    rollouts = play(seeds)
    print(f"3 games against the snapshot: {time.perf_counter() - started:.2f} s")
    assert [r.info["seat"] for r in rollouts] == [0, 0, 0]  # the frozen seat's episodes are not returned
    assert all(r.ending is not Ending.ERROR for r in rollouts), [r.error for r in rollouts]
    assert {body["model"] for _, _, body, _ in recorder.calls} == {"snap-2"}  # every frozen turn named the snapshot
    assert check_frozen_moves_are_snapshot_samples(url, recorder, "snap-2", tokenizer, processor, seeds, model_dir) >= 3
    requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "snap-2"}, timeout=30)  # the session's server


def models_only(url, timeout):
    """``get`` for a VLLMServerGenerator that needs no server (a seam: only the start-up reads are answered)."""
    data = {"data": [{"id": "tiny", "max_model_len": 1024}]} if url.endswith("/v1/models") else {}
    return types.SimpleNamespace(status_code=200, json=lambda: data, text="")


def test_bad_snapshot_setups_fail_early_with_the_fix(tokenizer, model, tmp_path):
    from trl_env.backends.transformers import TransformersGenerator

    with pytest.raises(ConfigError, match="give VLLMServerGenerator"):
        LoraSnapshots(TransformersGenerator(model, pad_token_id=0), every=2, adapter_dir=tmp_path)  # type: ignore[arg-type]
    snapshots = LoraSnapshots(VLLMServerGenerator("http://127.0.0.1:9", get=models_only), every=1, adapter_dir=tmp_path)
    with pytest.raises(ConfigError, match="every=0"):
        LoraSnapshots(snapshots.generator, every=0, adapter_dir=tmp_path)
    state = types.SimpleNamespace(global_step=0)
    with pytest.raises(ConfigError, match="needs a LoRA-trained policy.*peft_config=LoraConfig"):
        snapshots.on_train_begin(types.SimpleNamespace(use_vllm=False), state, None, model=model)
    with pytest.raises(ConfigError, match="use_vllm=True.*lora_sync=DIR"):
        snapshots.on_train_begin(types.SimpleNamespace(use_vllm=True, vllm_mode="server"), state, None, model=model)
    seating = Seating(LoggedNim, (POLICY, snapshots.seat))
    with pytest.raises(ConfigError, match="no snapshot to play with yet: pass it to the trainer"):
        play_seats(["5"], seating, from_tokenizer(tokenizer), tokenizer, snapshots.generator)

    def no_route(url, json, timeout):  # vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING: no such route
        return types.SimpleNamespace(status_code=404, text='{"detail":"Not Found"}')

    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    old_server = VLLMServerGenerator("http://127.0.0.1:9", get=models_only, post=no_route)
    with pytest.raises(ConfigError, match="did not load the snapshot adapter 'frozen-0'.*--enable-lora.*RUNTIME_LORA"):
        LoraSnapshots(old_server, every=1, adapter_dir=tmp_path).refresh(lora, step=0)


def test_two_grpo_steps_against_a_snapshot_refreshed_each_step(vllm_server, tmp_path):
    """A real GRPOTrainer (LoRA, policy synced as an adapter), every=1: step 1's frozen seat plays snapshot 0 (the
    initial adapter), step 2's snapshot 1 (the adapter after one step, scored unlike the base); the trainer gets the
    policy seat's rows only."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tokenizer, recorder = AutoTokenizer.from_pretrained(model_dir), Recorder()
    processor = from_tokenizer(tokenizer)
    snapshots = LoraSnapshots(VLLMServerGenerator(url, post=recorder), every=1, adapter_dir=tmp_path / "frozen")
    inner = make_rollout_func(Seating(LoggedNim, (POLICY, snapshots.seat)), processor, max_turns=3, max_new_tokens=6,
                              parse_truncated_turns=True, base_url=url, lora_sync=tmp_path / "policy")  # fmt: skip
    steps = []  # per step: (frozen adapter at the call, policy rows, recorded calls before, after, moves checked)

    def rollout_func(prompts, trainer):
        MOVES.clear()
        before, adapter = len(recorder.calls), snapshots.served
        out = inner(prompts, trainer)
        this_step = Recorder()
        this_step.calls = recorder.calls[before:]
        checked = check_frozen_moves_are_snapshot_samples(url, this_step, adapter, tokenizer, processor, ["5", "6"],
                                                          model_dir, differs=adapter != "frozen-0")  # fmt: skip
        steps.append((adapter, len(out["prompt_ids"]), before, len(recorder.calls), checked))
        return out

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        processing_class=tokenizer,
        # a reward that differs between samples: every step moves the adapter
        reward_funcs=lambda completions, **kw: [zlib.crc32(str(c).encode()) % 1000 / 1000 for c in completions],
        train_dataset=Dataset.from_dict({"prompt": ["5", "6"] * 4}),
        rollout_func=rollout_func,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        callbacks=[snapshots],
        args=GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
                        num_generations=4, learning_rate=5e-2, max_completion_length=48, report_to=[],
                        save_strategy="no", use_cpu=True, bf16=False, use_vllm=False, logging_steps=1, seed=0),
    )  # fmt: skip
    trainer.train()

    # step 1 played snapshot 0 (the adapter at the start), step 2 snapshot 1 (after one step); the trainer got the
    # policy seat's 4 rows per step, nothing of the frozen seat's
    assert [(adapter, rows) for adapter, rows, *_ in steps] == [("frozen-0", 4), ("frozen-1", 4)]
    assert all(checked >= 4 for *_, checked in steps)
    for adapter, _, before, after, _ in steps:  # each step's frozen turns named that step's snapshot, and only it
        assert {body["model"] for _, _, body, _ in recorder.calls[before:after]} == {adapter}
    assert snapshots.served == "frozen-2" and "frozen-2" in served(url) and "frozen-1" not in served(url)
    requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "frozen-2"}, timeout=30)  # the session's server


def test_the_selfplay_example_plays_seat_1_with_a_snapshot(vllm_server, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))
    import selfplay_tictactoe

    url = vllm_server.base_url
    summary = selfplay_tictactoe.main(["--model", vllm_server.model_dir, "--steps", "1", "--out", str(tmp_path),
                                       "--vllm-server", url, "--frozen-every", "1"])  # fmt: skip
    assert summary["steps"] == 1.0 and "seat0/win_rate/first" in summary and "seat1/win_rate/first" not in summary
    assert "frozen-1" in served(url) and "frozen-0" not in served(url)  # refreshed after the one step
    requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "frozen-1"}, timeout=30)
    with pytest.raises(SystemExit):  # argparse: --frozen-every needs the server that serves the snapshot
        selfplay_tictactoe.main(["--model", "tiny", "--frozen-every", "1", "--out", str(tmp_path)])
