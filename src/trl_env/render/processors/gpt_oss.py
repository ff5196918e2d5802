r"""gpt-oss processor: OpenAI's harmony format, with reasoning in the analysis channel.

Follows gpt-oss's chat template (tools left out): a system message with the model identity, the
knowledge cutoff, today's date, the reasoning effort and the valid channels; the system prompt goes
into a developer message ("# Instructions"); the generation prompt is `<|start|>assistant`. The model
writes `<|channel|>analysis<|message|>...<|end|>`, then `<|start|>assistant<|channel|>final<|message|>`
and its answer, and ends its turn with `<|return|>` (its EOS). The template re-renders a past turn as
its final message only, closed with `<|end|>` instead of `<|return|>`; the token history keeps what
was sampled (``rendered_stop`` declares the rewrite; ``template_drift`` reports it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trl_env.render.processors.base import FamilyProcessor, ParsedOutput, parse_output

ANALYSIS, FINAL = "<|channel|>analysis<|message|>", "<|channel|>final<|message|>"


@dataclass(frozen=True)
class GptOssProcessor(FamilyProcessor):
    """Harmony formatting: the analysis channel is the reasoning, the final channel the action."""

    rendered_stop = "<|end|>"  # what the template writes after a past reply in place of the sampled `<|return|>`
    reasoning_field = "thinking"  # where the template takes a past turn's analysis from (not channel tags in content)

    system_prompt: str | None = None
    """Written as the developer message's instructions; ``None`` writes no developer message."""
    reasoning_effort: str = "medium"
    """``low``, ``medium`` or ``high`` (the template's ``reasoning_effort`` variable)."""
    date_string: str = field(default_factory=lambda: time.strftime("%Y-%m-%d"))
    """"Current date" in the system message (the template writes today's date)."""
    stop_strings: tuple[str, ...] = ("<|return|>",)
    """End-of-turn markers; each must be one token."""

    def init_system_input(self, prompt: str) -> str:
        """Render the system message, the developer message (if any), the first user turn and `<|start|>assistant`."""
        system = (
            "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
            f"Current date: {self.date_string}\n\nReasoning: {self.reasoning_effort}\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message."
        )
        developer = ""
        if self.system_prompt is not None:
            developer = f"<|start|>developer<|message|># Instructions\n\n{self.system_prompt}\n\n<|end|>"
        return f"<|start|>system<|message|>{system}<|end|>{developer}{self.append_user_input(prompt)}"

    def append_user_input(self, prompt: str) -> str:
        """A user message and `<|start|>assistant` (the model's turn ended with `<|return|>`)."""
        return f"<|start|>user<|message|>{prompt}<|end|><|start|>assistant"

    def parse(self, completion: str) -> ParsedOutput:
        """Split a turn into the analysis channel (reasoning), the final channel (action) and a ``ParseStatus``."""
        parsed = parse_output(
            completion, end_markers=(*self.stop_strings, "<|call|>"), reasoning_tags=(ANALYSIS, "<|end|>")
        )
        _, final, action = parsed.action.rpartition(FINAL)
        return ParsedOutput(parsed.reasoning, action.strip() if final else parsed.action, parsed.status)

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text a model turn with this reasoning and action samples (the inverse of ``parse``)."""
        analysis = f"{ANALYSIS}{reasoning}<|end|><|start|>assistant" if reasoning else ""
        return f"{analysis}{FINAL}{action}"
