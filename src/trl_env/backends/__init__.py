"""Generator backends: the only code that talks to a model or a server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trl_env.backends.base import FinishReason, Generation, GenerationRequest, Generator
from trl_env.backends.vllm_server import VLLMServerGenerator

if TYPE_CHECKING:
    from trl_env.backends.transformers import TransformersGenerator

__all__ = [
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Generator",
    "TransformersGenerator",
    "VLLMServerGenerator",
]


def __getattr__(name: str) -> Any:
    """``TransformersGenerator`` is imported when first used: it needs torch and transformers, nothing else does."""
    if name == "TransformersGenerator":
        from trl_env.backends.transformers import TransformersGenerator

        return TransformersGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
