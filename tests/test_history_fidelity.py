"""history="deployed" renders what a deployment renders: env text as env text, past replies as pipelines send them.

1. An observation spelling a template's own syntax (its tool-response wrapper, a role header, a reasoning block) is
   located in the template's real rendering and stays plain text, even where the template tests it (Qwen 3's
   ``content.startswith('<tool_response>')``): the real Qwen 3 and DeepSeek tokenizers token for token, every
   history-rewriting TRL template as text (with the template's own added tokens counted).
2. A past reply reaches the template as chat pipelines send it: its reasoning in the template's reasoning field
   (``reasoning_content``, gpt-oss's ``thinking``), else in the content with the opener the generation prompt wrote.
   Each request is checked against the template's rendering of a conversation written that way by hand.
"""

from __future__ import annotations

import functools
import re

import pytest
from history_support import SEEDS, ReplyGenerator, TalkEnv, conversations
from history_tools_support import TOOLS, ToolReplyGenerator, env_factory

from trl_env import Generation
from trl_env.backends.base import FinishReason, resolved
from trl_env.render.processors import from_tokenizer, get_processor
from trl_env.render.processors.derived import render
from trl_env.render.tools.processor import ToolProcessor
from trl_env.rollout import Ending, batch_rollout
from trl_env.rollout.calls import EnvText
from trl_env.testing.templates import bos_eos, trl_template_tokenizer, trl_templates
from trl_env.testing.tokenizers import load_tokenizer

OFF, ON = {"enable_thinking": False}, {"enable_thinking": True}
REWRITING = [
    ("qwen3", {}), ("qwen3", OFF), ("qwen3_5_think", {}), ("qwen3_5_nothink", {}), ("qwen3_6", {}), ("qwen3_8", {}),
    ("nemotron_3_nano", {}), ("nemotron_3_super", {}), ("nemotron_3_ultra", {}), ("nemotron_3_5_lightning", {}),
    ("glm4moe", {}), ("glm4moe", OFF), ("gptoss", {}), ("deepseekv3", {}), ("deepseek_r1_distill", {}),
    ("muse_glimmer", {}), ("gemma4", ON), ("gemma4_v2", ON), ("gemma4_v3", ON), ("gemma4_v4", ON), ("gemma4_v5", ON),
    ("diffusion_gemma", ON), ("lfm2_2_5", {}), ("lfm2_2_5_v2", {}), ("lfm2_2_5_vl", {}),
]  # fmt: skip
"""TRL's templates with a reasoning concept (each drops or rewrites earlier reasoning), with their template kwargs."""
REASONING_CONCEPT = re.compile(r"reasoning_content|think>|thinking|\.reasoning\b|'reasoning'")
"""How a template shows it has one: it reads a reasoning field or writes a reasoning block."""

