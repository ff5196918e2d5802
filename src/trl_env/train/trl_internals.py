"""Every TRL private or experimental name trl-env relies on, in one place, with the TRL versions it was checked on.

The dependency, decided (docs/architecture.md): ``pyproject.toml`` allows ``trl>=1.16.0,<2`` (``SUPPORTED_TRL``), so
trl-env installs next to a newer TRL. trl-env's public route into TRL is ``GRPOTrainer(rollout_func=...)``
(``make_rollout_func``): it needs TRL's public ``rollout_func(prompts, trainer)`` hook, checked by
``check_rollout_hook`` (the one version check of that path), and runs on any TRL in that range. What needs TRL
internals refuses at construction on a TRL outside ``TESTED_TRL`` (``require_tested_trl``), naming the tested
versions: ``EpisodeGRPOTrainer`` and ``TrlEnvRolloutWorker``.

The names, and why no public route exists for each (TRL 1.16):

- ``GRPOTrainer._generate_and_score_completions``, overridden by ``EpisodeGRPOTrainer`` (never called): TRL's
  ``_prepare_inputs`` asks it for each generation batch; ``EpisodeGRPOTrainer`` returns the batch it builds (several
  rows per episode, its own advantages), which TRL's public ``rollout_func`` (one row per prompt, no advantages)
  cannot carry. What TRL would add to that batch comes from ``policy_logps`` (``_get_per_token_logps_and_entropies``,
  ``ref_model``, the importance-sampling settings).
- ``_metrics`` / ``_logs`` / ``_pending_extra_logs`` / ``_pending_metrics`` (``log_metrics_once``, ``log_rows``,
  ``metric_lists``, ``spread_pending_extras``): where TRL's scoring step logs; the batch's metrics are logged there
  once, under TRL's names (TRL's ``log_metric`` / ``log_extra`` only queue a reward function's values).
- ``eos_token_ids``, ``pad_to_multiple_of`` and the trainer's settings (``beta``, ``num_iterations``, ...): read as
  TRL's scoring step reads them.
- ``_calculate_rewards`` (``calculate_rewards``, ``wrap_reward_calculation``): TRL gives a row advantage 0 only when
  every reward function returned ``None``; a failed episode must be out of the statistics whatever the functions.
  On an untested TRL the plain path does not wrap it (only ``env_reward``'s ``None`` keeps failed episodes out).
- ``mask_truncated_completions`` (``take_over_truncation``): TRL's rule (last token not EOS) does not know which
  episodes trl-env ended by a limit, and has no hook to replace the rule.
- ``_prepare_inputs``, ``_compute_loss``, ``_step``, ``_entropy_bonus_enabled`` / ``aux_loss_enabled``
  (``trl_prepare_inputs``, ``trl_compute_loss``, ``micro_step_index``, ``loss_extras``): token-bounded micro-batches
  of deployed rows; ``Trainer`` offers no micro-batch hook.
- ``_last_loaded_step`` / ``vllm_generation`` (``sync_weights_once_per_step``): ``_generate``'s weight sync, which
  ``EpisodeGRPOTrainer`` replays because it runs the episodes itself.
- ``_tokenizer`` (``tokenizer_of``): the processing class or a processor's tokenizer, as TRL resolved it.
- ``trl.experimental.async_grpo``: ``RolloutSample`` (``rollout_sample_type``) and two CPU patches
  (``patch_async_for_cpu``): the async trainer is experimental in TRL 1.16, with no stable sample type.

Every one of those names is reached only through a function here; ``tests/test_trl_internals.py`` pins what each does
on the installed TRL (behaviour, not source text), so that a TRL change fails a test, not a training run.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from trl_env.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

SUPPORTED_TRL_RANGE = ">=1.16.0,<2"
"""What ``pyproject.toml`` allows: every TRL with the public ``rollout_func`` hook (the plain path)."""
SUPPORTED_TRL = SpecifierSet(SUPPORTED_TRL_RANGE)
TESTED_TRL_RANGE = ">=1.16.0,<1.17"
"""The TRL versions whose internals this module was checked against: the internal features run only on these."""
TESTED_TRL = SpecifierSet(TESTED_TRL_RANGE)
TESTED_TRL_VERSIONS = "1.16.0"
"""The TRL releases the test suite ran on, as the error messages name them."""

REWARD_SIGNATURE = ["self", "inputs", "prompts", "completions", "completion_ids_list"]
"""``GRPOTrainer._calculate_rewards``'s parameters in TRL 1.16, which ``wrap_reward_calculation`` relies on."""


