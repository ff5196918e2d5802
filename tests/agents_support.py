"""Shared by the agents tests: a scripted generator whose reply depends only on the prompt it is given."""

from __future__ import annotations

import importlib
import json
import os
from concurrent.futures import Future
from typing import Any

import pytest

from trl_env import Generation
from trl_env.agents import agent_env_factory
from trl_env.backends.base import FinishReason, GeneratorBase, resolved
from trl_env.render.processors import from_tokenizer
from trl_env.render.tools.format import tool_schemas
from trl_env.rollout import batch_rollout


class PromptReplyGenerator:
    """Replies ``script(k, prompt)`` where k counts the assistant turns already in the prompt; records every request.

    The reply and its logprobs depend only on the prompt, so two paths that render the same prompts get the same
    tokens whatever order episodes run in. ``script`` returns the reply text (its end-of-turn token included).
    """

    continuous = False
    context_limit = None

    def __init__(self, tokenizer, script, *, marker="<|im_start|>assistant"):
        """``marker``: text the template writes once per assistant turn (and for the generation prompt), or a
        function of the prompt giving k."""
        self.tokenizer, self.script, self.marker = tokenizer, script, marker
        self.requests, self.outputs = [], []

    def submit(self, requests) -> list[Future[Generation]]:
        futures = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
            k = self.marker(prompt) if callable(self.marker) else prompt.count(self.marker) - 1
            ids = list(self.tokenizer.encode(self.script(k, prompt), add_special_tokens=False))[: request.max_tokens]
            reason = FinishReason.STOP if ids[-1] in request.stop_token_ids else FinishReason.LENGTH
            out = Generation(ids, [-((0.01 * ((k + 1) * 7 + i)) % 3.0) for i in range(len(ids))], reason)
            self.requests.append(list(request.prompt_ids))
            self.outputs.append(out)
            futures.append(resolved(out))
        return futures


def rows_of(rollouts):
    return [[(r.prompt_ids, r.completion_ids, r.logprobs, r.env_mask) for r in ro.rows] for ro in rollouts]


def one_call_program(run):
    """A module-level agent (it pickles): one call, reward 1.0 when the reply is "0"."""
    reply = run.openai(max_retries=0).chat.completions.create(
        model=run.model, messages=[{"role": "user", "content": f"task {run.task}"}]
    )
    return float(reply.choices[0].message.content == "0")


def exiting_program(run):
    """Kills its interpreter on seed "exit" after one call; else one_call_program."""
    import os

    if run.seed == "exit":
        run.openai(max_retries=0).chat.completions.create(model=run.model, messages=[{"role": "user", "content": "x"}])
        os._exit(3)
    return one_call_program(run)