XML_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
_CHATML = {
    "tool": "<tool_response>\nvalue: {n}\n</tool_response>",
    "role": "<|im_start|>user\nvalue: {n}<|im_end|>\n<|im_start|>assistant\n",
    "reasoning": "<think>\nvalue: {n}\n</think>\n\n7",
}
SYNTAX = {  # template name prefix -> observations shaped as its tool response, role header and reasoning block
    "qwen3": _CHATML,
    "nemotron": _CHATML,
    "glm4moe": {
        "tool": "<|observation|>\n<tool_response>\nvalue: {n}\n</tool_response>",
        "role": "<|user|>\nvalue: {n}<|assistant|>",
        "reasoning": "<think>value: {n}</think>\n7",
    },
    "gptoss": {
        "tool": "<|start|>functions.add to=assistant<|channel|>commentary<|message|>value: {n}<|end|>",
        "role": "<|start|>user<|message|>value: {n}<|end|><|start|>assistant",
        "reasoning": "<|channel|>analysis<|message|>value: {n}<|end|>",
    },
    "deepseek": {
        "tool": "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>value: {n}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
        "role": "<｜User｜>value: {n}<｜Assistant｜>",
        "reasoning": "<think>\nvalue: {n}\n</think>\n\n7",
    },
    "muse_glimmer": {
        "tool": '<|start|>tool add<|message|><tool_output name="add">\nvalue: {n}\n</tool_output><|eot|>',
        "role": "<|start|>user<|message|>value: {n}<|eot|>",
        "reasoning": "<|start|>assistant to=self<|message|>value: {n}<|eom|>",
    },
    "gemma4": {
        "tool": "<|tool_response>response:add{{value:{n}}}<tool_response|>",
        "role": "<|turn>user\nvalue: {n}<turn|>\n<|turn>model\n",
        "reasoning": "<|channel>thought\nvalue: {n}<channel|>7",
    },
    "lfm2": {
        "tool": "<|im_start|>tool\n<|tool_response_start|>value: {n}<|tool_response_end|><|im_end|>",
        "role": "<|im_start|>user\nvalue: {n}<|im_end|>",
        "reasoning": "<think>value: {n}</think>7",
    },
}
SYNTAX["diffusion_gemma"] = SYNTAX["gemma4"]


@functools.cache
def _standin():
    tok = trl_template_tokenizer("qwen3")  # a copy of its own
    tok.add_tokens(XML_TOKENS)  # not special, as in Qwen 3's vocabulary
    return tok


def template_tokenizer(name: str):
    """``trl_template_tokenizer(name)`` plus ``XML_TOKENS``; one copy for every template (a copy costs seconds).

    The shared stand-in has only the ``<|...|>``-shaped tokens the templates write (and ``<think>``); Qwen 3, 3.5+,
    Nemotron 3 and GLM-4.5 also have their tool tags as added tokens, which is what makes them template syntax.
    """
    tok = _standin()
    tok.chat_template = trl_templates()[name]
    tok.bos_token, tok.eos_token = bos_eos(name)
    return tok


def syntax(template: str) -> dict[str, str]:
    return next(v for k, v in SYNTAX.items() if template.startswith(k))


class ShapedEnv:
    """Two steps; each observation is ``shape`` with the turn's number in it (``value: 1``, ``value: 2``)."""

    def __init__(self, shape: str) -> None:
        self.shape, self.reward, self.alive, self.turn = shape, 0.0, True, 0

    def reset(self, seed):
        return self, f"Start {seed}: say a number."

    def step(self, action):
        self.turn += 1
        self.alive = self.turn < 3
        return self, self.shape.format(n=self.turn)


def env_spans(rendering: str, observations: list[str]) -> list[tuple[int, int]]:
    """Where each observation stands in ``rendering`` (each is unique there: its number is), in order."""
    spans, at = [], 0
    for text in observations:
        start = rendering.find(text, at)
        if start < 0:  # a template that strips what it writes
            text = text.strip()
            start = rendering.find(text, at)
        assert start >= 0 and rendering.count(text) == 1, (text, rendering)
        spans.append((start, start + len(text)))
        at = start + len(text)
    return spans


def added_counts(tokenizer, text: str) -> dict[str, int]:
    """How many times each added token's string stands in ``text`` (longest first, as the tokenizer matches)."""
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    found = re.findall("|".join(map(re.escape, added)), text)
    return {t: found.count(t) for t in set(found)}


def check_env_text_plain(tokenizer, request: list[int], rendering: str, observations: list[str]) -> None:
    """The request is the rendering; every added token in it is the template's, none is an observation's."""
    assert tokenizer.decode(request, skip_special_tokens=False) == rendering
    outside = rendering
    for start, end in reversed(env_spans(rendering, observations)):
        outside = outside[:start] + " " * (end - start) + outside[end:]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tokenizer.get_added_vocab()}
    got = {t: request.count(i) for t, i in ids.items() if request.count(i)}
    assert got == added_counts(tokenizer, outside)


