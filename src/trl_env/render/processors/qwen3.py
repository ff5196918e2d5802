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

The later ChatML templates with thinking differ only in data, set by the registry: Qwen 3.5, 3.6 and
3.8 trim whitespace around messages and pre-fill `<think>\n` in thinking mode (so a turn starts
inside the block); Qwen 3.8 writes a reasoning-effort system line in thinking mode; Nemotron 3
always writes a system block (empty without a system prompt), pre-fills `<think>\n`, and writes
`<think></think>` without thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl_env.render.processors.base import FamilyProcessor


@dataclass(frozen=True)
class Qwen3Processor(FamilyProcessor):
    """ChatML with thinking: Qwen3, Qwen 3.5/3.6/3.8 and Nemotron 3, whose templates differ only in the fields below."""

    end_markers: ClassVar[tuple[str, ...]] = ("<|endoftext|>",)

    system_prompt: str | None = None
    """System message written before the first user turn; ``None`` writes none (or ``system_preamble``'s block)."""
    thinking: bool = True
    """Thinking mode (the template's default); ``False`` is ``enable_thinking=False``."""
    stop_strings: tuple[str, ...] = ("<|im_end|>",)
    """End-of-turn markers; each must be one token."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<tool_call>", "</tool_call>")``; ``None``: the text after `</think>`."""
    trim: bool = False
    """The template strips whitespace around messages (Qwen 3.5 and later)."""
    open_think: bool = False
    """In thinking mode the generation prompt pre-fills `<think>\\n` (Qwen 3.5 and later, Nemotron 3)."""
    empty_think: str = "<think>\n\n</think>\n\n"
    """What the generation prompt writes without thinking (Nemotron 3: `<think></think>`)."""
    system_preamble: str | None = None
    """A system block the template always writes (Nemotron 3: empty; Qwen 3.8 in thinking mode: its reasoning
    effort line), with the system prompt after a blank line; ``None``: a system block only for a system prompt."""

    def prompt_opens_reasoning(self) -> bool:
        """Whether the generation prompt leaves `<think>` open (thinking mode with ``open_think``)."""
        return self.thinking and self.open_think

    def _clean(self, text: str) -> str:
        return text.strip() if self.trim else text

    def _assistant_header(self) -> str:
        think = ("<think>\n" if self.open_think else "") if self.thinking else self.empty_think
        return "<|im_start|>assistant\n" + think

    def init_system_input(self, prompt: str) -> str:
        """Render the system block (if any), the first user turn and the assistant header."""
        system = ""
        if self.system_prompt is not None or self.system_preamble is not None:
            texts = [self._clean(t) for t in (self.system_preamble, self.system_prompt) if t]
            system = "<|im_start|>system\n" + "\n\n".join(texts) + "<|im_end|>\n"
        return f"{system}<|im_start|>user\n{self._clean(prompt)}<|im_end|>\n{self._assistant_header()}"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<|im_end|>`), then a user turn and the assistant header."""
        return f"\n<|im_start|>user\n{self._clean(prompt)}<|im_end|>\n{self._assistant_header()}"

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text a model turn with this reasoning and action samples (the inverse of ``parse``)."""
        if not self.thinking:
            return action
        opened = "" if self.open_think else "<think>\n"
        return f"{opened}{reasoning}\n</think>\n\n{action}"
