"""Every TRL private or experimental name trl-env relies on, in one place, with the TRL versions it was checked on.

The dependency, decided (docs/architecture.md): ``pyproject.toml`` allows ``trl>=1.16.0,<2`` (``SUPPORTED_TRL``), so
trl-env installs next to a newer TRL. trl-env's public route into TRL is ``GRPOTrainer(rollout_func=...)``
(``make_rollout_func``): it needs TRL's public ``rollout_func(prompts, trainer)`` hook, checked by
``check_rollout_hook`` (the one version check of that path), and runs on any TRL in that range. What needs TRL
internals refuses at construction on a TRL outside ``TESTED_TRL`` (``require_tested_trl``), naming the tested
versions: ``EpisodeGRPOTrainer`` and ``TrlEnvRolloutWorker``.

The names, and why no public route exists for each (TRL 1.16):

- ``GRPOTrainer._generate_and_score_completions`` with ``rollout_func``, ``_calculate_rewards`` and
  ``num_generations`` swapped (``scoring_rows``): ``EpisodeGRPOTrainer`` hands TRL several rows per episode with its
  own advantages; TRL's public ``rollout_func`` takes one row per prompt and has no hook for advantages.
- ``_logs`` / ``_metrics`` / ``_pending_extra_logs`` (``replace_logged_advantages``, ``metric_lists``,
  ``spread_pending_extras``): TRL's ``log_metric`` / ``log_extra`` queue values per call, not per episode.
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

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator
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
        warnings.warn(f"trl_env: {why}: failed episodes are left out of TRL's reward statistics only by reward "
                      "functions that return None for them (env_reward does).", stacklevel=2)  # fmt: skip
        trainer._trl_env_excludes_failed = True  # warned once
        return
    trainer._calculate_rewards = wrap(calculate)
    trainer._trl_env_excludes_failed = True


def calculate_rewards(
    trainer: Any, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any], ids: list[list[int]]
) -> torch.Tensor:
    """TRL's reward functions on ``inputs`` (``_calculate_rewards``): every process's rows x reward functions."""
    return trainer._calculate_rewards(inputs, prompts, completions, ids)  # type: ignore[no-any-return]


@contextlib.contextmanager
def scoring_rows(
    trainer: Any, rows: dict[str, list[Any]], row_rewards: torch.Tensor, generations: str
) -> Iterator[None]:
    """Inside, TRL's ``_generate_and_score_completions`` takes ``rows`` and ``row_rewards``, in groups of 1.

    ``generations`` names the trainer's group-size attribute for the mode (``num_generations`` or its eval twin).
    """
    group = getattr(trainer, generations)
    saved = {k: trainer.__dict__[k] for k in ("rollout_func", "_calculate_rewards") if k in trainer.__dict__}
    try:
        trainer.rollout_func = lambda _prompts, _trainer: rows
        trainer._calculate_rewards = lambda *_args: row_rewards
        setattr(trainer, generations, 1)
        yield
    finally:
        setattr(trainer, generations, group)
        for k in ("rollout_func", "_calculate_rewards"):
            trainer.__dict__.pop(k, None)
        trainer.__dict__.update(saved)


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


def replace_logged_advantages(trainer: Any, every: list[float]) -> None:
    """Replace the advantages TRL's last ``_generate_and_score_completions`` appended to its ``_logs`` deque."""
    logged = trainer._logs["advantages"]
    kept = min(len(every), len(logged))  # a bounded deque may hold fewer
    for _ in range(kept):
        logged.pop()
    logged.extend(every[len(every) - kept :])


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
