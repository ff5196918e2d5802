"""Parity: the same multi-turn task as an Env (history="deployed") and as an agent program on the real ``openai``
SDK through the gateway gives identical rows (ids, logprobs, masks) for the same scripted replies.

ChatML (the real Qwen 2.5 tokenizer), Qwen 3 with thinking and with native tool calls (the real Qwen 3 tokenizer),
and a tool template TRL's ``environment_factory`` does not parse.
"""

from __future__ import annotations

import copy
import json

import pytest
from agents_support import PromptReplyGenerator, rows_of

from trl_env.adapters.tool_env import ToolEnv
from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.render.tools.format import tool_schemas
from trl_env.render.tools.processor import ToolProcessor
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

SEEDS = ["7", "8", "9"]


class TalkEnv:
    """Three turns of plain observations."""

    def __init__(self):
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Start {seed}: say a number."

    def step(self, action):
        self.turn += 1
        self.reward += 1.0 if action.strip().isdigit() else 0.0
        self.alive = self.turn < 3
        return self, f"Observation {self.turn} after {action.strip()!r}."


def talk_program(run):
    """TalkEnv's task, written as an agent on the openai SDK."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": f"Start {run.seed}: say a number."}]
    reward = 0.0
    for turn in range(1, 4):
        answer = client.chat.completions.create(model=run.model, messages=messages).choices[0].message
        reward += 1.0 if (answer.content or "").strip().isdigit() else 0.0
        messages.append(answer.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"Observation {turn} after {answer.content.strip()!r}."})
    return reward


def both(tokenizer, processor, script, env_factory, program, seeds=SEEDS, **kwargs):
    out = []
    for factory in (env_factory, agent_env_factory(program)):
        generator = PromptReplyGenerator(tokenizer, script)
        rollouts = batch_rollout(seeds, factory, processor, tokenizer, generator, history="deployed", **kwargs)
        out.append(rollouts)
    return out


@pytest.mark.parametrize(
    ("name", "script"),
    [
        ("pypi:qwen2_5", lambda k, p: f"{k}<|im_end|>"),
        ("pypi:qwen3", lambda k, p: f"<think>\nturn {k}: think\n</think>\n\n{k}<|im_end|>"),
    ],
)
def test_text_agent_rows_equal_the_env_rows(name, script):
    tokenizer = load_tokenizer(name)
    processor = from_tokenizer(tokenizer)
    env_rollouts, agent_rollouts = both(tokenizer, processor, script, TalkEnv, talk_program)
    for e, a in zip(env_rollouts, agent_rollouts, strict=True):
        assert e.ending is Ending.ENV_DONE and a.ending is Ending.ENV_DONE, (e.error, a.error)
        assert a.reward == e.reward == 3.0
        assert len(a.turns) == len(e.turns) == 3
    assert rows_of(agent_rollouts) == rows_of(env_rollouts)
    assert len(env_rollouts[0].rows) >= 1


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def tool_program(run):
    """ToolEnv([add])'s task, as an agent: run the calls the model makes until it answers in text."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": run.task}]
    tools = tool_schemas([add])
    for _ in range(4):
        message = client.chat.completions.create(model=run.model, messages=messages, tools=tools).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return score(message.content or "", run.seed)
        for call in message.tool_calls:
            result = add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return 0.0


def score(answer, seed):
    return float("The answer is 42" in answer)


