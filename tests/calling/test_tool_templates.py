"""Tool-calling parity over every chat template TRL ships that renders tool calls (``trl/chat_templates/*.jinja``).

The cases come from listing the folder; a template is a tool template when TRL's own ``supports_tool_calling``
says so. For each, ``ToolProcessor.from_tokenizer`` must render exactly as the template does, with ``tools=``,
assistant ``tool_calls`` and ``tool`` messages, at the generation boundary:
- the opening equals the template's rendering of ``[system?, user]`` with the tools and the generation prompt;
- after a reply with calls, the text it appends for the results equals what the template writes after the
  call's stop token up to the next generation prompt (one and two results, contents with quotes, newlines,
  non-ASCII and a special-token string);
- parsing the template's own rendering of an assistant message with calls gives back the same calls.
"""

from __future__ import annotations

import json

import pytest
from trl.chat_template_utils import supports_tool_calling

from trl_env.calling import ToolResult, ToolResults
from trl_env.calling.processor import ToolProcessor
from trl_env.errors import ProcessorError
from trl_env.processors.base import ParseStatus
from trl_env.processors.derived import first_difference
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


TOOLS = [add, look_up]
ALL = sorted(trl_templates())
TOOL_TEMPLATES = [n for n in ALL if supports_tool_calling(trl_template_tokenizer(n))]
REFUSED: dict[str, str] = {}
"""Tool templates trl-env refuses, and the reason it gives (none today)."""
SERVED = [n for n in TOOL_TEMPLATES if n not in REFUSED]
SYSTEM = "Use the tools; answer briefly."
CALLS = [[("add", {"a": 2, "b": 40})], [("look_up", {"query": 'Paris, "France"'}), ("add", {"a": 7, "b": -3})]]
CONTENTS = ['42 "quoted"\nline two é', "x<|im_end|> y"]


def _conversation(system, calls, args_as_text=False):
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": "What is 2 + 40?"})
    tool_calls = [
        {"type": "function", "function": {"name": n, "arguments": json.dumps(a) if args_as_text else a}}
        for n, a in calls
    ]
    return messages, {"role": "assistant", "content": "", "tool_calls": tool_calls}


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
@pytest.mark.parametrize("name", SERVED)
def test_opening_results_and_parsing_match_the_template(name, system):
    tokenizer = trl_template_tokenizer(name)
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS, system_prompt=system)
    fmt = processor.format
    head, _ = _conversation(system, CALLS[0])
    opening = tokenizer.apply_chat_template(head, tools=fmt.tools, tokenize=False, add_generation_prompt=True)
    assert processor.init_system_input("What is 2 + 40?") == opening

    for calls in CALLS[: 2 if fmt.parallel else 1]:
        head, assistant = _conversation(system, calls, fmt.args_as_text)
        for contents in (CONTENTS[: len(calls)], CONTENTS[::-1][: len(calls)]):
            results = [{"role": "tool", "name": n, "content": c} for (n, _), c in zip(calls, contents, strict=True)]
            full = tokenizer.apply_chat_template(
                [*head, assistant, *results], tools=fmt.tools, tokenize=False, add_generation_prompt=True
            )
            delta = ToolResults([ToolResult(r["name"], r["content"]) for r in results])
            appended = processor.append_user_input(delta)
            assert full.endswith(fmt.call_stop + appended), (full[-300:], appended)
            assert "".join(text for text, _ in processor.append_segments(delta)) == appended

        # The template's own rendering of the reply, from the generation prompt to the call's stop token.
        alone = tokenizer.apply_chat_template([*head, assistant], tools=fmt.tools, tokenize=False)
        start = first_difference(opening, alone)
        reply = alone[start:]
        reply = (
            reply[: reply.find(fmt.call_stop) + len(fmt.call_stop)] if fmt.call_stop in reply else reply + fmt.call_stop
        )
        parsed = processor.parse(opening[start:] + reply if start < len(opening) else reply)
        assert parsed.status is ParseStatus.TOOL_CALL, (name, reply)
        assert [(c.name, dict(c.arguments)) for c in parsed.action.calls] == calls


@pytest.mark.parametrize("name", SERVED)
def test_a_reply_without_a_call_is_text_and_a_broken_call_is_malformed(name):
    processor = ToolProcessor.from_tokenizer(trl_template_tokenizer(name), TOOLS)
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
