"""What a turn is sampled from: the tokens as sampled (``"sampled"``) or the template's own rendering (``"deployed"``).

``DeployedHistory`` renders each turn's prompt with the tokenizer's chat template (``apply_chat_template`` of the
messages so far, with the generation prompt), so earlier reasoning is dropped or rewritten exactly as the model's
deployment does; env text stays plain text. See docs/history.md for the trade-off and the rows it produces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trl_env.calling.processor import ToolProcessor
from trl_env.errors import ConfigError, EpisodeFailure, ProcessorError
from trl_env.processors.base import FamilyProcessor, Processor, StopStrings
from trl_env.processors.derived import mismatch, render

__all__ = ["DeployedHistory", "History", "Message"]

Message = dict[str, str]
_MARK = "TRLENVHISTORY5b1e{}Q"  # plain text no template rewrites; locates each env text in a rendering
_MARKS = re.compile(r"TRLENVHISTORY5b1e(\d+)Q")


class History(str, Enum):
    """Which context each model turn is sampled from, and trained on."""

    SAMPLED = "sampled"
    """Every token as sampled: one row per episode, each turn appended to the last (the default)."""
    DEPLOYED = "deployed"
    """The chat template's rendering of the conversation so far, as the deployed model sees it: one row per turn,
    turns merged where a context extends the previous row verbatim."""


def as_history(history: History | str) -> History:
    """``history`` as a ``History``.

    Raises:
        ConfigError: naming the value and the choices.
    """
    try:
        return History(history)
    except ValueError:
        raise ConfigError(
            f"history={history!r}: use 'sampled' (every token as sampled, one row per episode) or 'deployed' (each "
            "turn's prompt is the chat template's rendering of the conversation so far)."
        ) from None


@dataclass(frozen=True)
class DeployedHistory:
    """Renders and tokenises the conversation so far as the chat template does; env text never becomes a special token.

    Built by ``check``, which refuses what it cannot render exactly. ``encode`` runs on worker threads.
    """

    tokenizer: Any
    processor: Processor
    template_kwargs: Mapping[str, Any]
    text: Any
    """The engine's ``EnvText`` (trl-env's own tokenizer copy; ``segments`` keeps env text plain)."""

    @classmethod
    def check(
        cls, processor: Processor, tokenizer: Any, text: Any, template_kwargs: Mapping[str, Any] | None = None
    ) -> DeployedHistory:
        """A ``DeployedHistory`` for ``processor`` and ``tokenizer``'s chat template, or the reason there is none.

        Raises:
            ConfigError: the tokenizer has no chat template, the processor calls tools (not rendered as history
                yet), or the processor renders unlike the template at the generation boundary (the reply would be
                parsed with other markers than the prompt it was sampled from).
        """
        name = type(processor).__name__
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "history='deployed' renders every turn with the tokenizer's chat template, and "
                f"{type(tokenizer).__name__} has none; set tokenizer.chat_template or use history='sampled'."
            )
        if isinstance(processor, ToolProcessor):
            raise ConfigError(
                f"history='deployed' does not render tool calls and tool results as history yet ({name}); use "
                "history='sampled' for tool envs."
            )
        kwargs = dict(template_kwargs or {})
        problem = mismatch(processor, tokenizer, kwargs, system=getattr(processor, "system_prompt", None))
        if problem is not None:
            raise ConfigError(
                f"history='deployed': {name} renders unlike the tokenizer's chat template with "
                f"template_kwargs={kwargs} ({problem}), so a turn would be parsed unlike the prompt it was sampled "
                "from. Pass the "
                "template_kwargs the processor was built for (e.g. {'enable_thinking': False}), or use "
                "from_tokenizer(tokenizer, template_kwargs=...)."
            )
        return cls(tokenizer, processor, kwargs, text)

    def opening(self, observation: str) -> list[Message]:
        """The conversation before the first turn: the processor's system prompt (if any) and the observation."""
        system = getattr(self.processor, "system_prompt", None)
        head = [] if system is None else [{"role": "system", "content": system}]
        return [*head, {"role": "user", "content": observation}]

    def reply(self, text: str) -> Message:
        """The sampled turn as an assistant message: its text without the end-of-turn token(s) the template writes.

        Where the template reads reasoning from a field of its own (gpt-oss), the reply is split with the processor.
        """
        stops = [str(s) for s in getattr(self.processor, "stop_strings", ())] if isinstance(
            self.processor, StopStrings) else []  # fmt: skip
        eos = str(getattr(self.tokenizer, "eos_token", None) or "")
        for stop in [*stops, eos]:
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
                break
        family = self.processor if isinstance(self.processor, FamilyProcessor) else None
        if family is not None and family.reply_end and text.endswith(family.reply_end):
            text = text[: -len(family.reply_end)]
        if family is not None and family.reasoning_field is not None:
            parsed = family.parse(text)
            return {"role": "assistant", "content": parsed.action, family.reasoning_field: parsed.reasoning}
        return {"role": "assistant", "content": text}

    def encode(self, messages: list[Message]) -> list[int]:
        """The ids of the template's rendering of ``messages`` with the generation prompt; env text kept plain.

        Without an added token's text in any user message, the rendering is tokenised whole (exactly
        ``apply_chat_template(..., tokenize=True)``). Otherwise each user message is located in the rendering (by
        rendering markers in their place) and tokenised as plain text, the template's text around it as usual.

        Raises:
            EpisodeFailure: ``processor_error`` when the template fails or writes an env text holding special-token
                text other than verbatim (or stripped).
        """
        rendered = _render(self.tokenizer, messages, self.template_kwargs)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        added = self.text._added  # noqa: SLF001  # the engine's added-token pattern, shared on purpose
        if added is None or not any(added.search(messages[i]["content"]) for i in users):
            return list(self.text.encode(rendered))
        marked = [dict(m, content=_MARK.format(i)) if i in users else m for i, m in enumerate(messages)]
        parts = _MARKS.split(_render(self.tokenizer, marked, self.template_kwargs))
        for strip in (False, True):
            pieces: list[tuple[str, bool]] = []
            for k, part in enumerate(parts):
                if k % 2 == 0:
                    pieces.append((part, False))
                else:
                    content = messages[int(part)]["content"]
                    pieces.append((content.strip() if strip else content, True))
            if "".join(p for p, _ in pieces) == rendered:
                return list(self.text.segments(pieces))
        raise EpisodeFailure(
            "processor_error",
            ProcessorError(
                "history='deployed': the chat template writes an env text that holds special-token text other than "
                "verbatim (or stripped), so trl-env cannot keep it plain text; last env text "
                f"{messages[-1]['content']!r:.80}."
            ),
        )


def _render(tokenizer: Any, messages: list[Message], kwargs: Mapping[str, Any]) -> str:
    try:
        return render(tokenizer, messages, kwargs)
    except Exception as e:  # noqa: BLE001  # a template that refuses this conversation fails its episode
        raise EpisodeFailure(
            "processor_error", ProcessorError(f"the chat template failed: {type(e).__name__}: {e}")
        ) from e