def installed_trl() -> str:
    """The installed TRL's version string (the one every check here reads)."""
    import trl

    return str(trl.__version__)


def internals_tested() -> bool:
    """Whether the installed TRL is one whose internals this module was checked against."""
    return Version(installed_trl()) in TESTED_TRL


def require_tested_trl(feature: str) -> None:
    """Refuse to build ``feature`` (it relies on TRL internals) on a TRL outside ``TESTED_TRL``.

    Raises:
        ConfigError: naming the installed and the tested versions, and the public route that still works.
    """
    installed = installed_trl()
    if not internals_tested():
        raise ConfigError(
            f"{feature} relies on TRL internals checked on trl {TESTED_TRL_VERSIONS} only (trl{TESTED_TRL_RANGE}); trl "
            f"{installed} is installed. Install `pip install 'trl{TESTED_TRL_RANGE}'`, or train with plain "
            "`GRPOTrainer(rollout_func=make_rollout_func(...))`, which uses TRL's public rollout_func hook only."
        )


def check_rollout_hook() -> None:
    """The plain path's one version check: a TRL in ``SUPPORTED_TRL`` whose ``GRPOTrainer`` takes ``rollout_func``.

    Raises:
        ConfigError: for an older TRL, or one without the ``rollout_func(prompts, trainer)`` hook.
    """
    from trl import GRPOTrainer

    installed = installed_trl()
    has_hook = "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    if not has_hook or Version(installed) < Version("1.16.0"):
        raise ConfigError(
            f"trl {installed} is installed, trl_env needs trl{SUPPORTED_TRL_RANGE} (GRPOTrainer's "
            f"rollout_func(prompts, trainer) hook{'' if has_hook else ', missing here'}); run "
            f"`pip install 'trl{TESTED_TRL_RANGE}'` (tested)."
        )


# --- GRPOTrainer (trl/trainer/grpo_trainer.py) ---------------------------------------------------------------------


def reward_signature_error(trainer_class: Any) -> str | None:
    """Why ``_calculate_rewards`` of ``trainer_class`` cannot be wrapped, or ``None`` when it can."""
    scoring = list(inspect.signature(trainer_class._calculate_rewards).parameters)
    if scoring == REWARD_SIGNATURE:
        return None
    return (
        f"GRPOTrainer._calculate_rewards{tuple(scoring)} is not the signature {tuple(REWARD_SIGNATURE)} trl_env wraps "
        "to keep failed episodes out of the reward statistics"
    )


RewardCalculation = Callable[..., "torch.Tensor"]
"""``_calculate_rewards(inputs, prompts, completions, completion_ids_list)`` -> (rows, reward functions)."""


def wrap_reward_calculation(trainer: Any, wrap: Callable[[RewardCalculation], RewardCalculation]) -> None:
    """Replace ``trainer._calculate_rewards`` (every process's rows x reward functions) by ``wrap(original)``, once.

    A trainer without the method (a stand-in in a test) is left alone; so is one on a TRL outside ``TESTED_TRL`` or
    whose method has another signature, with a warning (only reward functions returning ``None`` for failed
    episodes, as ``env_reward`` does, keep them out of TRL's statistics there).
    """
    calculate = getattr(trainer, "_calculate_rewards", None)
    if calculate is None or getattr(trainer, "_trl_env_excludes_failed", False):
        return
    why = None if internals_tested() else f"trl {installed_trl()} is not a tested version ({TESTED_TRL_VERSIONS})"
    why = why or reward_signature_error(type(trainer))
    if why is not None:
        warnings.warn(
            f"trl_env: {why}: failed episodes are left out of TRL's reward statistics only by reward "
            "functions that return None for them (env_reward does).",
            stacklevel=2,
        )
        trainer._trl_env_excludes_failed = True  # warned once
        return
    trainer._calculate_rewards = wrap(calculate)
    trainer._trl_env_excludes_failed = True


