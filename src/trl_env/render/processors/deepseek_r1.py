r"""DeepSeek-R1 processor (R1 and its Qwen/Llama distills): `<｜User｜>...<｜Assistant｜><think>\n`.

Follows the DeepSeek-R1 chat template (tools left out): BOS, the system prompt right after it
with no separator, then `<｜User｜>` and `<｜Assistant｜>` markers with no newlines between turns;
the generation prompt opens the reasoning (`<think>\n`), so a turn is reasoning up to `</think>`,
then the answer, then `<｜end▁of▁sentence｜>` (the EOS, and the stop token). The template
re-renders earlier answers without their reasoning; the token history keeps what was sampled (see
``trl_env.render.processors.qwen3`` for why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.render.processors.base import FamilyProcessor

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


@dataclass(frozen=True)
class DeepSeekR1Processor(FamilyProcessor):
    """DeepSeek-R1 formatting; every generation prompt opens a `<think>` block."""

    reasoning_open_in_prompt: ClassVar[bool] = True

    system_prompt: str | None = None
    """Written right after BOS, with no separator (as the template)."""
    stop_strings: tuple[str, ...] = (EOS,)
    """End-of-turn markers; each must be one token."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after `</think>`."""

    def init_system_input(self, prompt: str) -> str:
        """Render BOS, the system prompt, the first user turn and the assistant header with `<think>` opened."""
        return f"{BOS}{self.system_prompt or ''}{self.append_user_input(prompt)}"

    def append_user_input(self, prompt: str) -> str:
        """A user turn and the assistant header (the model's turn ended with its EOS)."""
        return f"<｜User｜>{prompt}<｜Assistant｜><think>\n"

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text a model turn with this reasoning and action samples (the inverse of ``parse``)."""
        return f"{reasoning}\n</think>\n\n{action}"
