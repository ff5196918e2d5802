"""A chat template's native tool-calling format, read off the template itself: ``ToolFormat.read``.

trl-env renders at the generation boundary, so from a template with tools it needs:

1. the opening with the tools listed as the template lists them (``from_tokenizer`` with ``tools=``);
2. the token the model stops on after its calls (``call_stop``: Qwen's ``<|im_end|>``, gpt-oss's ``<|call|>``,
   GLM's ``<|observation|>``, Gemma 4's ``<|tool_response>``) and the text the template writes after it for
   the results, rendered for the called tools' names (``result_segments``);
3. a parser for a reply's calls: the response template the tokenizer ships, else the first of TRL's response
   templates (``trl.chat_template_utils``) that gives back the calls of the template's own renderings of probe
   calls, else a layout read off those renderings: the arguments as one JSON object (``JsonCallLayout``) or one
   tag per argument (``TagCallLayout``). None fits: refused, with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_env.calling.types import ToolCall, ToolResults
from trl_env.errors import ConfigError, ProcessorError
from trl_env.processors.base import Processor
from trl_env.processors.derived import first_difference, from_tokenizer

_USER = "Xq7 tool user"
_SENTINEL = "Rz8result{}"
_PROBE_TOOLS = [
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
]
_PROBE_CALLS: list[list[tuple[str, dict[str, Any]]]] = [
    [("pk7_lookup", {"query": "Vq9 Paris, France", "limit": 37})],
    [("pk7_note", {"text": 'Vq9 said "hi"'}), ("pk7_lookup", {"query": "Vq9 two words", "limit": 12})],
]
_NAME = re.compile(r"[A-Za-z_][\w.\-:]*")
"""A tool name as the templates write it; anything else read as a name is a malformed call."""
_CONTENT_PROBE = ' Vq9 a "quoted" word\n\\ é '


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
class JsonCallLayout:
    """A call layout whose arguments are one JSON object: text around the name and the arguments, read off renderings.

    ``name_key`` set: the name and arguments are keys of one JSON object (Hermes/Llama style); otherwise the
    name is written before the arguments' JSON (DeepSeek V3, gpt-oss style).
    """

    before: str
    between: str
    after: str
    name_key: str | None = None
    args_key: str | None = None

    def parse(self, text: str) -> list[dict[str, Any]] | None:
        """The calls in ``text``; ``None`` when a call opens and does not parse."""
        calls, at, decoder = [], 0, json.JSONDecoder()
        while (start := text.find(self.before, at)) >= 0:
            pos = start + len(self.before)
            try:
                if self.name_key is not None:
                    value, pos = decoder.raw_decode(text, pos)
                    name, args = value[self.name_key], value[self.args_key]
                else:
                    end = text.find(self.between, pos)
                    if end < 0:
                        return None
                    name = text[pos:end]
                    args, pos = decoder.raw_decode(text, end + len(self.between))
            except (ValueError, KeyError, TypeError):
                return None
            if not isinstance(args, dict) or not isinstance(name, str) or not text.startswith(self.after, pos):
                return None
            calls.append({"type": "function", "function": {"name": name, "arguments": args}})
            at = pos + len(self.after)
        return calls


@dataclass(frozen=True)
class TagCallLayout:
    """A call layout with one tag per argument (Muse's ``<atem:parameter name="k">v</atem:parameter>``).

    Read off the rendering of a call with two arguments; values are typed by the tool's JSON schema.
    """

    open: str
    name_end: str
    arg_open: str
    arg_sep: str
    arg_close: str

    def parse(self, text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The calls in ``text``, each up to the next call."""
        head = re.compile(re.escape(self.open) + r"([A-Za-z_][\w.\-:]*)" + re.escape(self.name_end))
        arg = re.compile(
            re.escape(self.arg_open)
            + r"([A-Za-z_]\w*)"
            + re.escape(self.arg_sep)
            + r"(.*?)"
            + re.escape(self.arg_close),
            re.S,
        )
        found = list(head.finditer(text))
        calls = []
        for i, match in enumerate(found):
            body = text[match.end() : found[i + 1].start() if i + 1 < len(found) else len(text)]
            name = match.group(1)
            args = {a.group(1): _typed(tools, name, a.group(1), a.group(2)) for a in arg.finditer(body)}
            calls.append({"type": "function", "function": {"name": name, "arguments": args}})
        return calls

    @classmethod
    def read(cls, reply: str, call: tuple[str, dict[str, Any]]) -> TagCallLayout | None:
        """The layout of ``reply``, the rendering of ``call`` (a tool with two arguments), or ``None``."""
        name, args = call
        (k1, v1), (k2, v2) = [(k, str(v)) for k, v in args.items()]
        at_k1 = reply.find(k1)
        at_v1 = reply.find(v1, at_k1)
        at_k2 = reply.find(k2, at_v1)
        at_v2 = reply.find(v2, at_k2)
        at_name = reply.rfind(name, 0, at_k1)
        if min(at_k1, at_v1, at_k2, at_v2, at_name) < 0:
            return None
        after_name, after_v1 = reply[at_name + len(name) : at_k1], reply[at_v1 + len(v1) : at_k2]
        arg_open = after_name
        while not after_v1.endswith(arg_open):
            arg_open = arg_open[1:]
        line = reply[:at_name].rpartition("\n")[2]
        if not arg_open or not line:
            return None
        return cls(
            open=line,
            name_end=after_name[: len(after_name) - len(arg_open)],
            arg_open=arg_open,
            arg_sep=reply[at_k1 + len(k1) : at_v1],
            arg_close=after_v1[: len(after_v1) - len(arg_open)],
        )


def _typed(tools: list[dict[str, Any]], name: str, key: str, value: str) -> Any:
    """``value`` as the tool's schema types argument ``key`` (a string stays as written)."""
    schema: dict[str, Any] = next((t["function"] for t in tools if t.get("function", {}).get("name") == name), {})
    kind = schema.get("parameters", {}).get("properties", {}).get(key, {}).get("type", "string")
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


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
    """The call parser: ``tokenizer``, ``trl:<name>`` (TRL's response template), ``json-layout`` or ``tag-layout``."""
    parallel: bool
    """The template renders several calls in one reply (Llama 3.1 and gpt-oss render one)."""
    content_form: str
    """How the template writes a result's text: ``verbatim``, ``strip`` or ``json`` (gpt-oss quotes it)."""
    conversation: tuple[Mapping[str, Any], ...] = field(repr=False)
    template_kwargs: Mapping[str, Any] = field(repr=False)
    args_as_text: bool = False
    """The template takes a call's arguments as a JSON string (DeepSeek V3), not a dict."""
    schema: Mapping[str, Any] | None = field(default=None, repr=False)
    layout: JsonCallLayout | TagCallLayout | None = None
    prefix: str = field(default="", repr=False)
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
        conversation = (*system, {"role": "user", "content": _USER})
        probe = _Probe(tokenizer, conversation, kwargs)
        call_stop = probe.call_stop()
        parallel = probe.renders_parallel()
        prefix = probe.render([], tools=_PROBE_TOOLS, generation=True)
        replies = [probe.reply(calls, call_stop) for calls in _PROBE_CALLS[: 2 if parallel else 1]]
        parser, schema, layout = _choose_parser(tokenizer, prefix, replies, parallel)
        if isinstance(layout, TagCallLayout):
            marker = layout.open
        elif isinstance(layout, JsonCallLayout):
            marker = layout.before
        else:
            marker = _call_marker(replies[0], _PROBE_CALLS[0][0][0])
        return cls(
            tokenizer=tokenizer,
            tools=schemas,
            base=base,
            call_stop=call_stop,
            call_marker=marker,
            parser=parser,
            parallel=parallel,
            content_form=probe.content_form(),
            conversation=conversation,
            template_kwargs=kwargs,
            args_as_text=probe.args_as_text,
            schema=schema,
            layout=layout,
            prefix=base.init_system_input("x"),
        )

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        """The calls in a decoded reply (special tokens kept): ``[]`` without any, ``None`` if one is malformed."""
        found: list[Any] | None
        if isinstance(self.layout, TagCallLayout):
            found = self.layout.parse(text, self.tools)
        elif self.layout is not None:
            found = self.layout.parse(text)
        else:
            try:
                parsed = self.tokenizer.parse_response(text, self.schema, prefix=self.prefix, tools=self.tools)
            except Exception:  # noqa: BLE001  # a malformed call is data
                parsed = None
            found = None if parsed is None else parsed.get("tool_calls") or []
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
        probe = _Probe(
            self.tokenizer,
            self.conversation,
            self.template_kwargs,
            args_as_text=self.args_as_text,
            parallel=self.parallel,
        )
        marks = [_SENTINEL.format(i) for i in range(len(names))]
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


class _Probe:
    """Renders probe conversations with tool calls through the template."""

    def __init__(
        self, tokenizer: Any, conversation: tuple[Mapping[str, Any], ...], kwargs: Mapping[str, Any], **options: bool
    ) -> None:
        self.tokenizer, self.conversation, self.kwargs = tokenizer, [dict(m) for m in conversation], dict(kwargs)
        self.args_as_text = options.get("args_as_text", False)
        self.parallel = options.get("parallel", True)
        if "args_as_text" not in options:
            try:
                self.render(self.assistant(_PROBE_CALLS[0]), tools=_PROBE_TOOLS)
            except TypeError:  # DeepSeek V3's template concatenates the arguments as a string
                self.args_as_text = True

    def assistant(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        tool_calls = [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a) if self.args_as_text else dict(a)}}
            for n, a in calls
        ]
        return [{"role": "assistant", "content": "", "tool_calls": tool_calls}]

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]], generation: bool = False) -> str:
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
        messages = self.assistant([(n, {}) for n in called])
        results = [{"role": "tool", "name": n, "content": c} for n, c in zip(names, contents, strict=True)]
        return self.render([], tools=tools), self.render(messages + results, tools=tools, generation=True)

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
        calls = _PROBE_CALLS[0]
        last_value = str(calls[0][1]["limit"])
        alone = self.render(self.assistant(calls), tools=_PROBE_TOOLS)
        results = [{"role": "tool", "name": calls[0][0], "content": _SENTINEL.format(0)}]
        full = self.render(self.assistant(calls) + results, tools=_PROBE_TOOLS, generation=True)
        alone_tail = alone[alone.rfind(last_value) :]
        start = full.rfind(last_value, 0, full.find(_SENTINEL.format(0)))
        full_tail = full[start:]
        shared = first_difference(alone_tail, full_tail)
        spans = _special_spans(self.tokenizer, full_tail)
        inside = [s for s in spans if s[1] <= shared]
        after = [s for s in spans if s[0] >= shared and s[1] <= full_tail.find(_SENTINEL.format(0))]
        chosen = inside[-1] if inside else after[0] if after else None
        if chosen is None:
            raise ProcessorError(
                f"the chat template writes no special token between a tool call and its result ({full_tail!r:.200}); "
                "trl-env needs one to stop the model on."
            )
        return full_tail[chosen[0] : chosen[1]]

    def renders_parallel(self) -> bool:
        """Whether the template writes every call of a reply with two (Llama 3.1 refuses, gpt-oss keeps the first)."""
        calls = _PROBE_CALLS[1]
        try:
            text = self.render(self.assistant(calls), tools=_PROBE_TOOLS)
        except Exception:  # noqa: BLE001  # Llama 3.1: "This model only supports single tool-calls at once!"
            return False
        firsts = [next(iter(args.values())) for _, args in calls]
        return all(v in text or json.dumps(v)[1:-1] in text for v in firsts)

    def reply(self, calls: list[tuple[str, dict[str, Any]]], stop: str) -> str:
        """The template's rendering of a reply with ``calls``, from where it leaves the generation prompt to ``stop``.

        ``stop`` is added where the template writes it only when results follow (GLM's ``<|observation|>``).
        """
        prompt = self.render([], tools=_PROBE_TOOLS, generation=True)
        full = self.render(self.assistant(calls), tools=_PROBE_TOOLS)
        start = first_difference(prompt, full)
        if start < len(prompt):  # the rendering of a past reply differs inside the prompt: start at a token boundary
            start = max([end for _, end in _special_spans(self.tokenizer, full[:start])], default=start)
        end = full.find(stop, start)
        return full[start:] + stop if end < 0 else full[start : end + len(stop)]

    def content_form(self) -> str:
        name = _PROBE_CALLS[0][0][0]
        _, full = self.with_results([name], [_CONTENT_PROBE], _PROBE_TOOLS)
        if _CONTENT_PROBE in full:
            return "verbatim"
        if _CONTENT_PROBE.strip() in full:
            return "strip"
        if json.dumps(_CONTENT_PROBE, ensure_ascii=False) in full:
            return "json"
        raise ProcessorError(
            f"the chat template changes a tool result's text beyond trimming or quoting: {full!r:.300}"
        )


