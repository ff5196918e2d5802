r"""Families whose turns are fixed text around the messages, stated as data: ``TemplateProcessor`` values.

Each is what ``from_tokenizer`` derives from the official template (TRL 1.16's ``chat_templates``),
written out so that it works by name without a tokenizer; the template tests check each against its
template. ``system_prompt`` is set by the registry's factory.
"""

from __future__ import annotations

from trl_env.render.processors.derived import TemplateProcessor

_CHATML_TURN = ("\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")

PHI3 = TemplateProcessor(
    stop_strings=("<|end|>",),
    first_user=("<|user|>\n", "<|end|>\n<|assistant|>\n"),
    first_user_with_system=("<|system|>\n", "<|end|>\n<|user|>\n", "<|end|>\n<|assistant|>\n"),
    next_user=("\n<|user|>\n", "<|end|>\n<|assistant|>\n"),
)
"""Phi-3 and Phi-3.5 (``phi3.jinja``, ``phi3_5.jinja``)."""

_COHERE_TURN = "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
COHERE = TemplateProcessor(
    stop_strings=("<|END_OF_TURN_TOKEN|>",),
    first_user=("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>", f"{_COHERE_TURN}<|CHATBOT_TOKEN|>"),
    first_user_with_system=(
        "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>",
        f"{_COHERE_TURN}<|USER_TOKEN|>",
        f"{_COHERE_TURN}<|CHATBOT_TOKEN|>",
    ),
    next_user=("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", f"{_COHERE_TURN}<|CHATBOT_TOKEN|>"),
    strip_messages=True,
)
"""Cohere Command-R (``cohere.jinja``): user messages trimmed, the system message not."""

LFM2 = TemplateProcessor(
    stop_strings=("<|im_end|>",),
    first_user=("<|startoftext|><|im_start|>user\n", _CHATML_TURN[1]),
    first_user_with_system=("<|startoftext|><|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n", _CHATML_TURN[1]),
    next_user=_CHATML_TURN,
)
"""Liquid LFM2 and LFM2.5 (``lfm2*.jinja``): ChatML after `<|startoftext|>`."""


def glm4_moe(thinking: bool = True) -> TemplateProcessor:
    """GLM-4.5/4.6 MoE (``glm4moe.jinja``): the model ends its turn by sampling the next `<|user|>` header.

    Without thinking, the user turn ends with ``/nothink`` and the prompt pre-fills an empty think block.
    """
    after = "<|assistant|>" if thinking else "/nothink<|assistant|>\n<think></think>"
    return TemplateProcessor(
        stop_strings=("<|user|>",),
        first_user=("[gMASK]<sop><|user|>\n", after),
        first_user_with_system=("[gMASK]<sop><|system|>\n", "<|user|>\n", after),
        next_user=("\n", after),
    )
