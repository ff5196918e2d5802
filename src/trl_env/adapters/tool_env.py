"""``ToolEnv``: an Env whose actions are the model's native tool calls, built from plain Python functions.

A reply with calls runs them, in order, and the env answers with their results (``ToolResults``, which
a ``ToolProcessor`` renders as the template's tool turns). A reply without a call is the final answer:
``score(answer, seed)`` is the reward and the episode ends. Every bad call is an observation, never an
exception: a malformed call, an unknown tool, wrong or missing arguments, a tool that raises or that runs
past ``tool_timeout``; each is a failed call in ``info`` (``tool_calls``, ``tool_errors``).

Example::

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

Args:
            a: the first number
            b: the second number
        \"\"\"
        return a + b

    env_factory = functools.partial(ToolEnv, [add], score=lambda answer, seed: float(answer == str(eval(seed))))
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trl_env.env import Action, Delta, Seed
from trl_env.render.tools.types import ToolCall, ToolCalls, ToolResult, ToolResults


def methods_as_tools(obj: object) -> list[Callable[..., Any]]:
    """The public methods of ``obj`` (as TRL's ``environment_factory`` takes them: not ``reset`` nor ``get_reward``)."""
    return [
        getattr(obj, name)
        for name, _ in inspect.getmembers(type(obj), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


class ToolEnv:
    """Tools the model calls natively; a reply without a call ends the episode as the answer.

    Args:
        tools: functions (type hints and a docstring, as ``transformers.utils.get_json_schema`` reads them), or an
            object whose public methods are the tools.
        task: the first observation for a seed (default: the seed itself).
        score: the reward for the final answer, ``score(answer, seed)`` (default: no reward, 0.0).
        tool_timeout: seconds a call may run; a slower call is an error observation (its thread is abandoned).
            Keep it below the engine's ``env_timeout``, which ends the whole episode.
        max_calls: a budget on tool use: the most calls in an episode (every call the model writes counts); calls
            past it get an error observation and do not run, and the episode ends once it is spent.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] | object,
        *,
        task: Callable[[Seed], str] | None = None,
        score: Callable[[str, Seed], float] | None = None,
        tool_timeout: float | None = 30.0,
        max_calls: int | None = None,
    ) -> None:
        functions = list(tools) if isinstance(tools, Sequence) else methods_as_tools(tools)
        self.tools: dict[str, Callable[..., Any]] = {f.__name__: f for f in functions}
        self.task, self.score = task, score
        self.tool_timeout, self.max_calls = tool_timeout, max_calls
        self.reward, self.alive, self.seed = 0.0, True, ""
        self.info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "answered": False}

    def reset(self, seed: Seed) -> tuple[ToolEnv, Delta]:
        """Start an episode: the task for ``seed``."""
        self.seed = seed
        return self, seed if self.task is None else self.task(seed)

    def step(self, action: Action) -> tuple[ToolEnv, Delta]:
        """Run the calls in ``action`` and answer with their results; a reply without a call is the final answer."""
        if not (isinstance(action, ToolCalls) and action.calls):
            self.info["answered"] = True
            self.reward = self.settle(str(action))
            self.alive = False
            return self, ""
        left = len(action.calls) if self.max_calls is None else self.max_calls - self.info["tool_calls"]
        results = [self.run(call) if i < left else self.refuse(call) for i, call in enumerate(action.calls)]
        self.info["tool_calls"] += len(results)
        self.info["tool_errors"] += sum(not r.ok for r in results)
        if self.max_calls is not None and self.info["tool_calls"] >= self.max_calls:
            self.alive = False
        return self, ToolResults(results)

    def settle(self, answer: str) -> float:
        """The reward for the final ``answer``."""
        return 0.0 if self.score is None else float(self.score(answer, self.seed))

    def refuse(self, call: ToolCall) -> ToolResult:
        """The error observation for a call past ``max_calls``: it does not run."""
        spent = f"the episode's budget of {self.max_calls} tool calls (max_calls) is spent"
        return ToolResult(call.name, f"Error: this call did not run: {spent}.", ok=False)

    def run(self, call: ToolCall) -> ToolResult:
        """One call's result, or an error observation saying what went wrong and how to call it right."""

        def error(text: str) -> ToolResult:
            return ToolResult(call.name, f"Error: {text}", ok=False)

        if call.error:
            return error(call.error)
        tool = self.tools.get(call.name)
        if tool is None:
            return error(f"unknown tool {call.name!r}; the tools are: {', '.join(self.tools)}.")
        try:
            inspect.signature(tool).bind(**call.arguments)
        except TypeError as e:
            return error(f"bad arguments for {call.name}: {e}.")
        outcome: list[Any] = []

        def target() -> None:
            try:
                value = tool(**call.arguments)
                outcome.append((True, asyncio.run(value) if inspect.iscoroutine(value) else value))
            except BaseException as e:  # noqa: BLE001  # the tool's failure is the model's observation
                outcome.append((False, e))

        worker = threading.Thread(target=target, daemon=True, name=f"trl-env-tool-{call.name}")
        worker.start()
        worker.join(self.tool_timeout)
        if not outcome:
            return error(f"{call.name} did not return within {self.tool_timeout} s.")
        ok, value = outcome[0]
        if not ok:
            return error(f"{call.name} raised {type(value).__name__}: {value}")
        return ToolResult(call.name, str(value))


class TrlEnvironment(ToolEnv):
    """A TRL ``environment_factory`` class as a trl-env env: its public methods are the tools.

    ``reset(seed)`` calls the instance's ``reset(prompt=seed)`` and appends what it returns to the seed (as TRL
    appends it to the prompt); the reward is the instance's ``get_reward()`` when it has one, read after every
    step. Build one per episode: ``env_factory=lambda: TrlEnvironment(MyEnvironment())``.
    """

    def __init__(self, instance: object, **options: Any) -> None:
        super().__init__(instance, **options)
        self.instance = instance
        members = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
        self._get_reward = getattr(instance, "get_reward") if "get_reward" in members else None  # noqa: B009

    def reset(self, seed: Seed) -> tuple[ToolEnv, Delta]:
        """TRL's ``reset(prompt=...)``; its observation follows the seed."""
        self.seed = seed
        observation = self.instance.reset(prompt=seed)  # type: ignore[attr-defined]  # TRL's environment contract
        return self, seed + (observation if isinstance(observation, str) else "")

    def step(self, action: Action) -> tuple[ToolEnv, Delta]:
        """Run the calls; the reward is ``get_reward()`` after every step."""
        env, delta = super().step(action)
        if self._get_reward is not None:
            self.reward = float(self._get_reward())
        return env, delta
