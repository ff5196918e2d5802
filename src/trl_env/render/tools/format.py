"""A chat template's native tool-calling format, read off the template itself: ``ToolFormat.read``.

trl-env renders at the generation boundary, so from a template with tools it needs:

1. the opening with the tools listed as the template lists them (``from_tokenizer`` with ``tools=``);
2. the token the model stops on after its calls (``call_stop``: Qwen's ``<|im_end|>``, gpt-oss's ``<|call|>``,
   GLM's ``<|observation|>``, Gemma 4's ``<|tool_response>``) and the text the template writes after it for
   the results, rendered for the called tools' names (``result_segments``);
3. a reader for a reply's calls: the response template the tokenizer ships, else the first of TRL's response
   templates (``trl.chat_template_utils``) that gives back the calls of the template's own renderings of probe
   calls (one to three calls with ids, every kind of argument value), else a layout read off those renderings:
   the arguments as one JSON object (``JsonCallLayout``), one tag per argument (``TagCallLayout``) or Python calls
   (``CallListLayout``). None fits: refused, with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_env.errors import ConfigError, ProcessorError
from trl_env.render.processors.base import Processor
from trl_env.render.processors.derived import from_tokenizer
from trl_env.render.tools.layouts import CallListLayout, JsonCallLayout, TagCallLayout, read_json_layout
from trl_env.render.tools.probe import PROBE_CALLS, PROBE_TOOLS, SENTINEL, USER, Calls, Probe
from trl_env.render.tools.types import ToolCall, ToolResults
from trl_env.render.tools.values import loads, parameters, typed

_NAME = re.compile(r"[A-Za-z_][\w.\-:]*")
"""A tool name as the templates write it; anything else read as a name is a malformed call."""


def tool_schemas(tools: Sequence[Callable[..., Any] | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON schemas of ``tools``: a callable through ``transformers.utils.get_json_schema``, a dict as it is.

    Raises:
        ConfigError: a callable without type hints or a docstring ``get_json_schema`` can read, naming the fix.
    """
    from transformers.utils import get_json_schema

    schemas = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schemas.append(dict(tool))
            continue
        try:
            schemas.append(get_json_schema(tool))
        except Exception as e:  # noqa: BLE001  # transformers' DocstringParsingException, TypeHintParsingException
            raise ConfigError(
                f"tool {getattr(tool, '__name__', tool)!r}: {e}. A tool needs type hints on every argument and a "
                "Google-style docstring with an Args: section (see transformers' get_json_schema)."
            ) from None
    names = [s.get("function", {}).get("name") for s in schemas]
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"tool names {names!r}: every tool needs a distinct, non-empty name.")
    return schemas


