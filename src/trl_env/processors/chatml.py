r"""ChatML processor: Qwen2.5, SmolLM2 and other models whose template writes `<|im_start|>role\\n...<|im_end|>\\n`.

Follows the ChatML layout of Qwen2.5's and SmolLM2's chat templates. The model's turn ends at
`<|im_end|>` (its sampled stop token), so the newline the template writes after it opens the
text the engine appends for the next user turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl_env.processor import split_reasoning


@dataclass(frozen=True)
class ChatMLProcessor:
    """ChatML formatting with an optional system prompt and `<think>` reasoning blocks."""

    system_prompt: str | None = None
    """System message written before the first user turn; ``None`` writes no system block."""
    stop_strings: tuple[str, ...] = ("<|im_end|>",)
    """End-of-turn markers; each must be one token."""

    def init_system_input(self, prompt: str) -> str:
        """Render the system block (if any), the first user turn and the assistant header."""
        system = "" if self.system_prompt is None else f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n"
        return f"{system}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

    def append_user_input(self, prompt: str) -> str:
        """Close the model's turn (it stopped at `<|im_end|>`), then a user turn and the assistant header."""
        return f"\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

    def parse_agent_output(self, completion: str) -> tuple[str, str]:
        """Split a turn into (reasoning in `<think>...</think>`, the rest), without the end marker."""
        return split_reasoning(completion, strip=self.stop_strings)
