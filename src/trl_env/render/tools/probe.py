"""Probe conversations rendered through a chat template with tools: what ``ToolFormat.read`` reads the format off."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trl_env.errors import ProcessorError
from trl_env.render.messages import call_arguments
from trl_env.render.processors.derived import first_difference

USER = "Xq7 tool user"
SENTINEL = "Rz8result{}"
CALL_ID = "call_{}"
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "pk7_lookup",
            "description": "Look a query up.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "pk7_note",
            "description": "Write a note.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "pk7_values",
            "description": "Take a value of every kind.",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "word": {"type": "string"},
                    "note": {"type": "string", "nullable": True},
                    "count": {"type": "integer"},
                    "limit": {"type": "integer", "nullable": True},
                    "flag": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "nested": {"type": "object"},
                },
                "required": ["text", "word", "note", "count", "limit", "flag", "ratio", "nested"],
            },
        },
    },
]
Calls = list[tuple[str, dict[str, Any]]]
ONE_CALL: Calls = [("pk7_lookup", {"query": "Vq9 Paris, France", "limit": 37})]
TWO_CALLS: Calls = [("pk7_note", {"text": 'Vq9 said "hi"'}), ("pk7_lookup", {"query": "Vq9 two words", "limit": 12})]
VALUES_CALL: Calls = [
    (
        "pk7_values",
        {
            "text": 'Vq9 it\'s "q", {b: [1]}\nnaïve 東京',
            "word": "null",
            "note": None,
            "count": -7,
            "limit": None,
            "flag": False,
            "ratio": 0.5,
            "nested": {"xs": ["a", "b, c"], "on": True, "off": None, "n": [1, 2.5]},
        },
    )
]
PROBE_CALLS: list[Calls] = [ONE_CALL, VALUES_CALL, TWO_CALLS, TWO_CALLS + VALUES_CALL]
"""The replies a parser must read back: one call, every kind of argument value (``word`` and ``note`` are what
only the schema tells apart in bare text), two and three calls (for templates that render several)."""
CONTENT_PROBE = ' Vq9 a "quoted" word\n\\ é '


class Probe:
    """Renders probe conversations with tool calls through the template."""

    def __init__(
        self, tokenizer: Any, conversation: tuple[Mapping[str, Any], ...], kwargs: Mapping[str, Any], **options: bool
    ) -> None:
        self.tokenizer, self.conversation, self.kwargs = tokenizer, [dict(m) for m in conversation], dict(kwargs)
        self.args_as_text = options.get("args_as_text", False)
        self.parallel = options.get("parallel", True)
        if "args_as_text" not in options:
            try:
                self.render(self.assistant(ONE_CALL), tools=PROBE_TOOLS)
            except TypeError:  # DeepSeek V3's template concatenates the arguments as a string
                self.args_as_text = True

    def assistant(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """An assistant message with these calls, each with an ``id`` as chat pipelines write them.

        The arguments are a JSON string where the template wants one (DeepSeek V3).
        """
        tool_calls = [
            {
                "id": CALL_ID.format(i),
                "type": "function",
                "function": {"name": n, "arguments": call_arguments(a, as_text=self.args_as_text)},
            }
            for i, (n, a) in enumerate(calls)
        ]
        return [{"role": "assistant", "content": "", "tool_calls": tool_calls}]

    @staticmethod
    def results(names: Sequence[str], contents: Sequence[str]) -> list[dict[str, Any]]:
        """``tool`` messages answering the calls of ``assistant``, in order, each with its call's id and name.

        Gemma 4 names a result by its ``tool_call_id``: without ids, every result gets the last call's name.
        """
        return [
            {"role": "tool", "tool_call_id": CALL_ID.format(i), "name": n, "content": c}
            for i, (n, c) in enumerate(zip(names, contents, strict=True))
        ]

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], generation: bool = False) -> str:
        """The template's text for the probe conversation followed by ``messages``."""
        return str(
            self.tokenizer.apply_chat_template(
                self.conversation + messages,
                tools=tools,
                tokenize=False,
                add_generation_prompt=generation,
                **self.kwargs,
            )
        )

    def with_results(
        self, names: Sequence[str], contents: Sequence[str], tools: list[dict[str, Any]]
    ) -> tuple[str, str]:
        """The rendering up to the calls (no generation prompt) and with the results (with it)."""
        called = names if self.parallel else names[:1]  # a template with one call per reply: results follow it
        messages = self.assistant([(n, {}) for n in called]) + self.results(names, contents)
        return self.render([], tools=tools), self.render(messages, tools=tools, generation=True)

    def after_stop(
        self, names: Sequence[str], contents: Sequence[str], stop: str, *, tools: list[dict[str, Any]]
    ) -> str:
        """What the template writes after the first ``stop`` that follows the conversation, with these results."""
        before, full = self.with_results(names, contents, tools)
        at = full.find(stop, first_difference(before, full))
        if at < 0 or not full.startswith(before[: first_difference(before, full)]):
            raise ProcessorError(f"the chat template writes no {stop!r} after a tool call: {full[-300:]!r}")
        return full[at + len(stop) :]

    def call_stop(self) -> str:
        """The special token that ends the model's calls.

        After the call's last argument, the rendering of the reply alone and the rendering with its result
        share a tail: its last special token (Qwen's ``<|im_end|>``, Gemma 4's ``<|tool_response>``); without one
        there, the first special token the template writes after that tail when a result follows (GLM's
        ``<|observation|>``).
        """
        calls = ONE_CALL
        last_value = str(calls[0][1]["limit"])
        alone = self.render(self.assistant(calls), tools=PROBE_TOOLS)
        results = self.results([calls[0][0]], [SENTINEL.format(0)])
        full = self.render(self.assistant(calls) + results, tools=PROBE_TOOLS, generation=True)
        alone_tail = alone[alone.rfind(last_value) :]
        start = full.rfind(last_value, 0, full.find(SENTINEL.format(0)))
        full_tail = full[start:]
        shared = first_difference(alone_tail, full_tail)
        spans = special_spans(self.tokenizer, full_tail)
        inside = [s for s in spans if s[1] <= shared]
        after = [s for s in spans if s[0] >= shared and s[1] <= full_tail.find(SENTINEL.format(0))]
        chosen = inside[-1] if inside else after[0] if after else None
        if chosen is None:
            raise ProcessorError(
                f"the chat template writes no special token between a tool call and its result ({full_tail!r:.200}); "
                "trl-env needs one to stop the model on."
            )
        return full_tail[chosen[0] : chosen[1]]

    def renders_parallel(self) -> bool:
        """Whether the template writes every call of a reply with two (Llama 3.1 refuses, gpt-oss keeps the first)."""
        calls = TWO_CALLS
        try:
            text = self.render(self.assistant(calls), tools=PROBE_TOOLS)
        except Exception:  # noqa: BLE001  # Llama 3.1: "This model only supports single tool-calls at once!"
            return False
        firsts = [next(iter(args.values())) for _, args in calls]
        return all(v in text or json.dumps(v)[1:-1] in text for v in firsts)

    def reply(self, calls: list[tuple[str, dict[str, Any]]], stop: str) -> str:
        """The template's rendering of a reply with ``calls``, from where it leaves the generation prompt to ``stop``.

        ``stop`` is added where the template writes it only when results follow (GLM's ``<|observation|>``).
        """
        prompt = self.render([], tools=PROBE_TOOLS, generation=True)
        full = self.render(self.assistant(calls), tools=PROBE_TOOLS)
        start = first_difference(prompt, full)
        if start < len(prompt):  # the rendering of a past reply differs inside the prompt: start at a token boundary
            start = max([end for _, end in special_spans(self.tokenizer, full[:start])], default=start)
        end = full.find(stop, start)
        return full[start:] + stop if end < 0 else full[start : end + len(stop)]

    def content_form(self) -> str:
        """How the template writes a result's text: ``verbatim``, ``strip`` or ``json``."""
        name = ONE_CALL[0][0]
        _, full = self.with_results([name], [CONTENT_PROBE], PROBE_TOOLS)
        if CONTENT_PROBE in full:
            return "verbatim"
        if CONTENT_PROBE.strip() in full:
            return "strip"
        if json.dumps(CONTENT_PROBE, ensure_ascii=False) in full:
            return "json"
        raise ProcessorError(
            f"the chat template changes a tool result's text beyond trimming or quoting: {full!r:.300}"
        )


def special_spans(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds special tokens (as the tokenizer marks them), as (start, end) spans."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {})
    tokens = {str(t) for t in decoder.values() if getattr(t, "special", False)} | set(tokenizer.all_special_tokens)
    tokens = {t for t in tokens if t}
    if not tokens:
        return []
    pattern = re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True))))
    return [m.span() for m in pattern.finditer(text)]
