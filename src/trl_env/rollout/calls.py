"""One episode's calls into user code (``Calls``); the token lists it builds are ``rollout/episode.py``'s.

``Calls`` runs on worker threads and only returns values (``Opened``, ``Stepped``); it does every
piece of user code and every tokenisation, so the scheduler thread does neither. Each call into
user code is wrapped where it happens, so a failure is classified by its site, whatever its type
(``EpisodeFailure.kind``). ``Episode`` (``rollout/episode.py``) lives on the scheduler thread and keeps the
invariant that ``completion_ids``, ``logprobs`` and ``env_mask`` stay aligned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trl_env.backends.base import FinishReason, Generation
from trl_env.env import Closable, Env, Seed, Truncatable, check_result
from trl_env.errors import ConfigError, EnvError, EpisodeFailure, ProcessorError
from trl_env.render.chat import ChatHistories, ChatRequest, Reply, normalize, token_bytes
from trl_env.render.env_text import EnvText, call
from trl_env.render.history import Conversation, DeployedHistory
from trl_env.render.processors.base import FamilyProcessor, ParsedOutput, ParseStatus, Processor
from trl_env.render.tools.processor import ToolProcessor
from trl_env.render.tools.types import ToolResults
from trl_env.rollout.isolation import ProcessEnv


@dataclass(frozen=True)
class Opened:
    """What opening an episode produced: the env after ``reset`` and the tokenised prompt."""

    env: Env
    prompt_ids: list[int]
    alive: bool
    reward: float
    """The env's reward after ``reset``: the episode's, should its first turn be cut before any step."""
    env_info: dict[str, Any] | None = None
    """The env's ``info`` after ``reset``, JSON-safe; ``None`` without one."""
    messages: Conversation | None = None
    """With ``history="deployed"``: the conversation so far (``prompt_ids`` is its rendering); else ``None``."""


@dataclass(frozen=True)
class Stepped:
    """One model turn, parsed and stepped: what the env answered and the env tokens to append next."""

    env: Env
    text: str
    reasoning: str
    action: str
    delta: str
    reward: float
    alive: bool
    env_s: float
    env_ids: list[int] | None
    """``history="sampled"``: the env's answer tokenised, to append after this turn; ``None`` when the episode ends
    here (env done or out of turns), and always under ``history="deployed"`` (see ``prompt_ids``)."""
    parse_status: str | None = None
    """How the family processor read the turn (a ``ParseStatus`` value); ``None`` for other processors."""
    env_info: dict[str, Any] | None = None
    """The env's ``info`` after the step, JSON-safe; ``None`` without one."""
    tool_calls: tuple[tuple[str, bool], ...] = ()
    """(tool name, succeeded) for each tool result the env answered with."""
    messages: Conversation | None = None
    """With ``history="deployed"``: the conversation so far."""
    prompt_ids: list[int] | None = None
    """``history="deployed"``: the next turn's whole prompt (the template's rendering of ``messages``: the engine
    appends what extends the row, or starts a row with it); ``None`` when the episode ends here, and always under
    ``history="sampled"``."""


@dataclass(frozen=True)
class Settled:
    """What a ``Truncatable`` env left after ``truncate``: the episode's final reward and info."""

    reward: float
    info: dict[str, Any] | None
    close_error: str = ""
    """The error of a ``close()`` that failed after ``truncate`` succeeded."""