def _special_spans(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds special tokens (as the tokenizer marks them), as (start, end) spans."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {})
    tokens = {str(t) for t in decoder.values() if getattr(t, "special", False)} | set(tokenizer.all_special_tokens)
    tokens = {t for t in tokens if t}
    if not tokens:
        return []
    pattern = re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True))))
    return [m.span() for m in pattern.finditer(text)]


def _call_marker(reply: str, name: str) -> str:
    """The text that opens a call in ``reply`` (before the tool's name, after any reasoning), e.g. ``<tool_call>``."""
    head = reply[: reply.find(name)]
    head = head.rpartition("</think>")[2]
    cut = head.split("{", 1)[0].strip()
    return cut or head.strip() or name


def _choose_parser(
    tokenizer: Any, prefix: str, replies: list[str], parallel: bool
) -> tuple[str, Mapping[str, Any] | None, JsonCallLayout | TagCallLayout | None]:
    """The first parser that gives back every probe reply's calls: the tokenizer's, TRL's, a JSON layout."""
    import trl.chat_template_utils as trl_templates

    wanted = [[(n, a) for n, a in calls] for calls in _PROBE_CALLS[: len(replies)]]
    candidates: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(getattr(tokenizer, "response_template", None), Mapping):
        candidates.append(("tokenizer", tokenizer.response_template))
    candidates += [
        (f"trl:{name.removesuffix('_template')}", value)
        for name, value in sorted(vars(trl_templates).items())
        if name.endswith("_template") and isinstance(value, dict) and "fields" in value
    ]
    for name, schema in candidates:
        try:
            got = [tokenizer.parse_response(r, schema, prefix=prefix, tools=_PROBE_TOOLS) for r in replies]
        except Exception:  # noqa: BLE001  # a parser that does not fit this template
            continue
        if all(_calls_of(g) == w for g, w in zip(got, wanted, strict=True)):
            return name, schema, None
    layout = _json_layout(replies, wanted)
    if layout is not None and all(
        _calls_of({"tool_calls": layout.parse(r)}) == w for r, w in zip(replies, wanted, strict=True)
    ):
        return "json-layout", None, layout
    tags = TagCallLayout.read(replies[0], wanted[0][0])
    if tags is not None and all(
        _calls_of({"tool_calls": tags.parse(r, _PROBE_TOOLS)}) == w for r, w in zip(replies, wanted, strict=True)
    ):
        return "tag-layout", None, tags
    raise ProcessorError(
        f"no parser reads this chat template's tool calls back: neither the tokenizer's response_template, nor TRL's "
        f"response templates, nor a JSON or tag layout give back the calls of its rendering {replies[0]!r:.200}. Set "
        "tokenizer.response_template (transformers' response parsing) for it."
    )


