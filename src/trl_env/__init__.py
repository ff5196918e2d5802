"""trl_env: token-exact multi-turn RL of language models against text environments, for TRL's GRPOTrainer.

The public API is ``__all__``: what the docs import. Other libraries' envs are in ``trl_env.adapters``, the
sandbox in ``trl_env.sandbox`` and test support in ``trl_env.testing``. ``import trl_env`` loads neither torch,
transformers nor trl (an isolated env's worker process imports this package): ``TransformersGenerator``,
``EpisodeGRPOTrainer`` and ``LoraSnapshots`` load them when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trl_env.adapters.tool_env import ToolEnv
from trl_env.agents import AgentProgram, AgentRun, agent_env_factory
from trl_env.backends import FinishReason, Generation, GenerationRequest, Generator, VLLMServerGenerator
from trl_env.env import Action, Delta, Env, Language, Seed
from trl_env.errors import (
    AgentError,
    ConfigError,
    EnvError,
    EnvTimeoutError,
    ProcessorError,
    SandboxUnavailableError,
    ServerError,
    TrlEnvError,
)
from trl_env.render.processors import ChatMLProcessor, from_tokenizer, get_processor, processor_names
from trl_env.render.processors.base import Processor, split_reasoning
from trl_env.render.tools import ToolCall, ToolCalls, ToolResult, ToolResults
from trl_env.render.tools.processor import ToolProcessor
from trl_env.rollout import Budgets, Ending, Rollout, Row, Span, Turn, batch_rollout
from trl_env.rollout.isolation import isolated
from trl_env.rollout.seated import play_seats
from trl_env.seats import POLICY, Frozen, SeatedEnv, Seating
from trl_env.train.async_grpo import TrlEnvRolloutWorker, WorkerOptions, patch_for_cpu
from trl_env.train.credit import (
    CreditEstimator,
    DiscountedReturns,
    EpisodeAdvantage,
    EpisodeCredit,
    GiGPO,
    NaivePerTurnIndex,
    PerRole,
    get_estimator,
)
from trl_env.train.grpo import env_reward, make_rollout_func
from trl_env.train.options import BackendOptions, EngineOptions, Limits, LoggingOptions
from trl_env.train.trl_output import to_trl, to_trl_rows

if TYPE_CHECKING:
    from trl_env.backends.transformers import TransformersGenerator
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer
    from trl_env.train.snapshots import LoraSnapshots

__version__ = "0.2.0"

__all__ = [
    # the Env protocol
    "Action",
    "Delta",
    "Env",
    "Language",
    "Seed",
    # several seats
    "POLICY",
    "Frozen",
    "SeatedEnv",
    "Seating",
    "play_seats",
    # rollouts and their records
    "Budgets",
    "Ending",
    "Rollout",
    "Row",
    "Span",
    "Turn",
    "batch_rollout",
    "isolated",
    # TRL
    "BackendOptions",
    "EngineOptions",
    "EpisodeGRPOTrainer",
    "Limits",
    "LoggingOptions",
    "LoraSnapshots",
    "TrlEnvRolloutWorker",
    "WorkerOptions",
    "env_reward",
    "make_rollout_func",
    "patch_for_cpu",
    "to_trl",
    "to_trl_rows",
    # credit across turns
    "CreditEstimator",
    "DiscountedReturns",
    "EpisodeAdvantage",
    "EpisodeCredit",
    "GiGPO",
    "NaivePerTurnIndex",
    "PerRole",
    "get_estimator",
    # agent programs
    "AgentProgram",
    "AgentRun",
    "agent_env_factory",
    # native tool calls
    "ToolCall",
    "ToolCalls",
    "ToolEnv",
    "ToolProcessor",
    "ToolResult",
    "ToolResults",
    # processors
    "ChatMLProcessor",
    "Processor",
    "from_tokenizer",
    "get_processor",
    "processor_names",
    "split_reasoning",
    # generators
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Generator",
    "TransformersGenerator",
    "VLLMServerGenerator",
    # errors
    "AgentError",
    "ConfigError",
    "EnvError",
    "EnvTimeoutError",
    "ProcessorError",
    "SandboxUnavailableError",
    "ServerError",
    "TrlEnvError",
]

_LAZY = {
    "TransformersGenerator": "trl_env.backends.transformers",
    "EpisodeGRPOTrainer": "trl_env.train.episode_trainer",
    "LoraSnapshots": "trl_env.train.snapshots",
}
"""Names whose module imports torch, transformers or trl: imported when first used."""


def __getattr__(name: str) -> Any:
    """The names of ``_LAZY``, imported when first used (they need torch, transformers or trl)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
