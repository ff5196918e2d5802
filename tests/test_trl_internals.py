"""The TRL coupling: pyproject allows every TRL with the public rollout_func hook (trl>=1.16,<2), the plain path runs
on a newer one, the internal features refuse any TRL but the tested one at construction, and the behaviour of every
TRL internal trl-env relies on (trl_env/train/trl_internals.py) is pinned here (behaviour, never TRL's source text), so
that a TRL change fails this file, not a training run."""

from __future__ import annotations

import collections
import dataclasses
import inspect
import re
import warnings
from pathlib import Path

import pytest
import tomllib
import torch
from helpers import GuessEnv, ScriptedGenerator
from packaging.requirements import Requirement
from packaging.version import Version

from trl_env import ChatMLProcessor, ConfigError, env_reward, make_rollout_func
from trl_env.train import trl_internals
from trl_env.train.trl_internals import SUPPORTED_TRL, TESTED_TRL, TESTED_TRL_VERSIONS

ROOT = Path(__file__).resolve().parents[1]


def grpo_config(tmp_path, **config):
    from trl import GRPOConfig

    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                    max_completion_length=32, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                    bf16=False, seed=0) | config  # fmt: skip
    return GRPOConfig(**settings)


def sampler(tokenizer):
    return ScriptedGenerator(range(10, 60), tokenizer.convert_tokens_to_ids("<|im_end|>"), p_stop=0.3)


def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["1", "2"] * 4})


def test_pyproject_allows_newer_trl_and_the_installed_one_is_the_tested_one():
    """One version check per path: pyproject's range (SUPPORTED_TRL: the plain path) holds the tested one (TESTED_TRL:
    the internal features), which holds the installed TRL."""
    import trl

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "trl"]
    assert declared.specifier == SUPPORTED_TRL
    assert (
        all(Version(v) in SUPPORTED_TRL for v in ("1.16.0", "1.17.0", "1.19.0")) and Version("2.0") not in SUPPORTED_TRL
    )
    assert Version(trl.__version__) in TESTED_TRL
    assert all(Version(v) in TESTED_TRL for v in TESTED_TRL_VERSIONS.split(", "))


@pytest.mark.parametrize("version", ["1.17.0", "1.19.0", "1.15.2"])
def test_episode_trainer_and_async_worker_refuse_an_untested_trl_at_construction(
    tmp_path, model, tokenizer, monkeypatch, version
):
    """Never an ImportError deep inside or a wrong advantage: a ConfigError naming both versions, before any work."""
    import trl

    from trl_env.train.async_grpo import TrlEnvRolloutWorker
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    func = make_rollout_func(GuessEnv, ChatMLProcessor(), generator=sampler(tokenizer))
    monkeypatch.setattr(trl, "__version__", version)
    expected = rf"EpisodeGRPOTrainer relies on TRL internals checked on trl 1\.16\.0 .*trl {re.escape(version)} is"
    with pytest.raises(ConfigError, match=expected):
        EpisodeGRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path), processing_class=tokenizer,
                           train_dataset=dataset(), rollout_func=func)  # fmt: skip
    with pytest.raises(ConfigError, match=rf"TrlEnvRolloutWorker .*trl {re.escape(version)} is installed"):
        TrlEnvRolloutWorker(GuessEnv, ChatMLProcessor(), tokenizer, seeds=["1"], generator="http://127.0.0.1:9")


