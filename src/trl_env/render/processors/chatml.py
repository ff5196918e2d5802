r"""ChatML processor: Qwen2.5, SmolLM2 and other models whose template writes `<|im_start|>role\\n...<|im_end|>\\n`.

Follows the ChatML layout of Qwen2.5's and SmolLM2's chat templates (both write a default system
prompt when there is none: see ``QWEN2_5_SYSTEM_PROMPT`` and ``SMOLLM2_SYSTEM_PROMPT``, used by the
registry). The model's turn ends at `<|im_end|>` (its sampled stop token), so the newline the
template writes after it opens the text the engine appends for the next user turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.render.processors.base import FamilyProcessor

QWEN2_5_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
"""What Qwen2.5-Instruct's template writes when the conversation has no system message."""
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""What SmolLM2-Instruct's template writes when the conversation has no system message."""


@dataclass(frozen=True)
class ChatMLProcessor(FamilyProcessor):
    """ChatML formatting with an optional system prompt and `<think>` reasoning blocks."""

    end_markers: ClassVar[tuple[str, ...]] = ("<|endoftext|>",)

    system_prompt: str | None = None
    """System message written before the first user turn; ``None`` writes no system block."""
    stop_strings: tuple[str, ...] = ("<|im_end|>",)
    """End-of-turn markers; each must be one token."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""

    def init_system_input(self, prompt: str) -> str:
        """Render the system block (if any), the first user turn and the assistant header."""
        system = "" if self.system_prompt is None else f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n"
        return f"{system}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<|im_end|>`), then a user turn and the assistant header."""
        return f"\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
