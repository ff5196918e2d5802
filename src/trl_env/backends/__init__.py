"""Generator backends: the only code that talks to a model or a server."""

from trl_env.backends.base import FinishReason, Generation, GenerationRequest, Generator
from trl_env.backends.transformers import TransformersGenerator
from trl_env.backends.vllm_server import VLLMServerGenerator

__all__ = [
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Generator",
    "TransformersGenerator",
    "VLLMServerGenerator",
]