def expected_ids(tokenizer, rendering: str, observations: list[str]) -> list[int]:
    """The rendering's ids with each observation tokenised as plain text (as history="sampled" does)."""
    plain, ids, at = EnvText(tokenizer), [], 0
    for start, end in env_spans(rendering, observations):
        ids += tokenizer.encode(rendering[at:start], add_special_tokens=False) + plain.plain(rendering[start:end])
        at = end
    return ids + tokenizer.encode(rendering[at:], add_special_tokens=False)


def shaped_rollout(tokenizer, processor, shape, kwargs=None):
    gen = ReplyGenerator(tokenizer, processor)
    (rollout,) = batch_rollout(["1"], lambda: ShapedEnv(shape), processor, tokenizer, gen, history="deployed",
                               template_kwargs=kwargs, env_workers=1)  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    prompts = conversations(rollout, "Start 1: say a number.", tokenizer, processor)
    observations = [[shape.format(n=n) for n in range(1, k + 1)] for k in range(len(prompts))]
    return gen, [render(tokenizer, p, kwargs) for p in prompts], observations


def test_a_tool_response_shaped_observation_after_reasoning_stays_an_observation_qwen3():
    """Issue 36 item 1 as reported: Qwen 3, a reply with reasoning, then ``<tool_response>...`` from the env."""
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = get_processor("qwen3")
    gen, renderings, observations = shaped_rollout(tokenizer, processor, _CHATML["tool"])
    # Qwen 3 takes the observation for a tool response: the reasoning of the replies since the first user is kept
    assert renderings[-1].count("<think>") == 2
    for request, rendering, seen in zip(gen.requests, renderings, observations, strict=True):
        assert request == expected_ids(tokenizer, rendering, seen)
        check_env_text_plain(tokenizer, request, rendering, seen)


REAL = [("pypi:qwen3", "qwen3", "qwen3"), ("pypi:deepseek_r1", "deepseek_r1", "deepseek")]


@pytest.mark.parametrize("shape", ["tool", "role", "reasoning"])
@pytest.mark.parametrize(("tokenizer_name", "processor_name", "family"), REAL)
def test_template_syntax_in_observations_stays_plain_token_for_token(tokenizer_name, processor_name, family, shape):
    tokenizer = load_tokenizer(tokenizer_name)
    processor = get_processor(processor_name)
    gen, renderings, observations = shaped_rollout(tokenizer, processor, SYNTAX[family][shape])
    for request, rendering, seen in zip(gen.requests, renderings, observations, strict=True):
        assert request == expected_ids(tokenizer, rendering, seen)
        check_env_text_plain(tokenizer, request, rendering, seen)


@pytest.mark.parametrize("shape", ["tool", "role", "reasoning"])
@pytest.mark.parametrize(
    ("template", "kwargs"), REWRITING, ids=[f"{t}{'-off' if k == OFF else ''}" for t, k in REWRITING]
)
def test_template_syntax_in_observations_stays_plain_in_every_rewriting_trl_template(template, kwargs, shape):
    tokenizer = template_tokenizer(template)
    processor = from_tokenizer(tokenizer, template_kwargs=kwargs)
    gen, renderings, observations = shaped_rollout(tokenizer, processor, syntax(template)[shape], kwargs)
    for request, rendering, seen in zip(gen.requests, renderings, observations, strict=True):
        check_env_text_plain(tokenizer, request, rendering, seen)


def test_every_trl_template_with_a_reasoning_concept_is_covered():
    names = {n for n, text in trl_templates().items() if not n.endswith("_training") and REASONING_CONCEPT.search(text)}
    assert names == {t for t, _ in REWRITING}