def calculate_rewards(
    trainer: Any, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any], ids: list[list[int]]
) -> torch.Tensor:
    """TRL's reward functions on ``inputs`` (``_calculate_rewards``): every process's rows x reward functions."""
    return trainer._calculate_rewards(inputs, prompts, completions, ids)  # type: ignore[no-any-return]


ROW_LOSSES = frozenset({"grpo", "sapo", "dr_grpo", "luspo"})
"""TRL loss types that divide by the number of rows (a mean per row, ``dr_grpo``'s rows x max length)."""
TOKEN_LOSSES = frozenset({"bnpo"})
"""TRL loss types that divide by the micro-batch's own trained tokens."""
ITEM_LOSSES = frozenset({"dapo", "cispo", "vespo"})
"""TRL loss types that divide by ``num_items_in_batch`` (the generation batch's trained tokens, every process).

How ``GRPOTrainer._compute_loss`` normalises each loss type, which ``micro_batches.chunk_scale`` undoes: TRL exposes no
normaliser. ``tests/test_micro_batches.py`` pins each by behaviour (chunked loss and gradient against TRL's own
one-batch computation, every type)."""

LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo", "vespo", "luspo")
"""The ``loss_type`` values TRL 1.16's ``GRPOTrainer._compute_loss`` knows (``micro_batches`` normalises each)."""


def trl_prepare_inputs(trainer: Any, generation_batch: Any) -> Any:
    """TRL's own ``GRPOTrainer._prepare_inputs``: generate every ``steps_per_generation`` micro-steps, then a slice."""
    from trl.trainer.grpo_trainer import GRPOTrainer  # TRL's class itself, even where ``trl.GRPOTrainer`` is patched

    return GRPOTrainer._prepare_inputs(trainer, generation_batch)


def trl_compute_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL's own ``GRPOTrainer._compute_loss`` of one batch, already divided for gradient accumulation."""
    from trl.trainer.grpo_trainer import GRPOTrainer  # TRL's class itself, even where ``trl.GRPOTrainer`` is patched

    return GRPOTrainer._compute_loss(trainer, model, inputs)  # type: ignore[no-any-return]  # trl is untyped


def micro_step_index(trainer: Any) -> int:
    """TRL's count of micro-steps trained so far (``trainer._step``), which picks the buffered micro-batch."""
    return int(trainer._step)


def loss_extras(trainer: Any) -> list[str]:
    """The terms TRL adds to the policy loss with its own per-micro-batch normalisation (entropy bonus, aux loss)."""
    extras = []
    if getattr(trainer, "_entropy_bonus_enabled", False):
        extras.append("the entropy bonus (entropy_coef)")
    if getattr(trainer, "aux_loss_enabled", False):
        extras.append("the router aux loss (output_router_logits)")
    return extras


def take_over_truncation(trainer: Any) -> bool:
    """The trainer's ``mask_truncated_completions``, with TRL's own rule (last token not EOS) switched off.

    trl-env applies the setting itself, to the episodes it reports as truncated (``Rollout.truncated``).
    """
    mask = bool(getattr(trainer.args, "mask_truncated_completions", False))
    trainer.mask_truncated_completions = False
    return mask


def sync_weights_once_per_step(trainer: Any) -> None:
    """Push the policy's weights to vLLM once per optimizer step, as ``GRPOTrainer._generate`` does (``use_vllm``)."""
    if trainer.use_vllm and trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


def tokenizer_of(trainer: Any) -> Any:
    """The trainer's text tokenizer (``trainer._tokenizer``: the processing class, or a processor's tokenizer)."""
    return trainer._tokenizer


