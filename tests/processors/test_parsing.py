"""parse_agent_output: reasoning, action markers, cut turns and end markers, for every family."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_env import get_processor
from trl_env.render.processors import PROCESSORS
from trl_env.render.processors.base import ParseStatus, parse_output

NAMES = list(PROCESSORS)
CLOSED = {n for n in NAMES if n.endswith("_no_thinking")} | {"gemma4"}
"""Their generation prompts close the reasoning block (or open none): a turn has no reasoning of its own."""
# Reasoning and action texts with no markup, no outer whitespace (parse strips).
plain = st.text(st.characters(blacklist_characters="<>|｜", blacklist_categories=("Cs",)), max_size=30).map(str.strip)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(reasoning=plain.filter(bool), action=plain)
def test_parse_inverts_render_for_every_family(name, reasoning, action):
    processor = get_processor(name)
    text = processor.render_agent_output(reasoning, action) + processor.stop_strings[0]
    parsed = processor.parse(text)
    has_reasoning_block = name not in CLOSED
    assert (parsed.reasoning, parsed.action) == ((reasoning if has_reasoning_block else ""), action)
    assert parsed.status is ParseStatus.OK
    assert processor.parse_agent_output(text) == (parsed.reasoning, parsed.action)


@pytest.mark.parametrize("name", NAMES)
def test_a_turn_cut_mid_thought_is_all_reasoning_and_no_action(name):
    processor = get_processor(name)
    cut = processor.render_agent_output("I think the answer is 42", "42").split("42")[0] + "42"
    if name in CLOSED:
        pytest.skip("the prompt closed the reasoning block: the whole turn is the answer")
    parsed = processor.parse(cut)
    assert parsed.action == "" and parsed.status is ParseStatus.CUT_IN_REASONING
    assert "42" in parsed.reasoning


def test_deepseek_reasoning_opened_by_the_prompt_never_becomes_the_action():
    processor = get_processor("deepseek_r1")
    assert processor.parse_agent_output("so 2 + 2 = 4, the answer is 4") == ("so 2 + 2 = 4, the answer is 4", "")
    assert processor.parse_agent_output("so 4\n</think>\n\n4<｜end▁of▁sentence｜>") == ("so 4", "4")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>r</think> sure: <answer> 42 </answer>", ("r", "42", ParseStatus.OK)),
        ("<think><answer>1</answer></think><answer>2</answer>", ("<answer>1</answer>", "2", ParseStatus.OK)),
        ("<answer>1</answer> no, <answer>2</answer>", ("", "2", ParseStatus.OK)),
        ("<think>r</think><answer>42", ("r", "42", ParseStatus.UNCLOSED_ACTION)),
        ("<think>r</think> 42 ", ("r", "42", ParseStatus.NO_ACTION_MARKER)),
        ("<think>r <answer>42</answer>", ("r <answer>42</answer>", "", ParseStatus.CUT_IN_REASONING)),
        ("<answer>42</answer><|im_end|><answer>7</answer>", ("", "42", ParseStatus.OK)),
        ("<|im_start|>user\n42<|im_end|>", ("", "<|im_start|>user\n42", ParseStatus.NO_ACTION_MARKER)),
        ("", ("", "", ParseStatus.NO_ACTION_MARKER)),
    ],
)
def test_action_markers_missing_closers_and_end_markers(text, expected):
    processor = dataclasses.replace(get_processor("qwen3"), action_tags=("<answer>", "</answer>"))
    parsed = processor.parse(text)
    assert (parsed.reasoning, parsed.action, parsed.status) == expected


def test_a_tool_call_tag_as_the_action_marker():
    processor = dataclasses.replace(get_processor("qwen3"), action_tags=("<tool_call>", "</tool_call>"))
    call = '{"name": "search", "arguments": {"q": "x"}}'
    text = f"<think>\nlook it up\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    assert processor.parse_agent_output(text) == ("look it up", call)


def test_gemma4_thought_channel_is_reasoning_and_its_name_is_dropped():
    processor = get_processor("gemma4_thinking")
    assert processor.parse_agent_output("<|channel>thought\nhmm<channel|>42<turn|>") == ("hmm", "42")
    assert processor.parse("<|channel>thought\nhalf a tho").status is ParseStatus.CUT_IN_REASONING


def test_end_markers_cut_the_turn_and_other_special_tokens_are_kept():
    assert parse_output("a<|eot_id|>b", end_markers=("<|eot_id|>",)).action == "a"
    assert parse_output("a<|eom_id|>b", end_markers=("<|eot_id|>", "<|eom_id|>")).action == "a"
    assert get_processor("llama3_1").parse_agent_output("x<|python_tag|>y<|eot_id|>") == ("", "x<|python_tag|>y")
    assert get_processor("mistral_tekken").parse_agent_output("[TOOL_CALLS]x</s>") == ("", "[TOOL_CALLS]x")
