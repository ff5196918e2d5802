"""What flows between a tool-calling processor and a tool env: calls in an action, results in a delta.

Both are ``str`` subclasses, so the seed's protocols stay as they are (an action and a delta are text)
and an env or a processor that knows nothing of tools still works: ``ToolCalls`` is the text of the
turn's reply, ``ToolResults`` the results joined for transcripts. A tool-aware processor renders a
``ToolResults`` delta as the template renders ``tool`` messages; a tool env reads ``ToolCalls.calls``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote, parsed; ``error`` says why it could not be (``name`` may then be ``"unknown"``)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""
    """Non-empty when the call was malformed (e.g. its arguments are not JSON): it is reported, not run."""


@dataclass(frozen=True)
class ToolResult:
    """What one call returned (or why it failed), as the text the model sees."""

    name: str
    content: str
    ok: bool = True
    """``False`` for an error observation (malformed call, unknown tool, bad arguments, exception, timeout)."""


class ToolCalls(str):
    """An action with tool calls: the reply's text content, with ``calls`` in the order the model wrote them."""

    calls: tuple[ToolCall, ...]

    def __new__(cls, content: str, calls: tuple[ToolCall, ...] | list[ToolCall]) -> ToolCalls:
        """``content`` is the reply's text besides the calls."""
        self = super().__new__(cls, content)
        self.calls = tuple(calls)
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # keeps ``calls`` across a process boundary (process executor)
        return (ToolCalls, (str(self), self.calls))


class ToolResults(str):
    """A delta made of tool results, one per call and in the calls' order; rendered as the template's ``tool`` turns."""

    results: tuple[ToolResult, ...]

    def __new__(cls, results: tuple[ToolResult, ...] | list[ToolResult]) -> ToolResults:
        """The results, in the order of the calls they answer."""
        results = tuple(results)
        self = super().__new__(cls, "\n".join(f"[{r.name}] {r.content}" for r in results))
        self.results = results
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (ToolResults, (self.results,))

    def with_contents(self, contents: list[str]) -> ToolResults:
        """The same results with other contents (the engine renders sentinels to find the env text)."""
        return ToolResults([ToolResult(r.name, c, r.ok) for r, c in zip(self.results, contents, strict=True)])