def test_plain_make_rollout_func_keeps_working_on_a_newer_trl_with_the_public_hook(
    tmp_path, model, tokenizer, monkeypatch
):
    """Only TRL's public rollout_func contract is used on this path: a real step with TRL reporting 1.19.0, where
    trl-env leaves TRL's private reward computation alone (it warns once) and the internal features refuse."""
    import trl
    from trl import GRPOTrainer

    from trl_env.train.async_grpo import TrlEnvRolloutWorker
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    monkeypatch.setattr(trl, "__version__", "1.19.0")
    gen = sampler(tokenizer)
    func = make_rollout_func(GuessEnv, ChatMLProcessor(), generator=gen, max_turns=2)
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path), processing_class=tokenizer,
                          train_dataset=dataset(), rollout_func=func)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.global_step == 1 and gen.requests
    assert "_calculate_rewards" not in vars(trainer)  # TRL's own method: no private name touched
    assert sum("trl 1.19.0 is not a tested version" in str(w.message) for w in caught) == 1
    with pytest.raises(ConfigError, match=r"trl 1\.16\.0 only .*trl 1\.19\.0 is installed"):
        EpisodeGRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path), processing_class=tokenizer,
                           train_dataset=dataset(), rollout_func=func)  # fmt: skip
    with pytest.raises(ConfigError, match=r"trl 1\.16\.0 only .*trl 1\.19\.0 is installed"):
        TrlEnvRolloutWorker(GuessEnv, ChatMLProcessor(), tokenizer, seeds=["1"], generator="http://127.0.0.1:9")


# --- the pins: what each TRL internal in trl_internals.py does on the installed TRL --------------------------------


def test_pin_calculate_rewards_signature_and_private_attributes(tmp_path, model, tokenizer):
    from trl import GRPOTrainer

    assert trl_internals.reward_signature_error(GRPOTrainer) is None
    func = make_rollout_func(GuessEnv, ChatMLProcessor(), generator=sampler(tokenizer))
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path), processing_class=tokenizer,
                          train_dataset=dataset(), rollout_func=func)  # fmt: skip
    assert trl_internals.tokenizer_of(trainer) is tokenizer
    assert isinstance(trainer._logs["advantages"], collections.deque)
    assert set(trainer._metrics) == {"train", "eval"}
    assert isinstance(trl_internals.metric_lists(trainer)["train"], collections.defaultdict)
    assert isinstance(trainer._pending_extra_logs, collections.defaultdict)  # spread_pending_extras reads it
    assert trainer.state.global_step == 0  # sync_weights_once_per_step compares it with TRL's _last_loaded_step

    class Sync:
        calls = 0

        def sync_weights(self):
            self.calls += 1

    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, Sync(), -1
    for _ in range(2):  # once per optimizer step, as GRPOTrainer._generate
        trl_internals.sync_weights_once_per_step(trainer)
    assert trainer.vllm_generation.calls == 1 and trainer._last_loaded_step == 0
    assert {"num_generations", "num_generations_eval", "reward_weights", "reward_func_names", "scale_rewards",
            "multi_objective_aggregation"} <= set(vars(trainer))  # fmt: skip