class Built:
    """The env ``env_factory()`` built for one episode, handed to the engine as soon as it exists, before ``reset``.

    The engine closes it however the episode ends, also when ``reset`` raised, returned garbage or was abandoned at
    ``env_timeout``. An env built after the engine gave up on its open (a factory slower than ``env_timeout``) is
    closed by the late call itself. Either way, once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._env: Env | None = None
        self._taken = False

    def put(self, env: Env) -> bool:
        """Hand ``env`` over (on the worker); False if the engine has given up on the episode already."""
        with self._lock:
            if self._taken:
                return False
            self._env = env
            return True

    def take(self) -> Env | None:
        """The env, once (on the scheduler); ``None`` if none was built yet, and from then on none is taken."""
        with self._lock:
            self._taken = True
            env, self._env = self._env, None
            return env


@dataclass
class Calls:
    """Everything that runs on worker threads: env code, processor code and tokenisation. Holds no model."""

    env_factory: Callable[[], Env]
    processor: Processor
    text: EnvText
    max_turns: int
    closer: str
    """The end-of-turn token as text: closes a turn cut by the length limit before the next user turn."""
    deployed: DeployedHistory | None = None
    """With ``history="deployed"``: renders each turn's whole prompt with the chat template."""
    chats: ChatHistories | None = field(default=None, init=False)
    """With ``history="deployed"``: the histories chat requests (``ChatRequest`` observations) render with."""

    def __post_init__(self) -> None:
        self.chats = None if self.deployed is None else ChatHistories(self.deployed)

    def open(self, index: int, seed: Seed | BaseException, built: Built | None = None) -> Opened:
        """Build the env (handed over in ``built`` at once), reset it with ``seed`` and tokenise the opening prompt."""
        if isinstance(seed, BaseException):  # the dataset row could not become a seed
            raise EpisodeFailure("prompt_error", seed)
        env = call("env_exception", self.env_factory)
        if built is not None and callable(getattr(env, "reset", None)) and not built.put(env):
            with contextlib.suppress(BaseException):  # nobody reads this call's result any more
                Calls.close(env, index)  # the engine gave up on this open before the env existed: nobody else will
            raise EpisodeFailure("env_timeout", EnvError("built after its episode was abandoned", env_index=index))
        if env is None or not callable(getattr(env, "reset", None)):
            raise EpisodeFailure(
                "env_bad_return",
                EnvError(
                    f"env_factory() returned {env!r:.80}, not an env; it must return a fresh env with reset and step "
                    "(pass the class, e.g. `env_factory=MyEnv`).",
                    env_index=index,
                    turn=0,
                    method="env_factory",
                ),
            )
        result = call("env_exception", env.reset, seed)
        checked = call("env_bad_return", check_result, result, env, method="reset", env_index=index, turn=0)
        if self.deployed is not None:
            if isinstance(checked.delta, ChatRequest):
                conversation = self._chat(None, checked.delta)
            else:
                conversation = self.deployed.extend(None, self.deployed.opening(checked.delta))
            return Opened(checked.env, conversation.ids, checked.alive, checked.reward, checked.info, conversation)
        prompt_ids = self.text.render(self.processor.init_system_input, checked.delta)
        return Opened(checked.env, prompt_ids, checked.alive, checked.reward, checked.info)

    def step(
        self, index: int, env: Env, sampled: Generation, turn: int, messages: Conversation | None = None
    ) -> Stepped:
        """Decode and parse the sampled turn, step the env with the action, tokenise what follows.

        With ``history="deployed"`` (``messages``: the conversation the turn was sampled from), what follows is the
        next turn's whole prompt: the template's rendering of the conversation with this reply and the env's answer.
        """
        started = time.perf_counter()
        if messages is not None and messages.chat:
            return self._step_chat(index, env, sampled, turn, messages, started)
        text = call("server_error", self.text.tokenizer.decode, sampled.token_ids, skip_special_tokens=False)
        parsed, status = call("processor_error", _parse, self.processor, text)
        if not (isinstance(parsed, tuple) and len(parsed) == 2 and all(isinstance(x, str) for x in parsed)):
            raise EpisodeFailure(
                "processor_error",
                ProcessorError(
                    f"{type(self.processor).__name__}.parse_agent_output returned {parsed!r:.80}; it must return "
                    "a tuple (reasoning: str, action: str)."
                ),
            )
        result = call("env_exception", env.step, parsed[1])
        checked = call("env_bad_return", check_result, result, env, method="step", env_index=index, turn=turn)
        env_ids, prompt_ids = None, None
        if messages is not None:
            assert self.deployed is not None
            reply = self.deployed.reply(text, _parsed_output(parsed, status))
            grown = [*messages.messages, reply, *self.deployed.answer(checked.delta)]
            if checked.alive and turn < self.max_turns:
                messages = self.deployed.extend(messages, grown)
                prompt_ids = messages.ids
            else:
                messages = Conversation(grown)
        elif checked.alive and turn < self.max_turns:
            lead = "" if sampled.finish_reason is FinishReason.STOP else self.closer
            if isinstance(checked.delta, ToolResults) and isinstance(self.processor, ToolProcessor):
                pieces = call("processor_error", self.processor.append_segments, checked.delta)
                env_ids = self.text.segments(pieces, lead=lead)
            else:
                env_ids = self.text.render(self.processor.append_user_input, checked.delta, lead=lead)
        results = checked.delta.results if isinstance(checked.delta, ToolResults) else ()
        return Stepped(
            env=checked.env,
            text=text,
            reasoning=parsed[0],
            action=parsed[1],
            parse_status=status,
            env_info=checked.info,
            tool_calls=tuple((r.name, r.ok) for r in results),
            delta=checked.delta,
            reward=checked.reward,
            alive=checked.alive,
            env_s=time.perf_counter() - started,
            env_ids=env_ids,
            messages=messages,
            prompt_ids=prompt_ids,
        )

    def _chat(self, previous: Conversation | None, request: ChatRequest) -> Conversation:
        """A chat request's messages rendered with its tools; ``previous`` is reused only if they extend it."""
        assert self.chats is not None
        history = call("processor_error", self.chats.get, request.tools)
        messages = normalize(request.messages, history)
        if previous is not None:
            old = previous.messages
            previous = previous if previous.tools == request.tools and messages[: len(old)] == old else None
        conversation = history.extend(previous, messages)
        return dataclasses.replace(conversation, tools=request.tools, chat=True, max_tokens=request.max_tokens)

    def _step_chat(
        self, index: int, env: Env, sampled: Generation, turn: int, messages: Conversation, started: float
    ) -> Stepped:
        """``step`` for a chat env: stepped with a ``Reply``; its next ``ChatRequest`` is rendered as it stands."""
        assert self.chats is not None
        history = call("processor_error", self.chats.get, messages.tools)
        decode = self.text.tokenizer.decode
        text = call("server_error", decode, sampled.token_ids, skip_special_tokens=False)
        parsed, status = call("processor_error", _parse, history.processor, text)
        assert isinstance(parsed, tuple), "family and tool processors return (reasoning, action)"
        message = call("processor_error", history.reply, text, _parsed_output(parsed, status))
        field_name = history.reasoning_field
        reply = Reply(
            str(message.get("content") or ""),  # what the agent is answered (the one rule), not the parse
            message,
            reasoning_field=field_name,
            finish_reason=sampled.finish_reason.value,
            token_ids=sampled.token_ids,
            logprobs=sampled.logprobs,
            decode_one=functools.partial(_decode_one, decode),  # only if the call asks for logprobs (agents/wire.py)
            bytes_one=functools.partial(token_bytes, self.text.tokenizer),  # the same, for logprobs' bytes
            prompt_tokens=len(messages.ids),
        )
        result = call("env_exception", env.step, reply)
        checked = call("env_bad_return", check_result, result, env, method="step", env_index=index, turn=turn)
        going = checked.alive and turn < self.max_turns
        prompt_ids, grown = None, messages
        if isinstance(checked.delta, ChatRequest):
            grown = self._chat(messages, checked.delta) if going else Conversation(list(checked.delta.messages))
            prompt_ids = grown.ids if going else None
        elif going:
            grown = history.extend(messages, [*messages.messages, reply.message, *history.answer(checked.delta)])
            grown, prompt_ids = dataclasses.replace(grown, tools=messages.tools, chat=True), grown.ids
        return Stepped(
            env=checked.env,
            text=text,
            reasoning=str(message.get(field_name) or "") if field_name else "",  # as answered: the transcript's
            action=str(reply),
            parse_status=status,
            env_info=checked.info,
            delta=checked.delta,
            reward=checked.reward,
            alive=checked.alive,
            env_s=time.perf_counter() - started,
            env_ids=None,
            messages=grown,
            prompt_ids=prompt_ids,
        )

    @staticmethod
    def close(env: Env, index: int, truncated: str | None = None) -> Settled | None:
        """Tell a ``Truncatable`` env that trl-env ended its episode (``truncated``: why), then call ``close()``.

        Returns the reward and info ``truncate`` left (``None`` when the env was not told). ``close()`` runs even
        when ``truncate`` failed; a ``close()`` that fails after a good ``truncate`` keeps what it settled.
        """
        settled = None
        try:
            if truncated is not None and isinstance(env, Truncatable):
                call("env_exception", env.truncate, truncated)
                checked = call(
                    "env_bad_return", check_result, (env, ""), env, method="truncate", env_index=index, turn=-1
                )
                settled = Settled(checked.reward, checked.info)
        finally:
            if isinstance(env, Closable) and callable(env.close):
                try:
                    env.close()
                except BaseException as e:  # noqa: BLE001  # recorded; what truncate settled stands
                    if settled is None:
                        raise
                    settled = dataclasses.replace(settled, close_error=f"{type(e).__name__}: {e}")
        return settled


