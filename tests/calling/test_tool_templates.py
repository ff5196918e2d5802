"""Tool-calling parity over every chat template TRL ships that renders tool calls (``trl/chat_templates/*.jinja``).

The cases come from listing the folder; a template is a tool template when TRL's own ``supports_tool_calling``
says so. For each, ``ToolProcessor.from_tokenizer`` must render exactly as the template does, with ``tools=``,
assistant ``tool_calls`` (each with an ``id``) and ``tool`` messages (each with its ``tool_call_id`` and ``name``),
as chat pipelines carry them, at the generation boundary:
- the opening equals the template's rendering of ``[system?, user]`` with the tools and the generation prompt;
- after a reply with one, two and three calls, the text it appends for the results equals what the template writes
  after the call's stop token up to the next generation prompt (contents with quotes, newlines, non-ASCII and a
  special-token string);
- parsing the template's own rendering of a reply with those calls gives back the same calls, with every kind of
  argument value: null, booleans, integers, floats, nested objects with lists, and strings holding quotes,
  braces, commas, newlines and non-ASCII.
"""

from __future__ import annotations

import functools
import json

import pytest
from helpers import sweep
from trl.chat_template_utils import supports_tool_calling

from trl_env.errors import ProcessorError
from trl_env.render.processors.base import ParseStatus
from trl_env.render.processors.derived import first_difference
from trl_env.render.tools import ToolResult, ToolResults
from trl_env.render.tools.processor import ToolProcessor
from trl_env.testing.templates import trl_template_tokenizer, trl_templates


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def look_up(query: str) -> str:
    """Look a city up.

    Args:
        query: the city's name
    """
    return query


def record(
    text: str, label: str, note: str | None, count: int, limit: int | None, exact: bool, ratio: float, details: dict
) -> str:
    """Record an entry.

    Args:
        text: the entry
        label: its label
        note: a note, if any
        count: how many
        limit: a limit, if any
        exact: whether it is exact
        ratio: a ratio
        details: anything else
    """
    return text


TOOLS = [add, look_up, record]
ALL = sorted(trl_templates())
TOOL_TEMPLATES = [n for n in ALL if supports_tool_calling(trl_template_tokenizer(n))]
REFUSED: dict[str, str] = {}
"""Tool templates trl-env refuses, and the reason it gives (none today)."""
SERVED = [n for n in TOOL_TEMPLATES if n not in REFUSED]
SYSTEM = "Use the tools; answer briefly."
VALUES = {
    "text": 'He said "it\'s {ok}, [1]",\nthen: naïve — 東京',
    "label": "null",
    "note": None,
    "count": -3,
    "limit": None,
    "exact": False,
    "ratio": 0.25,
    "details": {"tags": ["a", "b, c"], "inner": {"on": True, "off": None, "xs": [1, 2.5, "x"]}},
}
"""Every kind of argument value; ``label`` and ``note`` are the ones only the tool's schema tells apart in text."""
CALLS = [
    [("add", {"a": 2, "b": 40})],
    [("record", VALUES)],
    [("look_up", {"query": 'Paris, "France"'}), ("add", {"a": 7, "b": -3})],
    [("add", {"a": 1, "b": 2}), ("record", VALUES), ("look_up", {"query": "Zürich"})],
]
CONTENTS = ['42 "quoted"\nline two é', "x<|im_end|> y", '{"ok": true}']


@functools.cache
def _tokenizer(name):
    return trl_template_tokenizer(name)


@functools.cache
def _processor(name, system):
    return ToolProcessor.from_tokenizer(_tokenizer(name), TOOLS, system_prompt=system)