def log_metrics_once(trainer: Any, mode: str, metrics: dict[str, float], *, gauges: tuple[str, ...] = ()) -> None:
    """Append one value per key to TRL's ``_metrics[mode]`` (``gauges`` replace theirs), as TRL's scoring step does.

    ``EpisodeGRPOTrainer`` builds its batch itself; these are the metrics TRL would log for it, under TRL's names,
    logged once. TRL 1.16 offers no public route: its ``log_metric`` hook queues a reward function's values only.
    """
    logged = trainer._metrics[mode]
    for key, value in metrics.items():
        if key in gauges:
            logged[key] = [value]
        else:
            logged[key].append(value)


def log_rows(
    trainer: Any,
    mode: str,
    prompts: list[Any],
    completions: list[Any],
    rewards_per_func: torch.Tensor,
    advantages: list[float],
) -> None:
    """TRL's completion table for the batch's rows (``_logs``), and the values reward functions queued, flushed.

    As ``GRPOTrainer._generate_and_score_completions`` does: prompts and completions gathered from every process;
    ``rewards_per_func`` and ``advantages`` are every process's rows already. ``log_extra`` columns (queued per row)
    go beside them; ``log_metric`` values are averaged over processes into ``_metrics[mode]``.
    """
    import torch
    from accelerate.utils import gather_object  # type: ignore[import-untyped]

    logs = trainer._logs
    logs["prompt"].extend(gather_object(prompts))
    logs["completion"].extend(gather_object(completions))
    for i, name in enumerate(trainer.reward_func_names):
        logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
    logs["advantages"].extend(advantages)
    pending = trainer._pending_extra_logs
    for column in sorted(set(gather_object(list(pending)))):
        logs["extra"][column].extend(gather_object(pending.get(column, [None] * len(prompts))))
    pending.clear()
    queued = trainer._pending_metrics
    for name in sorted(set(gather_object(list(queued)))):
        values = queued.get(name, [])
        local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=trainer.accelerator.device)
        total, count = trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        trainer._metrics[mode][name].append(total / count)
    queued.clear()