def kill(env: Env) -> None:
    """After a ``close`` abandoned at ``env_timeout``: kill the env's worker process (``isolated``), if it has one.

    An env on the engine's threads cannot be stopped; its thread is left behind (``trl_env.rollout.workers``).
    """
    if isinstance(env, ProcessEnv):
        env.kill()


def _decode_one(decode: Callable[..., str], token_id: int) -> str:
    """One sampled id's text, special tokens included (``Reply.tokens``)."""
    return decode([token_id], skip_special_tokens=False)


def _parse(processor: Processor, text: str) -> tuple[object, str | None]:
    """``parse_agent_output``'s answer, and the ``ParseStatus`` value when a family or tool processor parsed it."""
    if (
        isinstance(processor, FamilyProcessor)
        and type(processor).parse_agent_output is FamilyProcessor.parse_agent_output
    ) or isinstance(processor, ToolProcessor):
        parsed = processor.parse(text)
        return (parsed.reasoning, parsed.action), parsed.status.value
    return processor.parse_agent_output(text), None


def _parsed_output(parsed: tuple[Any, ...], status: str | None) -> ParsedOutput | None:
    """``_parse``'s answer as the ``ParsedOutput`` it came from; ``None`` where no family or tool processor parsed."""
    return None if status is None else ParsedOutput(parsed[0], parsed[1], ParseStatus(status))


def check_env_timeout(env_timeout: float | None) -> None:
    """Fail early on a timeout that is not a positive number of seconds (or ``None``)."""
    if env_timeout is not None and not env_timeout > 0:
        raise ConfigError(f"env_timeout={env_timeout!r}: it must be > 0 seconds, or None to wait forever.")