def _conversation(system, calls, args_as_text=False):
    """``[system?, user]`` and the assistant message with ``calls``, each with its id, as chat pipelines write them."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": "What is 2 + 40?"})
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": n, "arguments": json.dumps(a) if args_as_text else a},
        }
        for i, (n, a) in enumerate(calls)
    ]
    return messages, {"role": "assistant", "content": "", "tool_calls": tool_calls}


def _served_calls(fmt):
    """The call lists a reply of this template holds: one call per reply where it renders only one."""
    return [calls for calls in CALLS if fmt.parallel or len(calls) == 1]


def test_the_cases_cover_every_tool_template_trl_ships():
    assert len(TOOL_TEMPLATES) >= 40, TOOL_TEMPLATES
    for family in (
        "qwen3",
        "qwen3_5_think",
        "glm4moe",
        "gptoss",
        "llama3_1",
        "gemma4",
        "lfm2_2_5",
        "deepseekv3",
        "muse_glimmer",
    ):
        assert family in SERVED


@pytest.mark.parametrize("system", [None, SYSTEM], ids=["no-system", "system"])
@pytest.mark.parametrize("name", sweep(SERVED, lambda name: name))
def test_the_opening_matches_the_template(name, system):
    processor = _processor(name, system)
    head, _ = _conversation(system, CALLS[0])
    opening = _tokenizer(name).apply_chat_template(
        head, tools=processor.format.tools, tokenize=False, add_generation_prompt=True
    )
    assert processor.init_system_input("What is 2 + 40?") == opening


@pytest.mark.parametrize("system", [None, SYSTEM], ids=["no-system", "system"])
@pytest.mark.parametrize("name", sweep(SERVED, lambda name: name))
def test_each_result_is_written_as_the_template_writes_the_result_of_its_own_call(name, system):
    """One, two and three calls with ids, results with their call's id and name (Gemma 4 names a result by its id)."""
    tokenizer, processor = _tokenizer(name), _processor(name, system)
    fmt = processor.format
    for calls in _served_calls(fmt):
        head, assistant = _conversation(system, calls, fmt.args_as_text)
        for contents in (CONTENTS[: len(calls)], CONTENTS[::-1][: len(calls)]):
            results = [
                {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": content}
                for call, content in zip(assistant["tool_calls"], contents, strict=True)
            ]
            full = tokenizer.apply_chat_template(
                [*head, assistant, *results], tools=fmt.tools, tokenize=False, add_generation_prompt=True
            )
            delta = ToolResults([ToolResult(r["name"], r["content"]) for r in results])
            appended = processor.append_user_input(delta)
            assert full.endswith(fmt.call_stop + appended), (full[-300:], appended)
            assert "".join(text for text, _ in processor.append_segments(delta)) == appended


@pytest.mark.parametrize("system", [None, SYSTEM], ids=["no-system", "system"])
@pytest.mark.parametrize("name", sweep(SERVED, lambda name: name))
def test_the_templates_own_calls_parse_back_to_their_values(name, system):
    """The template's rendering of a reply with calls, from the generation prompt to its stop token, parses back."""
    tokenizer, processor = _tokenizer(name), _processor(name, system)
    fmt = processor.format
    for calls in _served_calls(fmt):
        head, assistant = _conversation(system, calls, fmt.args_as_text)
        opening = tokenizer.apply_chat_template(head, tools=fmt.tools, tokenize=False, add_generation_prompt=True)
        alone = tokenizer.apply_chat_template([*head, assistant], tools=fmt.tools, tokenize=False)
        start = first_difference(opening, alone)
        reply = alone[start:]
        reply = (
            reply[: reply.find(fmt.call_stop) + len(fmt.call_stop)] if fmt.call_stop in reply else reply + fmt.call_stop
        )
        parsed = processor.parse(opening[start:] + reply if start < len(opening) else reply)
        assert parsed.status is ParseStatus.TOOL_CALL, (name, reply)
        assert [(c.name, dict(c.arguments)) for c in parsed.action.calls] == calls, reply


@pytest.mark.parametrize("name", sweep(SERVED, lambda name: name))
def test_a_reply_without_a_call_is_text_and_a_broken_call_is_malformed(name):
    processor = _processor(name, None)
    stop, base = processor.stop_strings[0], processor.format.base
    plain = processor.parse(base.render_agent_output("Easy.", "The answer is 42.") + stop)
    assert plain.status is not ParseStatus.TOOL_CALL and "42" in plain.action and not getattr(plain.action, "calls", ())
    broken = processor.parse(base.render_agent_output("Easy.", f"{processor.format.call_marker} add {{not json") + stop)
    assert broken.status is ParseStatus.MALFORMED_TOOL_CALL
    assert broken.action.calls[0].error


def test_a_template_whose_calls_no_parser_reads_back_is_refused_with_the_fix():
    tokenizer = trl_template_tokenizer("qwen3")
    tokenizer.chat_template = (  # the arguments as "k: v, " and the name after them: no parser reads that back
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}<call>"
        "{% for k, v in c.function.arguments.items() %}{{ k }}: {{ v }}, {% endfor %}@{{ c.function.name }}</call>"
        "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ProcessorError, match="no parser reads this chat template's tool calls back"):
        ToolProcessor.from_tokenizer(tokenizer, TOOLS)


@pytest.mark.parametrize("name", ["cohere", "phi3", "llama3", "gemma3"])
def test_templates_without_tool_calling_are_refused_with_the_reason(name):
    with pytest.raises(ProcessorError, match="does not render a tool-calling conversation"):
        ToolProcessor.from_tokenizer(trl_template_tokenizer(name), TOOLS)
