r"""Llama 3.x Instruct processor (Llama 3, 3.1, 3.2, 3.3): `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`.

Follows Meta's chat templates (tools left out): the template writes `<|begin_of_text|>` and trims
every message (`| trim`), so this processor strips the env text too. Llama 3.1 and later always
write a system block that starts with "Cutting Knowledge Date: December 2023" and "Today Date:"
(3.1/3.3: "26 Jul 2024"; 3.2: the current date, from transformers' ``strftime_now``); Llama 3.0
writes a system block only for a system prompt. The model's turn ends at `<|eot_id|>`, and the
template writes nothing between it and the next header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.render.processors.base import FamilyProcessor

LLAMA3_1_DATE = "26 Jul 2024"
"""The "Today Date" the Llama 3.1 and 3.3 templates write unless ``date_string`` is passed."""


@dataclass(frozen=True)
class Llama3Processor(FamilyProcessor):
    """Llama 3.x formatting; ``date_string=None`` is Llama 3.0's template (no dated system block)."""

    end_markers: ClassVar[tuple[str, ...]] = ("<|eom_id|>", "<|end_of_text|>")

    system_prompt: str | None = None
    """System message; stripped, as the template does."""
    date_string: str | None = LLAMA3_1_DATE
    """"Today Date" of the 3.1+ system block; ``None`` for Llama 3.0, which has no such block."""
    stop_strings: tuple[str, ...] = ("<|eot_id|>",)
    """End-of-turn markers; each must be one token."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a prompted reasoning block (the family has none of its own); ``None`` for no reasoning."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""

    def init_system_input(self, prompt: str) -> str:
        """Render `<|begin_of_text|>`, the system block (if any), the first user turn and the assistant header."""
        system = "" if self.system_prompt is None else self.system_prompt.strip()
        if self.date_string is not None:
            system = f"Cutting Knowledge Date: December 2023\nToday Date: {self.date_string}\n\n{system}"
        block = "" if self.system_prompt is None and self.date_string is None else _turn("system", system)
        return f"<|begin_of_text|>{block}{_turn('user', prompt.strip())}{_HEADER}"

    def append_user_input(self, prompt: str) -> str:
        """The next user turn and the assistant header (the model's turn ended with `<|eot_id|>`)."""
        return f"{_turn('user', prompt.strip())}{_HEADER}"


_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def _turn(role: str, content: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
