r"""Mistral processor for Tekken tokenizers (Mistral NeMo, Pixtral, Mistral Small 3.x): `<s>[INST]...[/INST]...</s>`.

Follows mistral-common's encoding (``MistralTokenizer.encode_chat_completion``), the reference for
Mistral models, and the chat templates it generates (tools left out). No spaces or newlines
between control tokens; the model's turn ends at `</s>`. System prompts: V7-Tekken and later
(Mistral Small 3, Large 2411) write them once between `[SYSTEM_PROMPT]` tokens at the top.
V3-Tekken (NeMo, Pixtral) has no system tokens: its encoders move the system prompt in front of
the *last* user message at every turn, which no append-only history can do; this processor writes
it in front of the first one (what the model sees at its first turn), so later turns differ from a
re-rendering. Assistant text is right-stripped by mistral-common when it re-renders the history.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl_env.render.processors.base import FamilyProcessor


@dataclass(frozen=True)
class MistralProcessor(FamilyProcessor):
    """Mistral Tekken formatting; ``system_tokens=False`` is the V3-Tekken layout (no `[SYSTEM_PROMPT]`)."""

    system_prompt: str | None = None
    """System message (see the module docstring for where it goes)."""
    system_tokens: bool = True
    """V7-Tekken and later: `[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`; ``False`` (V3): prefix the first user message."""
    stop_strings: tuple[str, ...] = ("</s>",)
    """End-of-turn markers; each must be one token."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a prompted reasoning block (the family has none of its own); ``None`` for no reasoning."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""

    def init_system_input(self, prompt: str) -> str:
        """Render `<s>`, the system prompt (if any), the first user turn."""
        if self.system_prompt is None:
            return f"<s>[INST]{prompt}[/INST]"
        if self.system_tokens:
            return f"<s>[SYSTEM_PROMPT]{self.system_prompt}[/SYSTEM_PROMPT][INST]{prompt}[/INST]"
        return f"<s>[INST]{self.system_prompt}\n\n{prompt}[/INST]"

    def append_user_input(self, prompt: str) -> str:
        """A user turn (the model's turn ended with `</s>`)."""
        return f"[INST]{prompt}[/INST]"