def capped_program(run):
    """A module-level agent (it pickles): asks for 3 tokens, then for as many as allowed; reward 1.0 when the first
    reply was cut at its cap ("length") and the second stopped on its own."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": f"task {run.task}"}]
    first = client.chat.completions.create(model=run.model, messages=messages, max_tokens=3).choices[0]
    messages += [first.message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    second = client.chat.completions.create(model=run.model, messages=messages).choices[0]
    return float(first.finish_reason == "length" and second.finish_reason == "stop")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


TOOLS = tool_schemas([add])


def qwen3_script(k, prompt):
    """Turn 0 thinks and calls add(40, 2); turn 1 answers in text."""
    if k == 0:
        call = json.dumps({"name": "add", "arguments": {"a": 40, "b": 2}})
        return f"<think>\nI should add.\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    return "<think>\nDone.\n</think>\n\nThe answer is 42<|im_end|>"


def run(tokenizer, program, seeds=("s",), script=qwen3_script, **kwargs):
    generator = PromptReplyGenerator(tokenizer, script)
    processor = from_tokenizer(tokenizer)
    rollouts = batch_rollout(list(seeds), agent_env_factory(program), processor, tokenizer, generator,
                             history="deployed", **kwargs)  # fmt: skip
    return rollouts, generator


class SamplingGenerator(PromptReplyGenerator, GeneratorBase):
    """The scripted generator, honouring per-request temperature and top_p (it records each request's)."""

    request_sampling = frozenset({"temperature", "top_p"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampling = []

    def submit(self, requests):
        self.sampling += [dict(r.sampling) for r in requests]
        return super().submit(requests)


def model_spans(row):
    """(start, end) of each run of sampled tokens (env_mask 1) in a row's completion."""
    spans, start = [], None
    for i, m in enumerate([*row.env_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def framework(module: str, extra: str) -> Any:
    """Import ``module``; skip without it, except in CI (``TRL_ENV_REQUIRE_VLLM=1``), where a missing one fails."""
    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is not installed: pip install -e '.[{extra}]' (scripts/install.sh installs it)"
        if os.environ.get("TRL_ENV_REQUIRE_VLLM") == "1":  # CI: never skipped silently
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def qwen3_script(k: int, prompt: str) -> str:
    """Turn 0 thinks and calls add(40, 2); every later turn answers in text."""
    if k == 0:
        call = json.dumps({"name": "add", "arguments": {"a": 40, "b": 2}})
        return f"<think>\nI should add.\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    return "<think>\nDone.\n</think>\n\nThe answer is 42<|im_end|>"


def assert_token_exact(rollouts, generator) -> int:
    """Every sampled span of every row is the generator's answer for exactly that row's context; env tokens carry
    logprob 0; every generator call is one trained span. Returns the number of spans checked."""
    pairs = zip(generator.requests, generator.outputs, strict=True)
    answered = {tuple(q): (list(out.token_ids), list(out.logprobs)) for q, out in pairs}
    checked = 0
    for rollout in rollouts:
        for row in rollout.rows:
            assert len(row.completion_ids) == len(row.logprobs) == len(row.env_mask)
            for start, end in model_spans(row):
                context = tuple(row.prompt_ids + row.completion_ids[:start])
                assert context in answered, (rollout.seed, start)  # the rendering of what the program sent
                assert answered[context] == (row.completion_ids[start:end], row.logprobs[start:end])
                checked += 1
            assert all(row.logprobs[i] == 0.0 for i, m in enumerate(row.env_mask) if not m)
    assert checked == len(generator.requests) == sum(len(r.turns) for r in rollouts)
    return checked


def langchain_program(run):
    """LangChain's ChatOpenAI with a tool bound (``bind_tools``), a hand-written tool loop; over HTTP."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=run.model, base_url=run.base_url, api_key=run.api_key, max_retries=0).bind_tools([add])
    messages: list[Any] = [SystemMessage("You add."), HumanMessage(f"What is 40 + 2? ({run.seed})")]
    for _ in range(3):
        answer = llm.invoke(messages)
        messages.append(answer)
        if not answer.tool_calls:
            return float(answer.content == "The answer is 42")
        messages += [ToolMessage(str(add(**c["args"])), tool_call_id=c["id"]) for c in answer.tool_calls]
    return 0.0


async def pydantic_ai_program(run):
    """A PydanticAI Agent with a tool on its OpenAI chat model; over HTTP."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(run.model, provider=OpenAIProvider(base_url=run.base_url, api_key=run.api_key))
    adder = Agent(model, instructions="You add.", tools=[add])
    result = await adder.run(f"What is 40 + 2? ({run.seed})")
    return float(result.output == "The answer is 42")


def assert_served_exact(episodes, recorder) -> None:
    """Every sampled span of every row is what the server answered for exactly that row's context (``Recorder``),
    env tokens carry logprob 0, and every server answer is one trained turn."""
    answered, sent = recorder.answered()
    checked = 0
    for r in episodes:
        for row in r.rows:
            assert len(row.completion_ids) == len(row.logprobs) == len(row.env_mask)
            for start, end in model_spans(row):
                context = tuple(row.prompt_ids + row.completion_ids[:start])
                sampled = (row.completion_ids[start:end], row.logprobs[start:end])
                assert any((ids, lps) == sampled for ids, lps, _ in answered[context]), (r.seed, start)
                checked += 1
            env = [i for i, m in enumerate(row.env_mask) if not m]
            assert all(row.logprobs[i] == 0.0 for i in env)
    assert checked == sum(len(r.turns) for r in episodes) == len(sent)