def tool_script(tokenizer, processor, thought):
    """Turn 0 calls add(40, 2) and turn 1 adds 1 + 2, as the template renders such replies; turn 2 answers."""
    fmt = processor.format

    def rendered(calls):
        message = {"role": "assistant", "content": thought, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "add", "arguments": json.dumps(calls) if fmt.args_as_text else calls}}]}  # fmt: skip
        probe = [{"role": "user", "content": "probe"}]
        kwargs = {"tools": fmt.tools, "tokenize": False, **fmt.template_kwargs}
        prompt = tokenizer.apply_chat_template(probe, add_generation_prompt=True, **kwargs)
        full = tokenizer.apply_chat_template([*probe, message], **kwargs)
        reply = full[len(prompt) :]
        return reply[: reply.find(fmt.call_stop) + len(fmt.call_stop)]

    replies = [rendered({"a": 40, "b": 2}), rendered({"a": 1, "b": 2})]
    final = (thought + "\n\n" if thought else "") + "The answer is 42" + processor.stop_strings[0]
    return lambda k, p: replies[k] if k < 2 else final


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "marker", "thought"),
    [
        ("pypi:qwen3", "<|im_start|>assistant", "<think>\nadding\n</think>"),  # Qwen 3: thinking and tools
        ("trl:deepseekv3", None, ""),  # a tool template TRL's environment_factory cannot parse (arguments as text)
    ],
)
def test_tool_agent_rows_equal_the_tool_env_rows(name, marker, thought):
    from trl.chat_template_utils import add_response_schema

    tokenizer = load_tokenizer(name)
    if name.startswith("trl:"):  # TRL has no response schema for it: its environment_factory cannot read the calls
        with pytest.raises(ValueError):
            add_response_schema(copy.deepcopy(tokenizer))
    processor = ToolProcessor.from_tokenizer(tokenizer, [add])
    script = tool_script(tokenizer, processor, thought)
    if marker is None:  # k: the calls in the prompt
        marker = lambda prompt: prompt.count(processor.format.call_marker)  # noqa: E731
    out = []
    for factory in (lambda: ToolEnv([add], score=score), agent_env_factory(tool_program)):
        generator = PromptReplyGenerator(tokenizer, script, marker=marker)
        out.append(batch_rollout(SEEDS, factory, processor, tokenizer, generator, history="deployed"))
    env_rollouts, agent_rollouts = out
    for e, a in zip(env_rollouts, agent_rollouts, strict=True):
        assert e.ending is Ending.ENV_DONE and a.ending is Ending.ENV_DONE, (e.error, a.error)
        # the agent scores the reply's content; ToolEnv scores the processor's action (DeepSeek V3's base processor
        # reads this reply as reasoning: the action is empty), so only the rows must agree
        assert a.reward == 1.0 and len(a.turns) == len(e.turns) == 3
    assert rows_of(agent_rollouts) == rows_of(env_rollouts)


class QuietEnv:
    """Three turns whose observations do not depend on the reply (so both paths see the same conversation)."""

    def __init__(self):
        self.reward, self.alive, self.turn, self.actions = 0.0, True, 0, []

    def reset(self, seed):
        return self, f"Start {seed}."

    def step(self, action):
        self.turn += 1
        self.actions.append(str(action))
        self.info = {"actions": self.actions}
        self.alive = self.turn < 3
        return self, f"Observation {self.turn}."


def test_an_endoftext_mid_reply_is_part_of_the_reply_the_agent_gets_and_the_row_holds():
    """The rule (docs/agents.md): a reply is every token sampled for the turn less the one that ended it. The agent is
    answered with exactly that text, an <|endoftext|> sampled mid-reply and what follows included; the row holds those
    tokens; the next prompt renders them (the Env path renders the same reply). An Env's action is the processor's
    parse of the turn, which ends at <|endoftext|>."""
    tokenizer = load_tokenizer("pypi:qwen2_5")
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": f"Start {run.seed}."}]
        for turn in range(1, 4):
            answer = client.chat.completions.create(model=run.model, messages=messages).choices[0].message
            seen.append(answer.content)
            messages += [answer.model_dump(exclude_none=True), {"role": "user", "content": f"Observation {turn}."}]
        return 0.0

    script = lambda k, p: f"{k}<|endoftext|>tail {k}<|im_end|>"  # noqa: E731
    env_rollouts, agent_rollouts = both(tokenizer, from_tokenizer(tokenizer), script, QuietEnv, program, seeds=["7"])
    assert rows_of(agent_rollouts) == rows_of(env_rollouts)
    (row,) = agent_rollouts[0].rows  # one row: every call extended the last one verbatim
    sampled = [i for i, m in zip(row.completion_ids, row.env_mask, strict=True) if m]
    replies = tokenizer.decode(sampled, skip_special_tokens=False).split("<|im_end|>")[:-1]
    assert seen == replies == [f"{k}<|endoftext|>tail {k}" for k in range(3)]
    assert env_rollouts[0].info["env"]["actions"] == ["0", "1", "2"]  # the parse: the turn's text ends at <|endoftext|>