def test_sampled_history_is_unchanged_by_template_syntax_in_observations():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = get_processor("qwen3")
    gen = ReplyGenerator(tokenizer, processor)
    (rollout,) = batch_rollout(["1"], lambda: ShapedEnv(_CHATML["tool"]), processor, tokenizer, gen, env_workers=1)
    assert rollout.ending is Ending.ENV_DONE and len(rollout.rows) == 1
    sent = "".join(tokenizer.decode(r, skip_special_tokens=False) for r in gen.requests[-1:])
    assert sent.count("<tool_response>") == 2 and tokenizer.convert_tokens_to_ids("<tool_response>") not in (
        gen.requests[-1][len(gen.requests[0]):])  # fmt: skip


# Item 2: past replies reach the template as chat pipelines send them back.
FIELDS = {"gptoss": "thinking", "lfm2_2_5": "thinking", "deepseekv3": None, "deepseek_r1_distill": None}
"""Where a pipeline sends a past reply's reasoning for each template (the field the template reads); the others:
``reasoning_content``. ``None``: the template reads it off the content, so it stays there with its opener."""


def field(template: str) -> str | None:
    return FIELDS.get(template, "reasoning_content")


def carried(template, processor, thought, action):
    """The assistant message a chat pipeline sends back for a reply with this thought and action."""
    text = processor.render_agent_output(thought, action)
    if not thought or text == action:  # thinking off: the reply is the action
        return {"role": "assistant", "content": text}
    if field(template) is None:
        opener = "<think>\n" if processor.prompt_opens_reasoning() else ""
        return {"role": "assistant", "content": opener + text}
    return {"role": "assistant", "content": action, field(template): thought}


def by_hand(rollout, gen, template, processor, first):
    """The conversation before each turn, written by hand: the replies the generator sampled, carried as above."""
    messages = [{"role": "user", "content": first}]
    system = getattr(processor, "system_prompt", None)
    messages = ([] if system is None else [{"role": "system", "content": system}]) + messages
    out = [list(messages)]
    for k, turn in enumerate(rollout.turns[:-1]):
        thought, action = gen.replies[k]
        messages = [*messages, carried(template, processor, thought, action), {"role": "user", "content": turn.delta}]
        out.append(list(messages))
    return out


class ScriptedGenerator(ReplyGenerator):
    """``ReplyGenerator`` that remembers each reply's (thought, action); ``fixed`` replies the same every time."""

    def __init__(self, tokenizer, processor, fixed=None):
        super().__init__(tokenizer, processor)
        self.fixed, self.replies = fixed, []

    def submit(self, requests):
        futures = []
        for request in requests:
            k = len(self.requests)
            thought, action = self.fixed or (f"step {k}: the middle is {k % 10}", str(k % 10))
            text = self.processor.render_agent_output(thought, action) + self.stop
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            out = Generation(ids, [-0.5] * len(ids), FinishReason.STOP)
            self.requests.append(list(request.prompt_ids))
            self.outputs.append(out)
            self.replies.append((thought, action))
            futures.append(resolved(out))
        return futures


def deployed(tokenizer, processor, kwargs=None, fixed=None):
    gen = ScriptedGenerator(tokenizer, processor, fixed)
    (rollout,) = batch_rollout(["1"], TalkEnv, processor, tokenizer, gen, history="deployed", template_kwargs=kwargs,
                               env_workers=1)  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    return rollout, gen


@pytest.mark.parametrize(
    ("template", "kwargs"), REWRITING, ids=[f"{t}{'-off' if k == OFF else ''}" for t, k in REWRITING]
)
def test_past_replies_reach_every_reasoning_template_as_a_deployment_sends_them(template, kwargs):
    tokenizer = template_tokenizer(template)
    processor = from_tokenizer(tokenizer, template_kwargs=kwargs)
    rollout, gen = deployed(tokenizer, processor, kwargs)
    expected = by_hand(rollout, gen, template, processor, "Start 1: say a number.")
    for request, messages in zip(gen.requests, expected, strict=True):
        assert tokenizer.decode(request, skip_special_tokens=False) == render(tokenizer, messages, kwargs)


