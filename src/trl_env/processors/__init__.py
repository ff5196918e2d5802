"""Processors for model families, and a registry by name.

Each module holds one family; ``PROCESSORS`` maps a registry name to a factory taking
``system_prompt=``. ``from_tokenizer`` recognises a family from a tokenizer's chat template, or
derives a processor from the template itself.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from trl_env.errors import ConfigError
from trl_env.processors.base import Processor
from trl_env.processors.chatml import QWEN2_5_SYSTEM_PROMPT, SMOLLM2_SYSTEM_PROMPT, ChatMLProcessor
from trl_env.processors.deepseek_r1 import DeepSeekR1Processor
from trl_env.processors.derived import TemplateProcessor, from_tokenizer
from trl_env.processors.gemma3 import Gemma3Processor
from trl_env.processors.gemma4 import Gemma4Processor
from trl_env.processors.llama3 import Llama3Processor
from trl_env.processors.mistral import MistralProcessor
from trl_env.processors.qwen3 import Qwen3Processor


def _default_system(factory: Callable[..., Processor], default: str) -> Callable[..., Processor]:
    """A factory for a template that writes ``default`` as the system prompt when there is none."""

    def build(*, system_prompt: str | None = None) -> Processor:
        return factory(system_prompt=default if system_prompt is None else system_prompt)

    return build


def _llama3_2(*, system_prompt: str | None = None) -> Processor:
    # Llama 3.2's template writes today's date (transformers' strftime_now, local time).
    return Llama3Processor(system_prompt=system_prompt, date_string=time.strftime("%d %b %Y"))


PROCESSORS: dict[str, Callable[..., Processor]] = {
    "chatml": ChatMLProcessor,
    "qwen2_5": _default_system(ChatMLProcessor, QWEN2_5_SYSTEM_PROMPT),
    "smollm2": _default_system(ChatMLProcessor, SMOLLM2_SYSTEM_PROMPT),
    "qwen3": Qwen3Processor,
    "qwen3_no_thinking": functools.partial(Qwen3Processor, thinking=False),
    "llama3": functools.partial(Llama3Processor, date_string=None),
    "llama3_1": Llama3Processor,
    "llama3_2": _llama3_2,
    "gemma3": Gemma3Processor,
    "gemma4": Gemma4Processor,
    "gemma4_thinking": functools.partial(Gemma4Processor, thinking=True),
    "deepseek_r1": DeepSeekR1Processor,
    "mistral_tekken": functools.partial(MistralProcessor, system_tokens=False),
    "mistral_v7_tekken": MistralProcessor,
}
"""Registry name -> factory(system_prompt=...). ``llama3_1`` also serves Llama 3.3; ``mistral_tekken`` is V3-Tekken
(NeMo, Pixtral), ``mistral_v7_tekken`` Mistral Small 3.x and later."""


def get_processor(name: str, *, system_prompt: str | None = None) -> Processor:
    """Build the processor registered as ``name``.

    ``system_prompt=None`` means what the family's template writes without a system message
    (a default system prompt for ``qwen2_5`` and ``smollm2``, none for the others).

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    try:
        factory = PROCESSORS[name]
    except KeyError:
        raise ConfigError(
            f"unknown processor {name!r}; known processors: {', '.join(PROCESSORS)}. For another chat template, "
            "try trl_env.processors.from_tokenizer(tokenizer)."
        ) from None
    return factory(system_prompt=system_prompt)


__all__ = [
    "PROCESSORS",
    "ChatMLProcessor",
    "DeepSeekR1Processor",
    "Gemma3Processor",
    "Gemma4Processor",
    "Llama3Processor",
    "MistralProcessor",
    "Qwen3Processor",
    "TemplateProcessor",
    "from_tokenizer",
    "get_processor",
]