def _calls_of(parsed: Any) -> list[tuple[str, Any]] | None:
    try:
        return [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls") or []]
    except (KeyError, TypeError, AttributeError):
        return None


def _json_layout(replies: list[str], wanted: list[list[tuple[str, Any]]]) -> JsonCallLayout | None:
    """Read the text before each call and where its name and arguments' JSON sit off the renderings of probe calls."""
    heads = []
    for reply, calls in zip(replies, wanted, strict=True):
        at = 0
        for name, args in calls:
            found = _find_json(reply, at, name, args)
            if found is None:
                return None
            start, end, name_key, args_key = found
            head = reply[at:start]
            if name_key is None:
                head = head[: head.rfind(name)]
            heads.append(head.rpartition("</think>")[2])
            at = end
    before = heads[0]
    for head in heads[1:]:  # the text every call starts with: the common end of the texts before them
        while not head.endswith(before):
            before = before[1:]
    if not before.strip():
        return None
    start, _, name_key, args_key = _find_json(replies[0], 0, *wanted[0][0])  # type: ignore[misc]
    between = "" if name_key else replies[0][:start].rpartition(wanted[0][0][0])[2]
    return JsonCallLayout(before=before, between=between, after="", name_key=name_key, args_key=args_key)


def _find_json(reply: str, at: int, name: str, args: Any) -> tuple[int, int, str | None, str | None] | None:
    """The first JSON object after ``at`` that is ``args`` (after ``name``) or holds both as values."""
    decoder = json.JSONDecoder()
    for start in (i for i in range(at, len(reply)) if reply[i] == "{"):
        try:
            value, end = decoder.raw_decode(reply, start)
        except ValueError:
            continue
        if value == args and name in reply[at:start]:
            return start, end, None, None
        if isinstance(value, dict) and args in value.values() and name in value.values():
            name_key = next(k for k, v in value.items() if v == name)
            args_key = next(k for k, v in value.items() if v == args)
            return start, end, name_key, args_key
    return None
