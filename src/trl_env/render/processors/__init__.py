"""Processors for model families, and a registry by name.

Each module holds one family; ``PROCESSORS`` maps a registry name to a factory taking
``system_prompt=``. ``from_tokenizer`` recognises a family from a tokenizer's chat template, or
derives a processor from the template itself.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

from trl_env.errors import ConfigError
from trl_env.render.processors.base import Processor
from trl_env.render.processors.chatml import QWEN2_5_SYSTEM_PROMPT, SMOLLM2_SYSTEM_PROMPT, ChatMLProcessor
from trl_env.render.processors.deepseek_r1 import DeepSeekR1Processor
from trl_env.render.processors.derived import TemplateProcessor, from_tokenizer
from trl_env.render.processors.gemma3 import Gemma3Processor
from trl_env.render.processors.gemma4 import Gemma4Processor
from trl_env.render.processors.gpt_oss import GptOssProcessor
from trl_env.render.processors.llama3 import Llama3Processor
from trl_env.render.processors.mistral import MistralProcessor
from trl_env.render.processors.presets import COHERE, LFM2, PHI3, glm4_moe
from trl_env.render.processors.qwen3 import Qwen3Processor


def _default_system(factory: Callable[..., Processor], default: str) -> Callable[..., Processor]:
    """A factory for a template that writes ``default`` as the system prompt when there is none."""

    def build(*, system_prompt: str | None = None) -> Processor:
        return factory(system_prompt=default if system_prompt is None else system_prompt)

    return build


def _llama3_2(*, system_prompt: str | None = None) -> Processor:
    # Llama 3.2's template writes today's date (transformers' strftime_now, local time).
    return Llama3Processor(system_prompt=system_prompt, date_string=time.strftime("%d %b %Y"))


def _preset(preset: TemplateProcessor) -> Callable[..., Processor]:
    return functools.partial(dataclasses.replace, preset)


QWEN3_8_EFFORT = (
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key assumptions, consider "
    "plausible alternatives, and prioritize correctness, consistency, and clarity in the final answer."
)
"""The system line Qwen 3.8's template writes in thinking mode."""
_qwen3_5 = functools.partial(Qwen3Processor, trim=True, open_think=True)
_qwen3_5_no_thinking = functools.partial(Qwen3Processor, trim=True, thinking=False)
_nemotron_3 = functools.partial(Qwen3Processor, open_think=True, system_preamble="", empty_think="<think></think>")

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
    "gemma4_v2_thinking": functools.partial(Gemma4Processor, thinking=True, think_marker="<|think|>"),
    "deepseek_r1": DeepSeekR1Processor,
    "mistral_tekken": functools.partial(MistralProcessor, system_tokens=False),
    "mistral_v7_tekken": MistralProcessor,
    "qwen2_5_vl": _default_system(ChatMLProcessor, "You are a helpful assistant."),
    "qwen3_instruct_2507": ChatMLProcessor,
    "qwen3_5": _qwen3_5,
    "qwen3_5_no_thinking": _qwen3_5_no_thinking,
    "qwen3_6": _qwen3_5,
    "qwen3_6_no_thinking": _qwen3_5_no_thinking,
    "qwen3_8": functools.partial(_qwen3_5, system_preamble=QWEN3_8_EFFORT),
    "qwen3_8_no_thinking": _qwen3_5_no_thinking,
    "nemotron_3": _nemotron_3,
    "nemotron_3_no_thinking": functools.partial(_nemotron_3, thinking=False),
    "glm4_moe": _preset(glm4_moe()),
    "glm4_moe_no_thinking": _preset(glm4_moe(thinking=False)),
    "gpt_oss": GptOssProcessor,
    "phi3": _preset(PHI3),
    "cohere": _preset(COHERE),
    "lfm2": _preset(LFM2),
    "deepseek_v3": DeepSeekR1Processor,
    "gemma": Gemma3Processor,
}
"""Registry name -> factory(system_prompt=...). ``llama3_1`` also serves Llama 3.3; ``mistral_tekken`` is V3-Tekken
(NeMo, Pixtral), ``mistral_v7_tekken`` Mistral Small 3.x and later. ``gemma4`` serves every Gemma 4 template TRL
ships (``gemma4``, ``gemma4_v2`` ... ``gemma4_v5``, ``diffusion_gemma``), and ``gemma4_thinking`` all but ``gemma4_v2``,
which ``gemma4_v2_thinking`` serves; ``nemotron_3`` serves Nano, Super, Ultra and
3.5 Lightning; ``phi3`` Phi-3 and 3.5; ``lfm2`` LFM2 and LFM2.5; ``gemma`` Gemma 1 and 2 (no system role: a system
prompt goes into the first user turn, as Gemma 3 writes it). docs/processors.md has the table template -> name."""


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
            "try trl_env.render.processors.from_tokenizer(tokenizer)."
        ) from None
    return factory(system_prompt=system_prompt)


def processor_names() -> tuple[str, ...]:
    """The names ``get_processor`` knows, in registry order (a copy: the registry itself is not public)."""
    return tuple(PROCESSORS)


__all__ = [
    "PROCESSORS",
    "ChatMLProcessor",
    "DeepSeekR1Processor",
    "Gemma3Processor",
    "Gemma4Processor",
    "GptOssProcessor",
    "Llama3Processor",
    "MistralProcessor",
    "Qwen3Processor",
    "TemplateProcessor",
    "from_tokenizer",
    "get_processor",
    "processor_names",
]
