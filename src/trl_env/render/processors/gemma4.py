r"""Gemma 4 processor: `<|turn>role\n...<turn|>\n`, thinking in `<|channel>thought\n...<channel|>`.

Follows Google's Gemma 4 chat template as TRL 1.16 ships it in all its variants (``gemma4.jinja``,
``gemma4_v2`` ... ``gemma4_v5``, and ``diffusion_gemma``, which render plain turns alike; tools
left out): `<bos>`, then a system turn when there is a system prompt or thinking is on (thinking
writes `<|think|>\n` at its top; `gemma4_v2` writes no newline), message text trimmed, the
assistant's role `model`, the generation prompt `<|turn>model\n` with or without thinking. The
model's turn ends at `<turn|>`. Like Qwen3's, the template re-renders earlier model turns without
their thought channel; the token history keeps what was sampled (see ``trl_env.render.processors.qwen3`` for why).
"""

from __future__ import annotations

from dataclasses import dataclass

from trl_env.render.processors.base import FamilyProcessor, ParsedOutput, parse_output


@dataclass(frozen=True)
class Gemma4Processor(FamilyProcessor):
    """Gemma 4 formatting with or without thinking."""

    system_prompt: str | None = None
    """System message; stripped, as the template does."""
    thinking: bool = False
    """``enable_thinking=True``: `<|think|>` at the top of the system turn; the model opens its own thought channel."""
    think_marker: str = "<|think|>\n"
    """What thinking writes at the top of the system turn (``gemma4_v2.jinja``: no newline)."""
    stop_strings: tuple[str, ...] = ("<turn|>",)
    """End-of-turn markers; each must be one token."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the thought."""

    def init_system_input(self, prompt: str) -> str:
        """Render `<bos>`, the system turn (if any), the first user turn and the model header."""
        system = ""
        if self.thinking or self.system_prompt is not None:
            think = self.think_marker if self.thinking else ""
            system = f"<|turn>system\n{think}{(self.system_prompt or '').strip()}<turn|>\n"
        return f"<bos>{system}<|turn>user\n{prompt.strip()}<turn|>\n<|turn>model\n"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<turn|>`), then a user turn and the model header."""
        return f"\n<|turn>user\n{prompt.strip()}<turn|>\n<|turn>model\n"

    def parse(self, completion: str) -> ParsedOutput:
        """Split a turn into reasoning (the thought channel), action and a ``ParseStatus``."""
        parsed = parse_output(
            completion,
            end_markers=(*self.stop_strings, "<eos>"),
            reasoning_tags=("<|channel>", "<channel|>"),
            action_tags=self.action_tags,
        )
        reasoning = parsed.reasoning.removeprefix("thought").strip()  # the channel's name is not reasoning
        return ParsedOutput(reasoning, parsed.action, parsed.status)

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text a model turn with this reasoning and action samples (the inverse of ``parse``)."""
        return f"<|channel>thought\n{reasoning}<channel|>{action}" if self.thinking else action
