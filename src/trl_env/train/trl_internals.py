"""Every TRL private or experimental name trl-env relies on, in one place, with the TRL versions it was checked on.

trl-env's public route into TRL is ``GRPOTrainer(rollout_func=...)`` (``make_rollout_func``): it needs TRL's public
``rollout_func(prompts, trainer)`` hook and nothing private, so it runs on any TRL that has the hook (1.16 or newer).
Two features go further and lean on TRL internals that change between releases:

- ``EpisodeGRPOTrainer`` (several rows per episode, per-turn credit) runs TRL's private
  ``GRPOTrainer._generate_and_score_completions`` with ``rollout_func``, ``_calculate_rewards`` and
  ``num_generations`` swapped (``scoring_rows``), then corrects what it logged (``replace_logged_advantages``,
  ``metrics``);
- the async worker builds ``trl.experimental.async_grpo``'s ``RolloutSample`` (``rollout_sample_type``) and, on a CPU,
  patches two of that package's module attributes (``patch_async_for_cpu``).

``make_rollout_func`` also wraps the trainer's ``_calculate_rewards`` (``wrap_reward_calculation``) so that failed
episodes stay out of TRL's reward statistics; it checks the method's signature first and refuses a TRL whose differs.

Every one of those names is reached only through a function here, and ``tests/test_trl_internals.py`` pins what
each does on the installed TRL, so that a TRL change fails a test, not a training run. On a TRL outside
``TESTED_TRL``, ``EpisodeGRPOTrainer`` and ``TrlEnvRolloutWorker`` refuse at construction (``require_tested_trl``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from trl_env.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

TESTED_TRL_RANGE = ">=1.16.0,<1.17"
"""The TRL versions whose internals this module was checked against (pyproject.toml declares the same range)."""
TESTED_TRL = SpecifierSet(TESTED_TRL_RANGE)
TESTED_TRL_VERSIONS = "1.16.0"
"""The TRL releases the test suite ran on, as the error messages name them."""

REWARD_SIGNATURE = ["self", "inputs", "prompts", "completions", "completion_ids_list"]
"""``GRPOTrainer._calculate_rewards``'s parameters in TRL 1.16, which ``wrap_reward_calculation`` relies on."""


def installed_trl() -> str:
    """The installed TRL's version string."""
    import trl

    return str(trl.__version__)


def require_tested_trl(feature: str) -> None:
    """Refuse to build ``feature`` (it relies on TRL internals) on a TRL outside ``TESTED_TRL``.

    Raises:
        ConfigError: naming the installed and the tested versions, and the public route that still works.
    """
    installed = installed_trl()
    if Version(installed) not in TESTED_TRL:
        raise ConfigError(
            f"{feature} relies on TRL internals checked on trl {TESTED_TRL_VERSIONS} only (trl{TESTED_TRL_RANGE}); trl "
            f"{installed} is installed. Install `pip install 'trl{TESTED_TRL_RANGE}'`, or train with plain "
            "`GRPOTrainer(rollout_func=make_rollout_func(...))`, which uses TRL's public rollout_func hook only."
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

    A trainer without the method (a stand-in in a test) is left alone.
    """
    calculate = getattr(trainer, "_calculate_rewards", None)
    if calculate is None or getattr(trainer, "_trl_env_excludes_failed", False):
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
