"""Call layouts read off a template's renderings, for formats no response template parses (``ToolFormat.read``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_env.render.tools.values import from_text, loads, parameters


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

    @property
    def marker(self) -> str:
        """The text that opens a call."""
        return self.before

    def parse(self, text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
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

    Read off the rendering of a call with two arguments; a value is bare text, typed by the tool's JSON schema
    (``from_text``: ``null`` is ``None`` for a ``str | None`` argument, the string ``"null"`` for a ``str`` one).
    """

    open: str
    name_end: str
    arg_open: str
    arg_sep: str
    arg_close: str

    @property
    def marker(self) -> str:
        """The text that opens a call."""
        return self.open

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
            name, schemas = match.group(1), parameters(tools, match.group(1))
            args = {a.group(1): from_text(a.group(2), schemas.get(a.group(1), {})) for a in arg.finditer(body)}
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


@dataclass(frozen=True)
class CallListLayout:
    """Calls written as Python calls after an opening: LFM2's ``<|tool_call_start|>[f(a='x', b=None), g()]``.

    A value ends where the tool's next argument (``, b=``, a key of its schema) or the call's ``)`` follows and the
    text before reads as a value (``loads``). ``escaped``: strings are written with backslash escapes (LFM2 v2
    escapes quotes and newlines), else as they are (LFM2.5's ``'it's'``: the schema's keys tell which quote ends
    the string). Read off the rendering of a call; both readings are tried on the probes (``ToolFormat.read``).
    """

    open: str
    escaped: bool

    @property
    def marker(self) -> str:
        """The text that opens the calls."""
        return self.open

    def parse(self, text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The calls in ``text``; ``None`` when the calls open and do not parse."""
        start = text.find(self.open)
        if start < 0:
            return []
        calls, pos = [], start + len(self.open)
        while (head := _CALL_HEAD.match(text, pos)) is not None:
            keys = parameters(tools, head.group(1))
            read = self._arguments(text, head.end(), keys) if keys else None
            read = read or self._arguments(text, head.end(), {})  # an argument the schema lacks: any name
            if read is None:
                return None
            args, pos = read
            calls.append({"type": "function", "function": {"name": head.group(1), "arguments": args}})
            if (comma := _COMMA.match(text, pos)) is None:
                break
            pos = comma.end()
        return calls or None

    def _arguments(self, text: str, pos: int, keys: Mapping[str, Any]) -> tuple[dict[str, Any], int] | None:
        """The arguments from ``pos`` (after ``name(``) and where the call ends, the keys named by ``keys``."""
        names = "|".join(map(re.escape, keys)) or r"[A-Za-z_]\w*"
        ends = re.compile(rf"\s*(?:,\s*(?=(?:{names})\s*=)|(?P<close>\)))")
        args: dict[str, Any] = {}
        if close := _CLOSE.match(text, pos):
            return args, close.end()
        while (key := _KEY.match(text, pos)) is not None:
            for end in ends.finditer(text, key.end()):
                try:
                    args[key.group(1)] = self._value(text[key.end() : end.start()])
                except ValueError:
                    continue
                if end.group("close"):
                    return args, end.end()
                pos = end.end()
                break
            else:
                return None
        return None

    def _value(self, text: str) -> Any:
        text = text.strip()
        if not self.escaped and len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        return loads(text)

    @classmethod
    def read(cls, reply: str, name: str) -> list[CallListLayout]:
        """Both readings of ``reply``'s layout if it writes the call to ``name`` as ``name(...)`` after an opening."""
        at = reply.find(name + "(")
        opening = reply[:at].rpartition("\n")[2] if at >= 0 else ""
        return [cls(opening, escaped) for escaped in (True, False)] if opening.strip() else []


_CALL_HEAD = re.compile(r"\s*([A-Za-z_][\w.\-]*)\(")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=")
_CLOSE = re.compile(r"\s*\)")
_COMMA = re.compile(r"\s*,")


def read_json_layout(replies: list[str], wanted: list[list[tuple[str, Any]]]) -> JsonCallLayout | None:
    """Read the text before each call and where its name and arguments' JSON sit off the renderings of probe calls."""
    heads = []
    for reply, calls in zip(replies, wanted, strict=True):
        at = 0
        for name, args in calls:
            found = find_json(reply, at, name, args)
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
    start, _, name_key, args_key = find_json(replies[0], 0, *wanted[0][0])  # type: ignore[misc]
    between = "" if name_key else replies[0][:start].rpartition(wanted[0][0][0])[2]
    return JsonCallLayout(before=before, between=between, after="", name_key=name_key, args_key=args_key)


def find_json(reply: str, at: int, name: str, args: Any) -> tuple[int, int, str | None, str | None] | None:
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