def policy_logps(trainer: Any, batch: dict[str, Any], mode: str) -> dict[str, torch.Tensor]:
    """The logprob tensors TRL's loss reads beside the rows, computed as ``GRPOTrainer`` computes them (text only).

    ``old_per_token_logps`` (when generation and optimisation steps are misaligned, or with vLLM's importance
    sampling correction), ``importance_sampling_ratio`` (that correction, every ``vllm_importance_sampling_mode``) and
    ``ref_per_token_logps`` (``beta != 0``: the reference model, or the PEFT model with its adapter off or its "ref"
    adapter), through TRL's private ``_get_per_token_logps_and_entropies``; the correction's ``sampling/*`` metrics
    are logged. TRL 1.16 computes these inside ``_generate_and_score_completions`` only, with no public route.
    """
    import math

    import torch
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import nanmax, nanmin, use_adapter

    args = trainer.args
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
    correct = trainer.use_vllm and trainer.vllm_importance_sampling_correction
    out: dict[str, torch.Tensor] = {}

    def logps(model: Any) -> torch.Tensor:
        values, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attention, keep, batch_size=size)
        return values  # type: ignore[no-any-return]

    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs):
        if args.gradient_accumulation_steps % (args.steps_per_generation * trainer.num_iterations) != 0 or correct:
            out["old_per_token_logps"] = logps(trainer.model)
        if correct:
            mask = batch["completion_mask"] * batch["tool_mask"]
            diff = torch.nan_to_num((out["old_per_token_logps"] - batch["sampling_per_token_logps"]) * mask, nan=0.0)
            level = trainer.vllm_importance_sampling_mode
            sequence = level in ("sequence_mask", "sequence_truncate")
            ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence else diff)
            low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
            if level in ("sequence_truncate", "token_truncate"):
                ratio = torch.clamp(ratio, min=low, max=high)
            elif level in ("sequence_mask", "token_mask"):
                low = low if low is not None else -math.inf
                high = high if high is not None else math.inf
                ratio = ratio.masked_fill((ratio < low) | (ratio > high), value=0.0)
            else:
                raise ConfigError(f"vllm_importance_sampling_mode={level!r} is not one trl_env knows.")
            out["importance_sampling_ratio"] = ratio
        if trainer.beta != 0.0:
            if trainer.ref_model is not None:
                out["ref_per_token_logps"] = logps(trainer.ref_model)
            else:
                model = trainer.accelerator.unwrap_model(trainer.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    out["ref_per_token_logps"] = logps(trainer.model)
    if correct:
        device, gather = trainer.accelerator.device, trainer.accelerator.gather
        mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
        delta = torch.abs(out["old_per_token_logps"] - batch["sampling_per_token_logps"])
        delta = delta[mask & ~torch.isnan(delta)]
        zero = torch.tensor(0.0, device=device)
        flat = ratio.flatten() if sequence else ratio[mask]
        metrics = trainer._metrics[mode]
        metrics["sampling/sampling_logp_difference/mean"].append(
            gather(torch.mean(delta) if delta.numel() else zero).mean().item()
        )
        metrics["sampling/sampling_logp_difference/max"].append(
            gather(torch.max(delta) if delta.numel() else zero).max().item()
        )
        metrics["sampling/importance_sampling_ratio/min"].append(
            nanmin(gather(torch.min(flat) if flat.numel() else zero)).item()
        )
        metrics["sampling/importance_sampling_ratio/mean"].append(
            gather(torch.mean(flat) if flat.numel() else zero).nanmean().item()
        )
        metrics["sampling/importance_sampling_ratio/max"].append(
            nanmax(gather(torch.max(flat) if flat.numel() else zero)).item()
        )
    return out


def spread_pending_extras(trainer: Any, episode_of_row: list[int]) -> None:
    """Make the ``log_extra`` values reward functions gave per episode one per row (``None`` on padding rows, -1).

    TRL's ``_log_completion_extra`` queues them on ``_pending_extra_logs`` and its next
    ``_generate_and_score_completions`` logs them beside that call's completions, which are rows here.
    """
    pending = trainer._pending_extra_logs
    for column, values in list(pending.items()):
        pending[column] = [values[e] if 0 <= e < len(values) else None for e in episode_of_row]


def metric_lists(trainer: Any) -> Any:
    """TRL's ``trainer._metrics`` (mode -> key -> values), or ``None`` for a trainer without it (a stand-in)."""
    return getattr(trainer, "_metrics", None)


# --- trl.experimental.async_grpo ------------------------------------------------------------------------------------

ASYNC_LORA_NAME = "trl-policy"
"""The adapter name prefix ``AsyncGRPOTrainer`` publishes (its private ``_lora_name``): ``trl-policy-v{N}``. The worker
reads each turn's policy version from it; TRL 1.16 exposes the name nowhere public."""


def rollout_sample_type() -> type[RolloutSample]:
    """TRL's ``RolloutSample`` (importing ``trl.experimental.async_grpo`` takes seconds: cached by the caller)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample


def patch_async_for_cpu(varlen: type) -> None:
    """Point ``packing._flash_attn`` at ``varlen`` and make ``get_peak_flops_per_device`` return ``None``.

    Raises:
        ConfigError: when TRL's async module lacks the patched names (a TRL version this was not written for).
    """
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    for module, name in ((packing, "_flash_attn"), (async_grpo_trainer, "get_peak_flops_per_device")):
        if not hasattr(module, name):
            raise ConfigError(
                f"trl_env.train.async_grpo.patch_for_cpu: {module.__name__}.{name} does not exist in this "
                "TRL version; the CPU workaround was written for trl 1.16 and may no longer be needed."
            )
    packing._flash_attn = varlen  # type: ignore[assignment]  # tree_attention calls it for the kernel module
    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None  # type: ignore[assignment]