def test_pin_the_scoring_step_internals_episode_trainer_uses(tmp_path, model, tokenizer):
    """What EpisodeGRPOTrainer's own batch relies on (tests/test_credit_grpo.py checks the whole batch and the logged
    step against GRPOTrainer's): one value per metric key, gauges replaced; the completion table and the values
    reward functions queued, flushed; the old logprobs TRL's loss reads, as the model gives them."""
    from trl import GRPOTrainer

    func = make_rollout_func(GuessEnv, ChatMLProcessor(), generator=sampler(tokenizer))
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path, num_iterations=2),
                          processing_class=tokenizer, train_dataset=dataset(), rollout_func=func)  # fmt: skip
    trainer.model.eval()
    metrics = trl_internals.metric_lists(trainer)["train"]
    trl_internals.log_metrics_once(trainer, "train", {"reward": 1.0, "num_tokens": 5.0}, gauges=("num_tokens",))
    trl_internals.log_metrics_once(trainer, "train", {"reward": 2.0, "num_tokens": 9.0}, gauges=("num_tokens",))
    assert metrics["reward"] == [1.0, 2.0] and metrics["num_tokens"] == [9.0]
    trainer._pending_extra_logs["note"] = ["a", "b"]
    trainer._pending_metrics["mine"].extend([1.0, 3.0])
    rewards = torch.tensor([[1.0], [float("nan")]])
    trl_internals.log_rows(trainer, "train", ["p", "q"], ["x", "y"], rewards, [0.5, 0.0])
    logs = trainer._logs
    assert list(logs["prompt"]) == ["p", "q"] and list(logs["completion"]) == ["x", "y"]
    assert list(logs["advantages"]) == [0.5, 0.0] and list(logs["rewards"]["env_reward"])[0] == 1.0
    assert list(logs["extra"]["note"]) == ["a", "b"] and not trainer._pending_extra_logs
    assert metrics["mine"] == [2.0] and not trainer._pending_metrics
    ids = tokenizer.encode("hello there friend", add_special_tokens=False)
    ones = torch.ones(1, len(ids) - 2, dtype=torch.long)
    batch = {
        "prompt_ids": torch.tensor([ids[:2]]),
        "prompt_mask": torch.ones(1, 2, dtype=torch.long),
        "completion_ids": torch.tensor([ids[2:]]),
        "completion_mask": ones,
        "tool_mask": ones,
    }
    out = trl_internals.policy_logps(trainer, batch, "train")
    assert set(out) == {"old_per_token_logps"}  # two iterations: the batch is trained twice; no vLLM, beta 0
    with torch.no_grad():
        logits = trainer.model(torch.tensor([ids])).logits[0, 1:-1]  # the logits that predict ids[2:]
    expected = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(ids[2:]).unsqueeze(1)).squeeze(1)
    assert torch.allclose(out["old_per_token_logps"][0], expected, atol=1e-5)


def test_pin_micro_batch_internals_prepare_inputs_compute_loss_and_their_normalisers(tmp_path, model, tokenizer):
    """What history="deployed"'s row micro-batches (micro_batches.py) rely on: the two methods' signatures, TRL's
    micro-step counter, and the loss left unscaled by Trainer. Each loss type's denominator is pinned by behaviour in
    tests/test_micro_batches.py (chunked loss and gradient against TRL's own one-batch computation, every type)."""
    from trl import GRPOTrainer

    assert list(inspect.signature(GRPOTrainer._prepare_inputs).parameters) == ["self", "generation_batch"]
    assert list(inspect.signature(GRPOTrainer._compute_loss).parameters) == ["self", "model", "inputs"]
    assert GRPOTrainer.loss_is_scaled_for_ga is True  # Trainer.training_step back-propagates compute_loss's value
    func = make_rollout_func(GuessEnv, ChatMLProcessor(), generator=sampler(tokenizer))
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=grpo_config(tmp_path, entropy_coef=0.01),
                          processing_class=tokenizer, train_dataset=dataset(), rollout_func=func)  # fmt: skip
    assert trl_internals.micro_step_index(trainer) == 0
    assert trl_internals.loss_extras(trainer) == ["the entropy bonus (entropy_coef)"]
    trainer.entropy_coef, trainer._entropy_bonus_enabled = 0.0, False
    assert trl_internals.loss_extras(trainer) == []


def test_pin_async_rollout_sample_fields_and_cpu_patch_targets():
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    sample = trl_internals.rollout_sample_type()
    passed = {"prompt", "completion", "input_ids", "completion_mask", "old_log_probs", "advantage", "model_version",
              "metrics", "group_id"}  # what async_grpo/samples.py gives each sample  # fmt: skip
    fields = {f.name: f for f in dataclasses.fields(sample)}
    assert passed <= set(fields)
    required = {
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert required <= passed, f"RolloutSample needs {sorted(required - passed)} too"
    assert hasattr(packing, "_flash_attn") and callable(async_grpo_trainer.get_peak_flops_per_device)
    assert "rollout_worker" in inspect.signature(async_grpo_trainer.AsyncGRPOTrainer.__init__).parameters
