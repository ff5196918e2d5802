"""Chat messages as chat templates take them: the message type, where reasoning travels, a tool call's arguments."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Message = dict[str, Any]
"""A chat message: ``role``, ``content``; an assistant's ``tool_calls`` (and reasoning, in the template's field); a
tool result's ``tool_call_id`` and ``name``."""

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
"""The message fields chat pipelines send a past reply's reasoning in, in the order they are looked for."""


def call_arguments(arguments: Mapping[str, Any] | str, *, as_text: bool) -> dict[str, Any] | str:
    """A tool call's arguments as a template takes them: JSON text where it wants text (DeepSeek V3), else a dict.

    JSON text is written as a chat pipeline writes it (``ensure_ascii=False``); text that is no JSON object stays as
    written where a dict is wanted (the template shows it as the model wrote it).
    """
    if as_text:
        return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return dict(arguments)
