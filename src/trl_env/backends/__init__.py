"""Generator backends: the only code that talks to a model or a server."""

from trl_env.backends.base import FinishReason, Generation, GenerationRequest, Generator
from trl_env.backends.transformers import TransformersGenerator

__all__ = ["FinishReason", "Generation", "GenerationRequest", "Generator", "TransformersGenerator"]
