"""trl-env against a REAL vLLM server (CPU build, tiny model): token-exact prefixes, and GRPO with LoRA hot-sync.

Needs .venv-vllm (`bash scripts/install_vllm.sh`); skipped without it unless TRL_ENV_REQUIRE_VLLM=1 (CI sets it).
"""

from __future__ import annotations

import json
import zlib

import requests
import torch
from helpers import ScriptedEnv, assert_token_exact

from trl_env import Budgets, ChatMLProcessor, GenerationRequest, VLLMServerGenerator, batch_rollout, make_rollout_func
from trl_env.backends.vllm_server import parse_completion

TOL = 2e-3  # vLLM's CPU kernels vs transformers, float32


class Recorder:
    """A `post` that goes to the real server and keeps every request body and answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict, dict]] = []

    def __call__(self, url, json, timeout):
        if url.endswith("/v1/completions"):  # also ask for the echo of the prompts (what vLLM saw) and the ids
            json = {**json, "return_token_ids": True}
        response = requests.post(url, json=json, timeout=timeout)
        if url.endswith("/v1/completions") and response.status_code == 200:
            self.calls.append((url, json, response.json()))
        return response


def recomputed(model, prompt_ids, completion_ids, temperature=1.0):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_every_request_the_server_sees_is_the_trajectory_prefix(vllm_server, vllm_tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vllm_tiny_model)
    recorder = Recorder()
    gen = VLLMServerGenerator(vllm_server.base_url, post=recorder, temperature=1.0)
    deltas = [" leading space", "line\nbreak", "日本 → é", "42 + 17", "higher"]
    seeds = [json.dumps({"n": 4, "deltas": deltas[i % 5 :] + deltas[: i % 5]}) for i in range(40)]
    rollouts = batch_rollout(
        seeds,
        ScriptedEnv,
        ChatMLProcessor(),
        tokenizer,
        gen,
        budgets=Budgets(max_turns=4, max_new_tokens=8),
        parse_truncated_turns=True,
    )
    assert gen.context_limit == 1024
    assert len(rollouts) == 40 and all(len(r.turns) >= 3 for r in rollouts), [r.error for r in rollouts]
    requests_, outputs, batch_sizes = [], [], []
    for url, body, answer in recorder.calls:
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        batch_sizes.append(len(prompts))
        assert len(answer["choices"]) == len(prompts)
        for prompt, choice in zip(prompts, answer["choices"], strict=True):
            assert choice["prompt_token_ids"] == prompt  # what vLLM actually saw, choice by choice
            assert [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]] == choice["token_ids"]
            requests_.append(GenerationRequest(prompt, body["max_tokens"], tuple(body["stop_token_ids"])))
            outputs.append(parse_completion({"choices": [choice]}, url=url, max_tokens=body["max_tokens"]))
    assert assert_token_exact(rollouts, requests_, outputs) >= 40 * 3
    assert max(batch_sizes) > 1 and len(batch_sizes) < len(requests_)  # turns went to the server in batches

    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_model, dtype=torch.float32).eval()
    for r in rollouts[:5]:
        mask = torch.tensor(r.env_mask, dtype=torch.bool)
        mine = torch.tensor(r.logprobs)[mask]
        assert torch.allclose(mine, recomputed(model, r.prompt_ids, r.completion_ids)[mask], atol=TOL, rtol=0)


def test_grpo_with_lora_hot_sync_samples_each_step_from_that_steps_adapter(vllm_server, vllm_tiny_model, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(vllm_tiny_model)
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_model, dtype=torch.float32)
    inner = make_rollout_func(
        ScriptedEnv,
        ChatMLProcessor(),
        max_turns=3,
        max_new_tokens=6,
        parse_truncated_turns=True,
        base_url=vllm_server.base_url,
        lora_sync=tmp_path / "adapters",
    )
    checks = []

    def rollout_func(prompts, trainer):
        out = inner(prompts, trainer)  # syncs the adapter of this step, then samples from the server
        peft_model = trainer.model
        was_training = peft_model.training
        peft_model.eval()
        adapter_gap, base_gap = 0.0, 0.0
        rows = zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], strict=True)
        for p, c, lp, m in rows:
            mask = torch.tensor(m, dtype=torch.bool)
            served = torch.tensor(lp)[mask]
            adapter_gap = max(adapter_gap, (served - recomputed(peft_model, p, c)[mask]).abs().max().item())
            with peft_model.disable_adapter():
                base_gap = max(base_gap, (served - recomputed(peft_model, p, c)[mask]).abs().max().item())
        peft_model.train(was_training)
        checks.append((trainer.state.global_step, adapter_gap, base_gap))
        return out

    seeds = [json.dumps({"n": 3, "deltas": [f"level {i}", "again", " 7"]}) for i in range(8)]
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        # A reward that differs between samples (a hash of the text): every group has nonzero advantages, so every
        # step changes the adapter (with the env's reward, a group of equal rewards left the policy unchanged).
        reward_funcs=lambda completions, **kw: [zlib.crc32(str(c).encode()) % 1000 / 1000 for c in completions],
        train_dataset=Dataset.from_dict({"prompt": seeds}),
        rollout_func=rollout_func,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            max_steps=3,
            per_device_train_batch_size=4,
            num_generations=4,
            learning_rate=5e-2,
            max_completion_length=48,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            use_vllm=False,
            logging_steps=1,
        ),
    )
    try:
        trainer.train()
        served = {card["id"] for card in requests.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()["data"]}
        kept = [p.name for p in (tmp_path / "adapters").iterdir()]  # trl-env-{run}-step-{step}
    finally:  # the server is shared by the session's tests: leave no adapter loaded, whatever happened
        for path in (tmp_path / "adapters").glob("trl-env-*"):
            requests.post(f"{vllm_server.base_url}/v1/unload_lora_adapter", json={"lora_name": path.name}, timeout=10)
    print("step, max |served - adapter recompute|, max |served - base|:", checks)
    assert [step for step, _, _ in checks] == [0, 1, 2]
    for step, adapter_gap, base_gap in checks:
        assert adapter_gap < TOL, f"step {step}: served logprobs are not step {step}'s adapter ({adapter_gap})"
        if step > 0:
            assert base_gap > 10 * TOL, f"step {step}: the adapter did not change the policy ({base_gap})"
    # Only the served (last) adapter's folder is kept; earlier steps' adapters were unloaded and their folders deleted.
    assert len(kept) == 1 and kept[0].startswith("trl-env-") and kept[0].endswith("-step-2"), kept
    run = kept[0].removesuffix("-step-2")
    assert {name for name in served if name.startswith(run)} == {kept[0]}, served


def test_a_second_run_syncing_its_adapter_into_the_same_server_is_not_refused(vllm_server, vllm_tiny_model, tmp_path):
    """Two training runs (or two trainers) against one long-lived server: each run's step-0 adapter loads under a name
    of its own (before: both were ``trl-env-step-0`` and the second run's first sync got HTTP 400 'already loaded')."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_env.backends.lora_sync import sync_lora

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    names = []
    try:
        for run in range(2):
            model = get_peft_model(AutoModelForCausalLM.from_pretrained(vllm_tiny_model), config)
            state, accelerator = SimpleNamespace(global_step=0), Accelerator(cpu=True)
            trainer = SimpleNamespace(state=state, accelerator=accelerator, model=model)
            generator = VLLMServerGenerator(vllm_server.base_url)
            sync_lora(generator, trainer, str(tmp_path / f"run{run}"))
            names.append(generator.model)
        served = {card["id"] for card in requests.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()["data"]}
    finally:  # the server is shared by the session's tests: leave no adapter loaded
        for name in names:
            requests.post(f"{vllm_server.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=10)
    assert len(set(names)) == 2 and set(names) <= served, (names, served)
    assert all(name.startswith("trl-env-") and name.endswith("-step-0") for name in names), names
