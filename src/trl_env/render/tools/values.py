"""Argument values as chat templates write them, read back: ``loads`` for literals, ``from_text`` for bare text.

Templates write a call's arguments as JSON (Qwen, Llama), as JSON with their own string delimiters and bare keys
(Gemma 4's ``{a:<|"|>x<|"|>}``), with Python's literals (Gemma 4 writes ``None``; LFM2 writes ``'x'`` and ``True``),
or as bare text only the tool's JSON schema types (Muse's tags: ``null`` is ``None`` for a ``str | None`` argument
and the string ``"null"`` for a ``str`` one).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_WORDS = {"null": None, "None": None, "true": True, "True": True, "false": False, "False": False}


def loads(text: str, *, string_delims: Sequence[Sequence[str]] = ()) -> Any:
    """A JSON value, also as templates write one.

    Besides JSON: Python's ``None``/``True``/``False`` and quoted strings (with Python's escapes), bare keys, and
    strings between the template's own delimiters (``string_delims``). Only parsed, never evaluated.

    Raises:
        ValueError: ``text`` is none of these.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    for open_, close in string_delims:  # Gemma 4's <|"|>...<|"|>: verbatim text, written back as a JSON string
        pattern = re.escape(open_) + "(.*?)" + re.escape(close)
        text = re.sub(pattern, lambda m: json.dumps(m.group(1), ensure_ascii=False), text, flags=re.S)
    try:
        return _literal(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError) as e:
        raise ValueError(f"not a value: {text[:80]!r} ({e})") from None


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _WORDS:
        return _WORDS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _key(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):  # a bare key (Gemma 4)
        return node.id
    raise ValueError("not an object key")


def schema_types(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types ``schema`` allows, in its order: ``type`` (one or a list), ``anyOf``/``oneOf``, ``nullable``."""
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else [k for k in declared or [] if isinstance(k, str)]
    for choice in [*schema.get("anyOf", []), *schema.get("oneOf", [])]:
        kinds += schema_types(choice) if isinstance(choice, Mapping) else []
    if schema.get("nullable"):  # transformers' get_json_schema marks an Optional argument so
        kinds.append("null")
    return list(dict.fromkeys(kinds))


_IS = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def from_text(text: str, schema: Mapping[str, Any]) -> Any:
    """Bare text (a tag's content) as the argument's ``schema`` types it.

    The value the text reads as (``loads``) where one of the schema's types other than string takes it, else the
    text itself: ``null`` is ``None`` where the schema allows null, and the string ``"null"`` where it does not.
    """
    kinds = [kind for kind in schema_types(schema) if kind in _IS]
    try:
        value = loads(text) if kinds else text
    except ValueError:
        return text
    return value if any(_IS[kind](value) for kind in kinds) else text


def parameters(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    """The schemas of the arguments of the tool called ``name`` (``{}`` for an unknown tool)."""
    for tool in tools:
        function = tool.get("function", tool)
        if function.get("name") == name:
            properties = function.get("parameters", {}).get("properties", {})
            return properties if isinstance(properties, Mapping) else {}
    return {}


def typed(arguments: Mapping[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with each string whose schema takes no string read by its types (``"7"`` for an integer is 7).

    As transformers' ``parse_response(tools=...)`` does for the formats it reads.
    """
    out = dict(arguments)
    for key, value in arguments.items():
        schema = properties.get(key)
        if isinstance(value, str) and isinstance(schema, Mapping) and "string" not in schema_types(schema):
            out[key] = from_text(value, schema)
    return out
