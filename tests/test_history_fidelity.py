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
from test_history import ReplyGenerator, conversations

from trl_env.processors import from_tokenizer, get_processor
from trl_env.processors.derived import render
from trl_env.rollout import Ending, batch_rollout
from trl_env.rollout.episode import EnvText
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
