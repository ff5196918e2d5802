"""``TrlEnvRolloutWorker``'s arguments: flat keywords, their checks, the check that the server serves the adapter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from trl_env.backends.base import Generator
from trl_env.backends.vllm_server import VLLMServerGenerator
from trl_env.env import Env
from trl_env.errors import ConfigError
from trl_env.render.processors.base import Processor, check_processor
from trl_env.rollout.seated import check_executor
from trl_env.seats import Seating
from trl_env.train.async_grpo.samples import ScaleRewards, Unscored
from trl_env.train.credit import CreditEstimator, credit_estimator
from trl_env.train.options import (
    BackendOptions,
    EngineKeywords,
    FlatOptions,
    LimitKeywords,
    RolloutOptions,
    TranscriptKeywords,
)
from trl_env.train.trl_internals import ASYNC_LORA_NAME

logger = logging.getLogger(__name__)

LORA_NAME = ASYNC_LORA_NAME
"""The adapter name prefix ``AsyncGRPOTrainer`` publishes: ``trl-policy-v{N}`` (``trl_internals.ASYNC_LORA_NAME``)."""


class WorkerOptions(LimitKeywords, EngineKeywords, TranscriptKeywords, total=False):
    """The flat keywords of ``make_rollout_func`` that the worker takes: limits, engine and transcripts."""


def check_worker_args(
    env_factory: Callable[[], Env] | Seating,
    processor: Processor,
    seeds: Sequence[Any],
    *,
    num_generations: int,
    max_staleness: int,
    max_completion_length: int,
    max_inflight_groups: int,
    buffer_size: int | None,
    scale_rewards: ScaleRewards,
    unscored: Unscored,
    credit: str | CreditEstimator,
    groups: dict[str, Any],
    options: FlatOptions,
) -> tuple[RolloutOptions, CreditEstimator | None]:
    """Check ``TrlEnvRolloutWorker``'s arguments; its options and credit estimator.

    Raises:
        ConfigError: for a bad argument.
    """
    if not callable(env_factory) and not isinstance(env_factory, Seating):
        raise ConfigError(
            f"env_factory={env_factory!r} is not callable; pass the env class or a function that returns a "
            "fresh env, e.g. `env_factory=MyEnv`, not `MyEnv()`."
        )
    if isinstance(env_factory, Seating) and num_generations % len(env_factory.policy_seats):
        k = len(env_factory.policy_seats)
        raise ConfigError(
            f"num_generations={num_generations} with a Seating of {k} policy seats: a group is "
            f"num_generations / {k} games; make num_generations a multiple of {k}."
        )
    check_processor(processor)
    for name, value, low in (
        ("num_generations", num_generations, 1),
        ("max_staleness", max_staleness, 0),
        ("max_completion_length", max_completion_length, 1),
        ("max_inflight_groups", max_inflight_groups, 1),
    ):
        if not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}={value!r}: it must be an int >= {low}.")
    if buffer_size is not None and (not isinstance(buffer_size, int) or buffer_size < 1):
        raise ConfigError(f"buffer_size={buffer_size!r}: it must be a positive int (or None for the default).")
    if scale_rewards not in ("group", "none"):
        raise ConfigError(f"scale_rewards={scale_rewards!r}: use 'group' (TRL async's formula) or 'none'.")
    if unscored not in ("zero", "drop"):
        raise ConfigError(f"unscored={unscored!r}: use 'zero' (advantage 0, pushed, as TRL) or 'drop'.")
    estimator = credit_estimator(credit, scale_rewards)
    if not seeds:
        raise ConfigError("seeds is empty; pass the training dataset's prompts, e.g. `dataset['prompt']`.")
    built = RolloutOptions.build(groups, options)
    if built.backend != BackendOptions():
        raise ConfigError(
            "generator / base_url / lora_sync are make_rollout_func options; give the worker `generator=` (a "
            "VLLMServerGenerator or the server URL); the trainer itself syncs the LoRA adapter."
        )
    check_executor(env_factory, built.engine.env_executor)
    if built.logging.check_template_every:
        raise ConfigError("check_template_every is not supported by the async worker; use make_rollout_func.")
    return built, estimator


def check_adapter_served(generator: Generator, lora_name: str | None, model_version: int) -> None:
    """In LoRA mode, raise unless the server serves ``{lora_name}-v{model_version}`` (the trainer synced an adapter)."""
    gen = generator
    if lora_name is None or not isinstance(gen, VLLMServerGenerator):
        return
    name = f"{lora_name}-v{model_version}"
    try:
        cards = gen._get(f"{gen.urls[0]}/v1/models", timeout=30).json()["data"]
    except Exception as e:  # noqa: BLE001  # the check is advisory when the server cannot list
        logger.warning("could not list %s/v1/models to check for adapter %s: %r", gen.urls[0], name, e)
        return
    served = [c.get("id") for c in cards]
    if name not in served:
        raise ConfigError(
            f"the vLLM server at {gen.urls[0]} does not serve adapter {name!r} (it serves {served}). "
            "AsyncGRPOTrainer publishes one only with a PEFT model (peft_config=LoraConfig(...)) and a server "
            "started with --enable-lora, --max-loras >= max_staleness + 2, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
            "and VLLM_SERVER_DEV_MODE=1; with a full-weight sync pass lora_name=None."
        )