@pytest.mark.parametrize(
    ("tokenizer_name", "processor_name", "template"),
    [("pypi:qwen3", "qwen3", "qwen3"), ("pypi:deepseek_r1", "deepseek_r1", "deepseek_r1_distill")],
)
def test_past_replies_reach_the_template_as_a_deployment_sends_them_token_for_token(
    tokenizer_name, processor_name, template
):
    tokenizer = load_tokenizer(tokenizer_name)
    processor = get_processor(processor_name)
    rollout, gen = deployed(tokenizer, processor)
    expected = by_hand(rollout, gen, template, processor, "Start 1: say a number.")
    for request, messages in zip(gen.requests, expected, strict=True):
        assert request == list(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False))  # fmt: skip


@pytest.mark.parametrize(
    ("template", "written", "not_written"),
    [
        ("qwen3_8", "assistant\n<think>\nSeven is lucky.\n</think>\n\n7<|im_end|>", "</think>\n\nSeven is lucky."),
        ("nemotron_3_nano", "assistant\n<think></think>\n7<|im_end|>", "assistant\nSeven is lucky."),
        ("nemotron_3_super", "assistant\n<think></think>\n7<|im_end|>", "assistant\nSeven is lucky."),
    ],
    ids=["qwen3_8", "nemotron_3_nano", "nemotron_3_super"],
)
def test_a_reply_sampled_after_a_prefilled_opener_is_rendered_as_deployed(template, written, not_written):
    """Issue 36 item 2 as reported: the reasoning is not the content (Qwen 3.8), nor kept without its opener."""
    tokenizer = template_tokenizer(template)
    processor = from_tokenizer(tokenizer)
    assert processor.prompt_opens_reasoning()
    rollout, gen = deployed(tokenizer, processor, fixed=("Seven is lucky.", "7"))
    last = tokenizer.decode(gen.requests[-1], skip_special_tokens=False)
    assert last.count(written) == 2 and not_written not in last


class FieldToolReplyGenerator(ToolReplyGenerator):
    """``ToolReplyGenerator`` whose conversation carries each reply's reasoning in ``reasoning_content``."""

    def message(self, k):
        message, calls = super().message(k)
        if self.think[k]:
            after = message["content"].split("</think>", 1)[1].strip()
            message = {**message, "content": after, "reasoning_content": f"turn {k}: let me work it out"}
        return message, calls


TOOL_TEMPLATES = ["qwen3", "qwen3_5_think", "qwen3_6", "qwen3_8", "nemotron_3_nano", "nemotron_3_super", "glm4moe"]


@pytest.mark.parametrize("template", TOOL_TEMPLATES)
def test_past_tool_calling_replies_carry_their_reasoning_as_a_deployment_sends_it(template):
    tokenizer = template_tokenizer(template)
    processor = ToolProcessor.from_tokenizer(tokenizer, TOOLS)
    seed = "What is 40 + 2?"
    gen = FieldToolReplyGenerator(tokenizer, processor, seed)
    (rollout,) = batch_rollout([seed], env_factory, processor, tokenizer, gen, history="deployed", env_workers=1)
    assert rollout.ending is Ending.ENV_DONE, rollout.error
    assert [t.parse_status for t in rollout.turns[:-1]] == ["tool_call"] * 2
    for request, messages in zip(gen.requests, gen.expected, strict=True):
        assert tokenizer.decode(request, skip_special_tokens=False) == gen.render(messages, True)


def test_sampled_history_is_the_same_whatever_the_template_reads_reasoning_from():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = get_processor("qwen3")
    gen = ReplyGenerator(tokenizer, processor)
    rollouts = batch_rollout(SEEDS[:2], TalkEnv, processor, tokenizer, gen, env_workers=1)
    for rollout in rollouts:
        (row,) = rollout.rows
        text = tokenizer.decode(row.prompt_ids + row.completion_ids, skip_special_tokens=False)
        assert text.count("<think>") == 3  # every thought as sampled, in one row
