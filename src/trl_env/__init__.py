"""trl_env: token-exact multi-turn RL of language models against text environments, for TRL's GRPOTrainer.

``import trl_env`` loads neither torch nor transformers (an isolated env's worker process imports this package):
``TransformersGenerator`` loads them when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trl_env.backends import FinishReason, Generation, GenerationRequest, Generator, VLLMServerGenerator
from trl_env.env import Action, Delta, Env, Language, Seed
from trl_env.errors import ConfigError, EnvError, ProcessorError, ServerError, TrlEnvError
from trl_env.render.processors import PROCESSORS, ChatMLProcessor, from_tokenizer, get_processor
from trl_env.render.processors.base import Processor, split_reasoning
from trl_env.rollout import Budgets, Ending, Rollout, Turn, batch_rollout
from trl_env.train.grpo import env_reward, make_rollout_func, to_trl

if TYPE_CHECKING:
    from trl_env.backends.transformers import TransformersGenerator

__version__ = "0.2.0"

__all__ = [
    "Action",
    "Budgets",
    "ChatMLProcessor",
    "ConfigError",
    "Delta",
    "Ending",
    "Env",
    "EnvError",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Generator",
    "Language",
    "Processor",
    "PROCESSORS",
    "ProcessorError",
    "Rollout",
    "Seed",
    "ServerError",
    "TransformersGenerator",
    "TrlEnvError",
    "Turn",
    "VLLMServerGenerator",
    "batch_rollout",
    "env_reward",
    "from_tokenizer",
    "get_processor",
    "make_rollout_func",
    "split_reasoning",
    "to_trl",
]


def __getattr__(name: str) -> Any:
    """``TransformersGenerator``, imported when first used (it needs torch and transformers)."""
    if name == "TransformersGenerator":
        from trl_env.backends.transformers import TransformersGenerator

        return TransformersGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