@dataclass(frozen=True)
class ToolFormat:
    """A template's tool-calling format, read by ``ToolFormat.read``; renders results and parses calls."""

    tokenizer: Any = field(repr=False, compare=False)
    tools: list[dict[str, Any]] = field(repr=False)
    base: Processor
    """The text processor with the tools listed in its opening (``from_tokenizer`` with ``tools=``)."""
    call_stop: str
    """The token the model samples after its calls; what the template writes for results follows it."""
    call_marker: str
    """Text that opens a call: a reply holding it that does not parse is a malformed call."""
    parser: str
    """The call reader: ``tokenizer``, ``trl:<name>`` (TRL's response template), ``json-layout``, ``tag-layout`` or
    ``call-list-layout``."""
    reader: CallReader = field(repr=False)
    parallel: bool
    """The template renders several calls in one reply (Llama 3.1 and gpt-oss render one)."""
    content_form: str
    """How the template writes a result's text: ``verbatim``, ``strip`` or ``json`` (gpt-oss quotes it)."""
    conversation: tuple[Mapping[str, Any], ...] = field(repr=False)
    template_kwargs: Mapping[str, Any] = field(repr=False)
    args_as_text: bool = False
    """The template takes a call's arguments as a JSON string (DeepSeek V3), not a dict."""
    _wrappers: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def read(
        cls,
        tokenizer: Any,
        tools: Sequence[Callable[..., Any] | Mapping[str, Any]],
        *,
        system_prompt: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ToolFormat:
        """Read the tool-calling format of ``tokenizer``'s chat template for ``tools``.

        Raises:
            ProcessorError: the template renders no tool calls or tool messages, or no parser reads its calls back
                (the message says which and why).
            ConfigError: a tool whose schema cannot be read.
        """
        from trl.chat_template_utils import supports_tool_calling

        schemas = tool_schemas(tools)
        if not schemas:
            raise ConfigError("tools=[]: give at least one tool (a typed, documented function or a JSON schema).")
        if not supports_tool_calling(tokenizer):
            raise ProcessorError(
                "this chat template does not render a tool-calling conversation (user -> assistant with tool_calls "
                "-> tool): it drops the calls or the tool messages, or refuses them (TRL's supports_tool_calling). "
                "Use a tool-capable model's template, or an env with action_tags."
            )
        kwargs = dict(template_kwargs or {})
        base = from_tokenizer(tokenizer, system_prompt=system_prompt, template_kwargs={**kwargs, "tools": schemas})
        system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
        conversation = (*system, {"role": "user", "content": USER})
        probe = Probe(tokenizer, conversation, kwargs)
        call_stop = probe.call_stop()
        parallel = probe.renders_parallel()
        prefix = probe.render([], tools=PROBE_TOOLS, generation=True)
        wanted = [calls for calls in PROBE_CALLS if parallel or len(calls) == 1]
        replies = [probe.reply(calls, call_stop) for calls in wanted]
        parser, reader = _choose_reader(tokenizer, prefix, replies, wanted)
        if isinstance(reader, ResponseTemplateReader):
            marker = _call_marker(replies[0], wanted[0][0][0])
        else:
            marker = reader.marker
        return cls(
            tokenizer=tokenizer,
            tools=schemas,
            base=base,
            call_stop=call_stop,
            call_marker=marker,
            parser=parser,
            reader=reader,
            parallel=parallel,
            content_form=probe.content_form(),
            conversation=conversation,
            template_kwargs=kwargs,
            args_as_text=probe.args_as_text,
        )

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        """The calls in a decoded reply (special tokens kept): ``[]`` without any, ``None`` if one is malformed."""
        found = self.reader.parse(text, self.tools)
        if found is None:
            return None if self.call_marker in text else []
        calls = []
        for call in found:
            function = call.get("function", call) if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            args = function.get("arguments", {}) if isinstance(function, dict) else None
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = None
            if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(args, dict):
                return None  # a lenient parser's half-read call (a name with spaces or braces) is malformed
            calls.append(ToolCall(name, args))
        if not calls and self.call_marker in text:
            return None
        return calls

    def result_segments(self, delta: ToolResults) -> list[tuple[str, bool]]:
        """The text the template writes after ``call_stop`` for these results, as (text, is_env_text) pieces."""
        pieces = self._wrapper(tuple(r.name for r in delta.results))
        out: list[tuple[str, bool]] = [(pieces[0], False)]
        for result, after in zip(delta.results, pieces[1:], strict=True):
            out += [(self._written(result.content), True), (after, False)]
        return [(text, env) for text, env in out if text]

    def _written(self, content: str) -> str:
        if self.content_form == "strip":
            return content.strip()
        if self.content_form == "json":
            return json.dumps(content, ensure_ascii=False)
        return content

    def _wrapper(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The template's text around the results of calls to ``names`` (rendered once per tuple of names)."""
        if names not in self._wrappers:
            self._wrappers[names] = self._render_wrapper(names)
        return self._wrappers[names]

    def _render_wrapper(self, names: tuple[str, ...]) -> tuple[str, ...]:
        probe = Probe(
            self.tokenizer,
            self.conversation,
            self.template_kwargs,
            args_as_text=self.args_as_text,
            parallel=self.parallel,
        )
        marks = [SENTINEL.format(i) for i in range(len(names))]
        text = probe.after_stop(names, marks, self.call_stop, tools=self.tools)
        if self.content_form == "json":
            marks = [json.dumps(m) for m in marks]
        pieces, rest = [], text
        for mark in marks:
            head, found, rest = rest.partition(mark)
            if not found:
                raise ProcessorError(f"the chat template does not write a tool result verbatim: {text!r:.300}")
            pieces.append(head)
        return (*pieces, rest)


def _call_marker(reply: str, name: str) -> str:
    """The text that opens a call in ``reply`` (before the tool's name, after any reasoning), e.g. ``<tool_call>``."""
    head = reply[: reply.find(name)]
    head = head.rpartition("</think>")[2]
    cut = head.split("{", 1)[0].strip()
    return cut or head.strip() or name


@dataclass(frozen=True)
class ResponseTemplateReader:
    """Calls read by a response template (transformers' ``parse_response``); its JSON calls are decoded here.

    A call whose content the template parses as JSON is taken as text and read by ``loads``, so that what the
    chat template writes reads back: transformers' JSON parser refuses Gemma 4's ``None`` (the whole call is lost).
    """

    tokenizer: Any = field(repr=False, compare=False)
    template: Mapping[str, Any]
    prefix: str = field(repr=False)
    """The rendering up to the generation prompt (the template's start anchor is found in it)."""
    string_delims: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, tokenizer: Any, template: Mapping[str, Any], prefix: str) -> ResponseTemplateReader:
        """The reader for ``template``, with its JSON tool-call content read as text (and its string delimiters)."""
        calls = template.get("fields", {}).get("tool_calls", {})
        if calls.get("content") != "json":
            return cls(tokenizer, template, prefix)
        delims = tuple((a, b) for a, b in calls.get("content_args", {}).get("string_delims", []))
        fields = {**template["fields"], "tool_calls": {**calls, "content": "text", "content_args": {}}}
        return cls(tokenizer, {**template, "fields": fields}, prefix, delims)

    def parse(self, text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The calls in ``text`` (see ``CallReader``)."""
        try:
            parsed = self.tokenizer.parse_response(text, self.template, prefix=self.prefix, tools=tools)
            calls = [self._decoded(call, tools) for call in parsed.get("tool_calls") or []]
        except Exception:  # noqa: BLE001  # a malformed call is data, whatever the parser raises
            return None
        return calls

    def _decoded(self, call: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
        function = call.get("function", call)
        if isinstance(function, str):  # the whole call was JSON (Qwen's {"name": ..., "arguments": ...})
            function = loads(function, string_delims=self.string_delims)
        name, args = function["name"], function.get("arguments", {})
        if isinstance(args, str):
            args = loads(args, string_delims=self.string_delims)
        if isinstance(args, dict):
            args = typed(args, parameters(tools, name))
        return {"type": "function", "function": {"name": name, "arguments": args}}


CallReader = ResponseTemplateReader | JsonCallLayout | TagCallLayout | CallListLayout
"""What reads a reply's calls: ``parse(text, tools)`` gives ``[]`` without any, ``None`` when one does not parse."""


def _choose_reader(tokenizer: Any, prefix: str, replies: list[str], wanted: list[Calls]) -> tuple[str, CallReader]:
    """The first reader that gives back the ``wanted`` calls of every probe reply: the tokenizer's, TRL's, a layout."""
    import trl.chat_template_utils as trl_templates

    candidates: list[tuple[str, CallReader | None]] = []
    if isinstance(getattr(tokenizer, "response_template", None), Mapping):
        candidates.append(("tokenizer", ResponseTemplateReader.of(tokenizer, tokenizer.response_template, prefix)))
    candidates += [
        (f"trl:{name.removesuffix('_template')}", ResponseTemplateReader.of(tokenizer, value, prefix))
        for name, value in sorted(vars(trl_templates).items())
        if name.endswith("_template") and isinstance(value, dict) and "fields" in value
    ]
    candidates += [
        ("json-layout", read_json_layout(replies, wanted)),
        ("tag-layout", TagCallLayout.read(replies[0], wanted[0][0])),
        *(("call-list-layout", layout) for layout in CallListLayout.read(replies[0], wanted[0][0][0])),
    ]
    for name, reader in candidates:
        if reader is not None and all(
            _calls_of(reader.parse(r, PROBE_TOOLS)) == w for r, w in zip(replies, wanted, strict=True)
        ):
            return name, reader
    raise ProcessorError(
        f"no parser reads this chat template's tool calls back: neither the tokenizer's response_template, nor TRL's "
        f"response templates, nor a JSON, tag or Python-call layout give back the calls of its rendering "
        f"{replies[0]!r:.200}. Set tokenizer.response_template (transformers' response parsing) for it."
    )


def _calls_of(found: list[dict[str, Any]] | None) -> list[tuple[str, Any]] | None:
    try:
        return None if found is None else [(c["function"]["name"], c["function"]["arguments"]) for c in found]
    except (KeyError, TypeError):
        return None
