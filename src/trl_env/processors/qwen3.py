r"""Qwen3 processor (hybrid thinking models such as Qwen3-0.6B ... Qwen3-32B), in thinking and non-thinking mode.

Follows Qwen3's chat template: ChatML turns; in non-thinking mode (``enable_thinking=False``) the
generation prompt ends with an empty `<think>\n\n</think>\n\n` block, in thinking mode the model
opens `<think>` itself. Earlier turns: the template re-renders every assistant turn before the
last user message **without** its `<think>` block (and without the empty one of non-thinking
mode). trl-env never re-renders: the token history keeps every turn exactly as it was sampled,
reasoning included, because that is the context the sampler conditioned on. Training on the
template's shortened history would score tokens against a context the model never saw (off-policy
logprobs, TRL #4543), and would break the prefix property, turning one episode into one sequence
per turn. The cost: contexts grow with earlier reasoning, and at deployment the template shows the
model less than it saw in training. ``trl-env additivity`` measures this drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.processors.base import FamilyProcessor


@dataclass(frozen=True)
class Qwen3Processor(FamilyProcessor):
    """Qwen3 formatting; ``thinking=False`` writes the template's empty think block into each generation prompt."""

    end_markers: ClassVar[tuple[str, ...]] = ("<|endoftext|>",)

    system_prompt: str | None = None
    """System message written before the first user turn; ``None`` writes none (as the template)."""
    thinking: bool = True
    """Thinking mode (the template's default); ``False`` is ``enable_thinking=False``."""
    stop_strings: tuple[str, ...] = ("<|im_end|>",)
    """End-of-turn markers; each must be one token."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<tool_call>", "</tool_call>")``; ``None``: the text after `</think>`."""

    def _assistant_header(self) -> str:
        return "<|im_start|>assistant\n" + ("" if self.thinking else "<think>\n\n</think>\n\n")

    def init_system_input(self, prompt: str) -> str:
        """Render the system block (if any), the first user turn and the assistant header."""
        system = "" if self.system_prompt is None else f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n"
        return f"{system}<|im_start|>user\n{prompt}<|im_end|>\n{self._assistant_header()}"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<|im_end|>`), then a user turn and the assistant header."""
        return f"\n<|im_start|>user\n{prompt}<|im_end|>\n{self._assistant_header()}"

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text a model turn with this reasoning and action samples (the inverse of ``parse``)."""
        return f"<think>\n{reasoning}\n</think>\n\n{action}" if self.thinking else action
