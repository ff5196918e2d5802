"""``ToolProcessor``: the seed's Processor for a model's native tool calls, in the format its template defines.

Example::

    processor = ToolProcessor.from_tokenizer(tokenizer, tools=[add, look_up], system_prompt="Use the tools.")
    processor.init_system_input("What is 2 + 3?")  # the template's opening, with the tools listed
    reasoning, action = processor.parse_agent_output(reply_text)  # action: ToolCalls when the reply calls tools
    processor.append_user_input(ToolResults([...]))  # the template's tool turns after the call
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_env.render.processors.base import FamilyProcessor, ParsedOutput, ParseStatus, StopStrings
from trl_env.render.tools.format import ToolFormat
from trl_env.render.tools.types import ToolCall, ToolCalls, ToolResults


@dataclass(frozen=True)
class ToolProcessor:
    """Renders and parses in a template's tool-calling format; text turns go to its base processor."""

    format: ToolFormat

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        tools: Sequence[Callable[..., Any] | Mapping[str, Any]],
        *,
        system_prompt: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ToolProcessor:
        """The processor for ``tokenizer``'s chat template with ``tools`` (functions or JSON schemas).

        Raises:
            ProcessorError: the template has no tool calling trl-env can read (the message says why).
        """
        return cls(ToolFormat.read(tokenizer, tools, system_prompt=system_prompt, template_kwargs=template_kwargs))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The base processor's end-of-turn tokens, and the token that ends a call."""
        base = self.format.base.stop_strings if isinstance(self.format.base, StopStrings) else ()
        return tuple(dict.fromkeys((*base, self.format.call_stop)))

    def init_system_input(self, prompt: str) -> str:
        """The template's opening with the tools listed, around the env's first observation."""
        return self.format.base.init_system_input(prompt)

    def append_user_input(self, prompt: str) -> str:
        """Tool results as the template's tool turns; any other text as the next user turn."""
        if isinstance(prompt, ToolResults):
            return "".join(text for text, _ in self.format.result_segments(prompt))
        return self.format.base.append_user_input(prompt)

    def append_segments(self, delta: ToolResults) -> list[tuple[str, bool]]:
        """``append_user_input(delta)`` in pieces, each marked env text or not (env text is tokenised as plain text)."""
        return self.format.result_segments(delta)

    def parse(self, completion: str) -> ParsedOutput:
        """Split a reply into reasoning and action; a reply with calls gives a ``ToolCalls`` action.

        Statuses: ``tool_call`` (calls parsed), ``malformed_tool_call`` (a call opened and did not parse: the
        action holds one call with its ``error``), else the base processor's status for a text reply.
        """
        base = self.format.base
        if isinstance(base, FamilyProcessor):
            text = base.parse(completion.replace(self.format.call_stop, base.turn_end_markers()[0], 1))
        else:
            reasoning, action = base.parse_agent_output(completion)
            text = ParsedOutput(reasoning, action, ParseStatus.OK)
        calls = self.format.parse_calls(completion)
        if calls is None:
            error = ToolCall("unknown", {}, error=f"the tool call could not be parsed: {completion[-200:]!r}")
            return ParsedOutput(text.reasoning, ToolCalls(text.action, [error]), ParseStatus.MALFORMED_TOOL_CALL)
        if calls:
            content = text.action.split(self.format.call_marker, 1)[0].strip()
            return ParsedOutput(text.reasoning, ToolCalls(content, calls), ParseStatus.TOOL_CALL)
        return text

    def parse_agent_output(self, completion: str) -> tuple[str, str]:
        """``(reasoning, action)``; the action is a ``ToolCalls`` when the reply calls tools."""
        parsed = self.parse(completion)
        return parsed.reasoning, parsed.action
