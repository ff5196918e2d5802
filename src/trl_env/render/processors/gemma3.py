r"""Gemma 3 processor (Gemma 3 and 3n instruction-tuned models): `<start_of_turn>role\n...<end_of_turn>\n`.

Follows Google's Gemma 3 chat template: `<bos>` first; no system role, so a system prompt is
written at the top of the first user turn followed by a blank line; the assistant's role is
`model`; message text is trimmed (`| trim`, so this processor strips the env text too). The
model's turn ends at `<end_of_turn>`, and the newline the template writes after it opens the text
appended for the next user turn. Gemma 3 has no reasoning block of its own; a prompted `<think>` block is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.render.processors.base import FamilyProcessor


@dataclass(frozen=True)
class Gemma3Processor(FamilyProcessor):
    """Gemma 3 formatting; a system prompt opens the first user turn."""

    end_markers: ClassVar[tuple[str, ...]] = ("<eos>",)

    system_prompt: str | None = None
    """Written (not stripped, as the template) before the first user message, then a blank line."""
    stop_strings: tuple[str, ...] = ("<end_of_turn>",)
    """End-of-turn markers; each must be one token."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a prompted reasoning block (the family has none of its own); ``None`` for no reasoning."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""

    def init_system_input(self, prompt: str) -> str:
        """Render `<bos>`, the first user turn (system prompt on top) and the model header."""
        system = "" if self.system_prompt is None else f"{self.system_prompt}\n\n"
        return f"<bos><start_of_turn>user\n{system}{prompt.strip()}<end_of_turn>\n<start_of_turn>model\n"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<end_of_turn>`), then a user turn and the model header."""
        return f"\n<start_of_turn>user\n{prompt.strip()}<end_of_turn>\n<start_of_turn>model\n"
