"""``AgentEnv``: an agent program run as an episode, by inversion of control, so it rides the one engine.

``reset`` starts the program on a thread of its own and returns its first model call (a ``ChatRequest``); ``step``
answers the waiting call with the sampled reply and returns the next call, or ends the episode with the program's
reward. Every call is a turn: batching, budgets, ``env_timeout``, credit, both trainers and ``trl-env eval`` apply
unchanged. Needs ``history="deployed"`` (each call's messages rendered by the chat template). See docs/agents.md.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trl_env.agents.gateway import Gateway, Pending, Session, import_stack, refuse, shared_gateway
from trl_env.agents.run import AgentProgram, AgentRun
from trl_env.agents.wire import ChatCall, tool_choice_unmet
from trl_env.env import Delta, Env, RowSeed, Seed
from trl_env.errors import AgentError, ConfigError, EpisodeFailure
from trl_env.render.chat import ChatRequest, Reply
from trl_env.render.tools.format import tool_schemas

__all__ = ["AgentEnv", "AgentEnvFactory", "agent_env_factory"]

Verifier = Callable[[AgentRun, Any], float]
"""Scores an episode from its run and what the program returned (called on the episode's worker thread)."""

SamplingMode = Literal["trainer", "agent"]
AGENT_SAMPLING = frozenset({"temperature", "top_p"})
"""What ``sampling="agent"`` honours per call; every other sampling field an agent sets is the trainer's."""
CAPS = frozenset({"max_tokens", "max_completion_tokens"})
"""Honoured in both modes: a call's own cap (the smaller of the two) caps its turn below the trainer's budgets."""


class AgentEnv:
    """One episode of an agent program: each model call it makes is a turn (``history="deployed"``)."""

    def __init__(
        self,
        program: AgentProgram,
        *,
        gateway: Gateway | None = None,
        verify: Verifier | None = None,
        settle_s: float = 30.0,
        sampling: SamplingMode = "trainer",
    ) -> None:
        """``program`` runs once per episode; ``verify`` (optional) scores it instead of its return value.

        ``settle_s``: after trl-env ends an episode (a budget), how long its program may take to return its reward.
        ``sampling``: ``"trainer"`` samples every call with the trainer's settings (on-policy); ``"agent"`` samples
        each call with the ``temperature`` / ``top_p`` it asks for (off-policy, docs/agents.md).
        """
        self.program, self.verify, self.settle_s, self.sampling = program, verify, settle_s, sampling
        self.gateway = gateway
        self.reward, self.alive = 0.0, True
        self.turn_sampling: Mapping[str, float] = {}
        """The waiting call's own settings, read by the engine (a ``SamplingEnv``); empty: the trainer's."""
        self.info: dict[str, Any] = {"agent_calls": 0, "agent_sampling": {"mode": sampling, "calls": []}}
        self._session: Session | None = None
        self._pending: Pending | None = None
        self._run: AgentRun | None = None
        self._ended: str | None = None  # why the episode ended; under _lock with _session (close may race reset)
        self._lock = threading.Lock()

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Start the program with ``seed`` as its task; return its first model call.

        A ``RowSeed`` gives the program its row's prompt as ``task`` and its other columns as ``AgentRun.extra``.

        Raises:
            EpisodeFailure: ``agent_error`` when the program raised or returned before calling the model.
        """
        gateway = self.gateway or shared_gateway()
        with self._lock:
            if self._ended is not None:  # closed before it started (its reset was abandoned): no session, no program
                raise EpisodeFailure("agent_error", AgentError(f"the episode ended ({self._ended}) before it started"))
            self._session = session = gateway.open()
        row: Mapping[str, Any] = seed.row if isinstance(seed, RowSeed) else {}
        self._run = run = AgentRun(
            task=row.get("prompt", seed),
            seed=str(seed),
            base_url=gateway.base_url,
            api_key=session.key,
            model=gateway.model,
            extra={k: v for k, v in row.items() if k != "prompt"},
        )
        threading.Thread(target=self._main, args=(run, session), daemon=True, name="trl-env-agent").start()
        return self._next()

    def step(self, action: str) -> tuple[Env, Delta]:
        """Answer the waiting call with ``action`` (a ``Reply``); return the program's next call, or end.

        Raises:
            EpisodeFailure: ``agent_error`` when the program raised.
        """
        if not isinstance(action, Reply):
            raise ConfigError(
                "an AgentEnv is stepped with a Reply: run it with history='deployed' (make_rollout_func(..., "
                "history='deployed'), batch_rollout(..., history='deployed'))."
            )
        assert self._pending is not None, "a step answers the call reset or the last step returned"
        pending, self._pending = self._pending, None
        if not pending.future.done():  # the client may have gone; the turn stands either way
            pending.future.set_result(action)
        if tool_choice_unmet(pending.call, action.message):  # answered as sampled (agents/wire.py)
            self.info["agent_tool_choice_unmet"] = self.info.get("agent_tool_choice_unmet", 0) + 1
        return self._next()

    def truncate(self, reason: str) -> None:
        """trl-env ended the episode (``max_turns``, ``length``): answer the waiting call ``length``, refuse later ones.

        The program's return value (within ``settle_s``) is the episode's reward.
        """
        if self._pending is not None:
            empty = Reply(
                "",
                {"role": "assistant", "content": ""},
                reasoning_field=None,
                finish_reason="length",
                token_ids=(),
                logprobs=(),
                tokens=(),
                prompt_tokens=0,
            )
            self._pending.future.set_result(empty)
            self._pending = None
        self._close(reason)
        assert self._session is not None
        outcome = self._session.wait_outcome(self.settle_s)
        if outcome is not None and outcome[0] == "returned":
            self._score(outcome[1])
        else:
            self.info["agent_unsettled"] = "raised" if outcome else f"no return within settle_s={self.settle_s}"

    def close(self) -> None:
        """End the session, however the episode ended (a ``reset`` abandoned at ``env_timeout`` too).

        The key stops authenticating, a ``reset`` or ``step`` waiting for the program's next call returns, and the
        program's waiting and later calls are refused with ``episode_ended``.
        """
        self._close("closed")

    def _close(self, reason: str) -> None:
        with self._lock:
            self._ended = self._ended or reason
        if self._session is None:
            return
        if self._pending is not None:
            refuse(self._pending, f"this episode has ended ({reason}); the call was not answered")
            self._pending = None
        (self.gateway or shared_gateway()).close(self._session, reason)

    def _main(self, run: AgentRun, session: Session) -> None:
        """The program's thread: run it (an ``async`` one on an event loop of its own) and record how it ended."""
        try:
            result = self.program(run)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        except BaseException as e:  # noqa: BLE001  # the program's failure ends its episode, recorded there
            session.finish("raised", e)
        else:
            session.finish("returned", result)

    def _next(self) -> tuple[Env, Delta]:
        assert self._session is not None
        pending = self._session.next()
        assert self._run is not None
        if self._run.reported:  # the reward so far, as the program reported it
            self.reward = self._run.reported[-1]
        if pending is not None:
            self._pending = pending
            self.info["agent_calls"] += 1
            self._record_sampling(pending.call)
            return self, ChatRequest(pending.call.messages, pending.call.tools, pending.call.max_tokens)
        self.alive = False
        outcome = self._session.outcome
        self._close("the program returned")
        if outcome is None:
            raise EpisodeFailure("agent_error", AgentError("the agent's session ended before the program did"))
        kind, value = outcome
        if kind == "raised":
            error = AgentError(f"the agent program raised {type(value).__name__}: {value}")
            raise EpisodeFailure("agent_error", error) from value
        if self.info["agent_calls"] == 0:
            raise EpisodeFailure(
                "agent_error",
                AgentError(
                    f"the agent program returned {value!r:.80} before its first model call; it must call the model "
                    "through AgentRun's client (run.openai() / run.async_openai())"
                ),
            )
        self._score(value)
        return self, ""

    def _record_sampling(self, call: ChatCall) -> None:
        """Set the call's own settings (``sampling="agent"``); record what it asked for and what is used."""
        asked, honoured = call.sampling, AGENT_SAMPLING if self.sampling == "agent" else frozenset()
        self.turn_sampling = {k: float(v) for k, v in asked.items() if k in honoured}
        used: dict[str, float | int] = dict(self.turn_sampling)
        if call.max_tokens is not None:
            used["max_tokens"] = call.max_tokens  # the ChatRequest's cap (turn_request), and the trainer's budgets
        self.info["agent_sampling"]["calls"].append({"asked": dict(asked), "used": used})
        for name in asked.keys() - honoured - CAPS:
            overridden = self.info.setdefault("agent_overridden", {})
            overridden[name] = overridden.get(name, 0) + 1

    def _score(self, value: Any) -> None:
        assert self._run is not None
        if self.verify is not None:
            value = self.verify(self._run, value)
        if value is None:
            self.info["agent_reward"] = "none returned"
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise EpisodeFailure(
                "agent_error", AgentError(f"the agent program returned {value!r:.80}; return a finite float or None")
            )
        self.reward = float(value)


async def _awaited(result: Any) -> Any:
    return await result


@dataclass(frozen=True)
class AgentEnvFactory:
    """``agent_env_factory``'s answer: builds an ``AgentEnv`` per episode; says which settings its calls may set."""

    program: AgentProgram
    gateway: Gateway | None = None
    verify: Verifier | None = None
    settle_s: float = 30.0
    sampling: SamplingMode = "trainer"
    tools: tuple[dict[str, Any], ...] = ()
    """The tools the program offers its calls (JSON schemas), declared so the trainer can check the template."""

    def __post_init__(self) -> None:
        # the openai SDK and the gateway's stack, imported here: where the factory is unpickled too, so the zygote of
        # env_executor="process" / isolated(...) imports them once and every worker it forks has them (~1 s of CPU
        # per worker otherwise)
        import_stack()

    @property
    def request_sampling(self) -> frozenset[str]:
        """The per-request settings its episodes send (a ``SamplingEnvFactory``): checked against the generator."""
        return AGENT_SAMPLING if self.sampling == "agent" else frozenset()

    def __call__(self) -> AgentEnv:
        """A fresh episode."""
        return AgentEnv(
            self.program, gateway=self.gateway, verify=self.verify, settle_s=self.settle_s, sampling=self.sampling
        )

    def __repr__(self) -> str:
        name = getattr(self.program, "__qualname__", type(self.program).__name__)
        return f"agent_env_factory({name}, sampling={self.sampling!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles (``env_executor="process"``, ``isolated``) with ``sampling="trainer"`` only.

        Raises:
            ConfigError: with ``sampling="agent"``: a worker process's env cannot hand its settings to the engine.
        """
        if self.sampling == "agent":
            raise ConfigError(
                "agent_env_factory(..., sampling='agent') runs its episodes in the trainer's process: an env in a "
                "worker process cannot pass its calls' sampling to the engine; drop env_executor='process' / "
                "isolated(...), or use sampling='trainer'."
            )
        return (AgentEnvFactory, (self.program, self.gateway, self.verify, self.settle_s, self.sampling, self.tools))


def agent_env_factory(
    program: AgentProgram,
    *,
    gateway: Gateway | None = None,
    verify: Verifier | None = None,
    settle_s: float = 30.0,
    sampling: SamplingMode = "trainer",
    tools: Sequence[Callable[..., Any] | Mapping[str, Any]] = (),
) -> AgentEnvFactory:
    """An ``env_factory`` running ``program`` once per episode, for ``make_rollout_func`` / ``batch_rollout``.

    Use it with ``history="deployed"``. Calls go through ``gateway`` (default: the process's, started on first use).
    ``sampling``: ``"trainer"`` (default) samples every call with the trainer's settings, on-policy, whatever the
    agent asks for; ``"agent"`` honours each call's ``temperature`` and ``top_p`` (the generator must take them per
    request: ``VLLMServerGenerator``), which makes the episodes off-policy (docs/agents.md). Either way
    ``info["env"]["agent_sampling"]`` records, per call, what the agent asked for and what was used.
    ``tools``: the tools the program offers its calls (typed, documented functions or JSON schemas), declared so
    that ``EpisodeGRPOTrainer`` checks at construction that the chat template renders them (a template without
    tools would fail every episode); the program still sends its own ``tools`` with each call.

    Raises:
        ConfigError: ``program`` is not callable, ``sampling`` is neither ``"trainer"`` nor ``"agent"``, a tool's
            schema cannot be read, or the ``agents`` extra is not installed.
    """
    if not callable(program):
        raise ConfigError(f"program={program!r}: pass a function taking an AgentRun (sync or async).")
    if sampling not in ("trainer", "agent"):
        raise ConfigError(
            f"sampling={sampling!r}: use 'trainer' (the trainer's settings for every call, on-policy) or 'agent' "
            "(each call's own temperature and top_p, off-policy)."
        )
    # it pickles (with a module-level program and the default gateway), so ``env_executor="process"`` /
    # ``isolated(...)`` can run each program in a worker process of its own (``sampling="trainer"`` only)
    schemas = tuple(tool_schemas(tools)) if tools else ()
    return AgentEnvFactory(program, gateway=gateway, verify=verify, settle_s=settle_s, sampling=sampling, tools=schemas)
