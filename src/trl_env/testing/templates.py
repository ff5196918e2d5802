"""The official chat templates TRL ships (``trl/chat_templates/*.jinja``) on offline stand-in tokenizers.

``trl_template_tokenizer("qwen3_5_think")`` puts TRL's copy of a family's template on Qwen's byte-level
BPE with every family's special tokens added (one cached tokenizer for all templates) and the family's
BOS and EOS tokens set. The template text and the special tokens are real; the merges are Qwen's. Used by
the parity tests over every template and by ``trl-env additivity --offline`` (names ``trl:<template>``).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

VISION_ONLY = {
    "idefics3": "renders only list content ({'type': 'text', ...})",
    "llava_next": "renders only list content ({'type': 'text', ...})",
    "smolvlm": "renders only list content ({'type': 'text', ...})",
}
"""Templates of vision-language models that do not render plain-text messages, and why they are left out."""

_GEMMA4 = ["gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"]
_NEMOTRON = ["nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra", "nemotron_3_5_lightning"]
_OFF: dict[str, object] = {"enable_thinking": False}
NAMED_TEMPLATES: dict[str, list[tuple[str, dict[str, object]]]] = {
    "qwen2_5": [("qwen2_5", {})],
    "qwen2_5_vl": [("qwen2_5_vl", {})],
    "qwen3": [("qwen3", {})],
    "qwen3_no_thinking": [("qwen3", _OFF)],
    "qwen3_instruct_2507": [("qwen3_instruct_2507", {}), ("qwen3_vl", {})],
    "qwen3_5": [("qwen3_5_think", {})],
    "qwen3_5_no_thinking": [("qwen3_5_think", _OFF), ("qwen3_5_nothink", {})],
    "qwen3_6": [("qwen3_6", {})],
    "qwen3_6_no_thinking": [("qwen3_6", _OFF)],
    "qwen3_8": [("qwen3_8", {})],
    "qwen3_8_no_thinking": [("qwen3_8", _OFF)],
    "nemotron_3": [(t, {}) for t in _NEMOTRON],
    "nemotron_3_no_thinking": [(t, _OFF) for t in _NEMOTRON],
    "glm4_moe": [("glm4moe", {})],
    "glm4_moe_no_thinking": [("glm4moe", _OFF)],
    "gpt_oss": [("gptoss", {})],
    "llama3": [("llama3", {})],
    "llama3_1": [("llama3_1", {})],
    "llama3_2": [("llama3_2", {})],
    "gemma": [("gemma", {})],
    "gemma3": [("gemma3", {})],
    "gemma4": [(t, kw) for t in _GEMMA4 for kw in ({}, _OFF)],
    "gemma4_thinking": [(t, {"enable_thinking": True}) for t in _GEMMA4 if t != "gemma4_v2"],
    "gemma4_v2_thinking": [("gemma4_v2", {"enable_thinking": True})],
    "deepseek_r1": [("deepseek_r1_distill", {})],
    "deepseek_v3": [("deepseekv3", {})],
    "phi3": [("phi3", {}), ("phi3_5", {})],
    "cohere": [("cohere", {})],
    "lfm2": [(t, {}) for t in ("lfm2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl")],
}
"""Registry name -> the TRL templates (and template variables) it serves; the template tests check each pair."""

DERIVED_ONLY: dict[str, str] = {
    "cohere2": "Command A's template writes a long default preamble; from_tokenizer serves it",
    "muse_glimmer": "a channel format (to=user/to=self) no family has yet; from_tokenizer serves its turns",
}
"""Official templates with no registry name, and why; ``from_tokenizer`` serves them."""

_TOKEN = re.compile(
    r"<[|｜][^<>\s'\"]{1,40}[|｜]>"  # <|im_end|>, <｜User｜>
    r"|<\|[a-z_]+>|<[a-z_]+\|>"  # Gemma 4's <|turn> and <turn|>
    r"|<(?:start|end)_of_turn>|<sop>|\[gMASK\]"
)
_BOS_EOS = {  # template name prefix -> (bos, eos), as the families' tokenizers set them
    "cohere": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "diffusion_gemma": ("<bos>", "<turn|>"),
    "gemma4": ("<bos>", "<turn|>"),
    "gemma": ("<bos>", "<eos>"),
    "glm4moe": ("[gMASK]", "<|endoftext|>"),
    "gptoss": ("<|startoftext|>", "<|return|>"),
    "lfm2": ("<|startoftext|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "muse_glimmer": ("<|begin_of_text|>", "<|eot|>"),
    "nemotron": ("<s>", "<|im_end|>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "qwen": ("<|endoftext|>", "<|im_end|>"),
}


def templates_dir() -> Path:
    """The installed TRL's ``chat_templates`` folder."""
    import trl

    return Path(trl.__file__).parent / "chat_templates"


def trl_templates(*, text_only: bool = True) -> dict[str, str]:
    """Template name -> template text, for every ``*.jinja`` file TRL ships (sorted; ``_training`` ones included)."""
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(templates_dir().glob("*.jinja"))}
    if text_only:
        found = {n: t for n, t in found.items() if n.removesuffix("_training") not in VISION_ONLY}
    return found


def bos_eos(name: str) -> tuple[str, str]:
    """The BOS and EOS tokens of the family whose template is ``name``."""
    return next(v for k, v in _BOS_EOS.items() if name.startswith(k))


@functools.cache
def _all_tokens() -> tuple[str, ...]:
    found = {t for text in trl_templates(text_only=False).values() for t in _TOKEN.findall(text)}
    found |= {t for pair in _BOS_EOS.values() for t in pair} | {"<think>", "</think>"}  # added tokens in these families
    return tuple(sorted(found))


@functools.cache
def _standin(tokens: tuple[str, ...]) -> Any:
    from trl_env.testing.standin import standin_tokenizer

    return standin_tokenizer(f"trl-templates-{len(tokens)}", list(tokens))


def trl_template_tokenizer(name: str) -> Any:
    """A stand-in tokenizer with TRL's template ``name``, its family's BOS/EOS and every template's special tokens."""
    tokens = _all_tokens()
    tok = copy.deepcopy(_standin(tokens))
    tok.bos_token, tok.eos_token = bos_eos(name)
    tok.chat_template = trl_templates(text_only=False)[name]
    return tok
