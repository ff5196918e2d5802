"""The multi-turn rollout engine: ``batch_rollout``, its budgets, and the ``Turn``/``Rollout`` records.

Token bookkeeping (one entry per completion token, all lists aligned): ``completion_ids`` holds the
model's sampled ids verbatim and the tokenised env text between turns; ``env_mask`` is 1 for a
sampled id and 0 for an env-inserted one; ``logprobs`` is the sampler's processed logprob for a
sampled id and 0.0 for an env one. Only text the env adds is tokenised, once, when it arrives.
Axis suffixes: ``_B`` = episodes in the batch (used only where lists nest).
"""

from __future__ import annotations

import queue
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from trl_env.backends.base import FinishReason, Generation, Generator, check_request_sampling
from trl_env.env import Closable, Env, Seed, Truncatable
from trl_env.errors import (
    ConfigError,
    EnvError,
    EnvTimeoutError,
    EpisodeFailure,
    ServerError,
    TrlEnvError,
)
from trl_env.render.chat import SamplingEnvFactory
from trl_env.render.history import DeployedHistory, History, as_history
from trl_env.render.processors.base import check_processor, stop_token_ids
from trl_env.rollout.calls import Built, Calls, EnvText, Opened, Stepped, check_env_timeout, kill
from trl_env.rollout.coalescing import COALESCE_S, check_coalesce, coalesce_window
from trl_env.rollout.episode import Episode, anchor_of, cut_at_own_cap, turn_request
from trl_env.rollout.records import Budgets, Ending, Rollout, Turn
from trl_env.rollout.workers import Workers, drain

__all__ = ["COALESCE_S", "Budgets", "Ending", "History", "Rollout", "Turn", "batch_rollout"]

Call = Literal["open", "step", "close", "kill"]

_WAKE: Future[Any] = Future()
"""Put on the done queue when a call starts waiting on another episode: wakes the scheduler, matches no call."""


def _name(obj: object) -> str:
    return str(getattr(obj, "__qualname__", type(obj).__name__))


def batch_rollout(
    seeds: Sequence[Seed | BaseException],
    env_factory: Callable[[], Env],
    processor: Any,
    tokenizer: Any,
    generator: Generator,
    *,
    budgets: Budgets | None = None,
    parse_truncated_turns: bool = False,
    strict: bool = False,
    env_workers: int = 16,
    env_timeout: float | None = 300.0,
    coalesce_s: float | Literal["auto"] = "auto",
    on_episode_end: Callable[[int], None] | None = None,
    history: History | str = History.SAMPLED,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[Rollout]:
    """Run one episode per seed, each with a fresh env from ``env_factory()``, and return them in order.

    Episodes advance independently: a continuous generator gets each turn as soon as its episode
    is ready (turns that get ready while other envs are still stepping are held up to ``coalesce_s``
    and handed over together, as one batch), a wave generator gets every waiting episode at once.
    Env calls run on a pool of ``env_workers`` threads, overlapping generation.

    Args:
        seeds: one per episode; each is passed to ``env.reset``. An exception in place of a seed (a
            dataset row that could not become one) fails that episode as ``prompt_error``.
        env_factory: builds a fresh env; called once per episode.
        processor: chat formatting (see ``trl_env.Processor``).
        tokenizer: the model's tokenizer, used only for env text and decoding sampled ids.
        generator: the sampler (see ``trl_env.backends``).
        budgets: token and turn limits; defaults to ``Budgets()``.
        parse_truncated_turns: give a turn cut by ``max_new_tokens`` to the env as an action (its
            end-of-turn marker is then appended as env text) instead of ending the episode.
        strict: raise the first env or processor error instead of recording it on its episode.
        env_workers: threads running user code (``env_factory``, ``reset``, ``step``, ``close`` and the
            processor) and the tokenisation of each turn.
        env_timeout: seconds one of those calls may run before it is abandoned: a hung ``reset`` or
            ``step`` ends its episode as an error (``env_timeout``), a hung ``close`` is recorded in
            ``info["close_error"]``; ``None`` waits forever.
        coalesce_s: with a continuous generator, most seconds a ready turn waits for turns still being
            prepared (env steps in flight) so that they reach the generator in one ``submit`` call, which
            ``VLLMServerGenerator`` sends as one batched request; the turns go at once when no env call is
            under way. ``"auto"`` (the default): a third of a typical env step, from 10 to 50 ms (slow envs'
            turns arrive spread out, fast envs' in bursts). 0 hands over every turn as soon as it is ready.
        on_episode_end: called with an episode's index as it ends (on the scheduler thread), e.g. for a
            progress bar.
        history: ``"sampled"`` (default): each turn is sampled from every token so far, as sampled; one row per
            episode. ``"deployed"``: each turn is sampled from the chat template's rendering of the conversation so
            far (``tokenizer.apply_chat_template``: earlier reasoning dropped or rewritten as the template does, env
            text kept plain); ``Rollout.rows`` holds one row per turn, consecutive turns merged where a context
            extends the previous row verbatim. Token budgets then bound each row (``max_completion_tokens``) and each
            turn's context (``max_context``). See docs/history.md.
        template_kwargs: with ``history="deployed"``, extra chat-template variables (``{"enable_thinking": False}``).

    Returns:
        One ``Rollout`` per seed, in the order of ``seeds``.

    Raises:
        ConfigError: for a non-callable ``env_factory``, a negative ``coalesce_s``, or bad budgets or stop strings;
            with ``history="deployed"``, a template trl-env cannot render exactly (the message says why).
        ProcessorError: for a processor missing a method.
        EnvError: only with ``strict=True``.
    """
    if not callable(env_factory):
        raise ConfigError(
            f"env_factory={env_factory!r} is not callable; pass the env class or a function that returns a "
            "fresh env, e.g. `env_factory=MyEnv`, not `MyEnv()`."
        )
    check_processor(processor)
    check_env_timeout(env_timeout)
    check_coalesce(coalesce_s)
    if isinstance(env_factory, SamplingEnvFactory):  # per-request sampling, refused before any episode if unfit
        check_request_sampling(generator, env_factory.request_sampling, why=repr(env_factory))
    budgets = budgets or Budgets()
    stops = stop_token_ids(processor, tokenizer)
    closer = str(tokenizer.decode([stops[0]], skip_special_tokens=False))
    text = EnvText(tokenizer)
    deployed = None
    if as_history(history) is History.DEPLOYED:
        deployed = DeployedHistory.check(processor, tokenizer, text, template_kwargs)
    calls = Calls(env_factory, processor, text, budgets.max_turns, closer, deployed)
    engine = _Engine(
        calls, generator, budgets, stops, parse_truncated_turns, strict, env_timeout, coalesce_s, on_episode_end
    )
    episodes = [Episode(i, "" if isinstance(s, BaseException) else str(s)) for i, s in enumerate(seeds)]
    return engine.run(episodes, list(seeds), env_workers)


@dataclass
class _Engine:
    """The scheduling loop: hands env work to worker threads and model turns to the generator as episodes get ready."""

    calls: Calls
    generator: Generator
    budgets: Budgets
    stops: tuple[int, ...]
    parse_truncated_turns: bool
    strict: bool
    env_timeout: float | None
    coalesce_s: float | Literal["auto"]
    on_episode_end: Callable[[int], None] | None
    _step_s: float = 0.0  # a running average of env step times (for coalesce_s="auto")

    def run(self, episodes: list[Episode], seeds: list[Seed | BaseException], env_workers: int) -> list[Rollout]:
        self.done: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()  # every future lands here once, when done
        self.workers = Workers(env_workers, on_wait=lambda: self.done.put(_WAKE))  # a call waits: re-plan the wave
        self.env_calls: dict[Future[Any], tuple[Episode, Call]] = {}
        self.closing = 0  # close (and kill) calls among env_calls
        self.built = {ep.index: Built() for ep in episodes}  # each env as built, before its reset: closed however
        self.closed: dict[int, Env] = {}  # the env each close call under way closes
        generations: dict[Future[Generation], Episode] = {}
        for ep, seed in zip(episodes, seeds, strict=True):
            self._submit(ep, "open", self.calls.open, ep.index, seed, self.built[ep.index])
        ready: list[Episode] = []
        ready_since = 0.0  # when the oldest of ``ready`` got ready
        try:
            while self.env_calls or generations or ready:
                hold = self._hold(ready_since, bool(generations)) if ready else float("inf")
                if ready and hold <= 0.0:
                    generations.update(self._generate(ready))
                    ready = []
                    continue
                for future in drain(self.done, timeout=self._poll(hold)):
                    if future in generations:
                        ep = generations.pop(future)
                        if self._on_generation(ep, future):
                            turn = len(ep.turns) + 1
                            self._submit(ep, "step", self.calls.step, ep.index, ep.env, ep.sampled, turn, ep.messages)
                    elif future in self.env_calls:  # else: an abandoned call that returned late
                        ep, kind = self._pop(future)
                        if self._on_env_call(ep, kind, future):
                            ready_since = ready_since if ready else time.monotonic()
                            ready.append(ep)
                for future in self._overdue():
                    self.workers.abandon(future)
                    self._time_out(*self._pop(future))
        finally:
            self.workers.close()
        return [ep.to_rollout(self.stops[0]) for ep in episodes]

    def _submit(self, ep: Episode, kind: Call, fn: Callable[..., Any], *args: Any) -> None:
        future = self.workers.submit(fn, *args)
        self.env_calls[future] = (ep, kind)
        self.closing += kind in ("close", "kill")
        future.add_done_callback(self.done.put)

    def _pop(self, future: Future[Any]) -> tuple[Episode, Call]:
        ep, kind = self.env_calls.pop(future)
        self.closing -= kind in ("close", "kill")
        return ep, kind

    def _episode_calls(self) -> bool:
        """Whether an open or a step is under way; O(1) per scheduler wake.

        Closes do not hold a wave back, nor do calls waiting on another episode (a seat waiting for its turn waits
        for this very wave).
        """
        return len(self.env_calls) > self.closing + self.workers.waiting_calls()

    def _hold(self, ready_since: float, generating: bool) -> float:
        """How much longer the ready turns wait for others (<= 0: send them now).

        A wave backend batches every running episode, so it waits for all of them (``inf``). A continuous one
        waits only while envs are still stepping, and at most ``coalesce_s`` after the first turn got ready.
        """
        if not self.generator.continuous:
            return float("inf") if self._episode_calls() or generating else 0.0
        if not self._episode_calls():
            return 0.0
        return ready_since + coalesce_window(self.coalesce_s, self._step_s) - time.monotonic()

    def _generate(self, ready: list[Episode]) -> dict[Future[Generation], Episode]:
        now = time.perf_counter()
        for ep in ready:
            ep.submitted_at = now
        requests = [turn_request(ep, self.budgets, self.stops, self.generator) for ep in ready]
        try:
            futures = self.generator.submit(requests)
            if len(futures) != len(ready):
                raise ServerError(f"the generator returned {len(futures)} futures for {len(ready)} requests")
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001  # a failed submit ends the episodes it carried, not the rollout
            for ep in ready:
                self._fail(ep, EpisodeFailure("server_error", e))
            return {}
        for future in futures:
            future.add_done_callback(self.done.put)
        return dict(zip(futures, ready, strict=True))

    def _poll(self, hold: float) -> float | None:
        """How long the scheduler may sleep: until held turns are due (``hold`` s) or an env call can be overdue."""
        due = None if hold == float("inf") else max(0.0, hold)
        if self.env_timeout is None:
            return due
        started = self.workers.running().values()
        overdue = (
            min(0.1, self.env_timeout)
            if not started
            else max(0.0, min(started) + self.env_timeout - time.monotonic()) + 0.001
        )
        return overdue if due is None else min(due, overdue)

    def _overdue(self) -> list[Future[Any]]:
        """Env calls running past ``env_timeout`` (only running calls are timed, at most ``env_workers``)."""
        if self.env_timeout is None:
            return []
        limit = time.monotonic() - self.env_timeout
        return [f for f, t in self.workers.running().items() if t < limit and f in self.env_calls and not f.done()]

    def _time_out(self, ep: Episode, kind: Call) -> None:
        if kind == "kill":
            return
        method = {"open": "reset", "step": "step", "close": "close"}[kind]
        owner = type(ep.env).__name__ if ep.env is not None else _name(self.calls.env_factory)
        message = (
            f"{owner}.{method} did not return within env_timeout={self.env_timeout} s; it was abandoned "
            "(its thread is left behind; an env in a worker process has its worker killed). Raise env_timeout if the "
            "env is just slow."
        )
        if kind == "close":
            ep.info["close_error"] = message
            self._submit(ep, "kill", kill, self.closed.pop(ep.index))  # a worker process is killed, off this thread
            return
        error = EnvTimeoutError(message, env_index=ep.index, turn=len(ep.turns) + (kind == "step"), method=method)
        self._fail(ep, EpisodeFailure("env_timeout", error))

    # -- results, on the scheduler thread: token bookkeeping only -----------------------------------

    def _on_env_call(self, ep: Episode, kind: Call, future: Future[Any]) -> bool:
        """Record an open, a step or a close; return True if the episode needs another model turn."""
        try:
            result = future.result()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001  # user code: recorded on its episode, or raised in strict mode
            if kind == "kill":
                return False
            if kind == "close":
                self.closed.pop(ep.index, None)
                ep.info["close_error"] = f"{type(e).__name__}: {e}"
                return False
            self._fail(ep, e if isinstance(e, EpisodeFailure) else EpisodeFailure("env_exception", e))
            return False
        if kind == "open":
            return self._on_open(ep, result)
        if kind == "step":
            return self._on_step(ep, result)
        if kind == "kill":
            return False
        self.closed.pop(ep.index, None)
        if result is not None:  # a Truncatable env settled its reward after trl-env ended the episode
            ep.reward = result.reward
            if result.info is not None:
                ep.info["env"] = result.info
            if result.close_error:
                ep.info["close_error"] = result.close_error
        return False

    def _on_open(self, ep: Episode, opened: Opened) -> bool:
        self.built.pop(ep.index).take()  # from here the episode's env is ep.env (what reset returned)
        ep.env, ep.prompt_ids, ep.reward, ep.messages = opened.env, opened.prompt_ids, opened.reward, opened.messages
        ep.anchor = anchor_of(opened.env_info)
        if opened.env_info is not None:
            ep.info["env"] = opened.env_info
        if not opened.alive:
            ep.info["dead_at_reset"] = True
            self._end(ep, Ending.ENV_DONE)
        elif ep.room(self.budgets) < 1:
            ep.info["prompt_too_long"] = len(ep.prompt_ids)
            self._end(ep, Ending.LENGTH)
        return ep.ending is None

    def _on_step(self, ep: Episode, stepped: Stepped) -> bool:
        self._step_s += (stepped.env_s - self._step_s) / (8 if self._step_s else 1)  # an average of recent steps
        ep.env, ep.reward = stepped.env, stepped.reward
        if stepped.env_info is not None:
            ep.info["env"] = stepped.env_info
        env_ids = stepped.env_ids
        if stepped.messages is not None:  # history="deployed": the next prompt extends the row, or starts one
            ep.messages, prompt = stepped.messages, stepped.prompt_ids
            if prompt is not None:
                if not stepped.messages.extends(ep.prompt_ids, ep.completion_ids):
                    return self._new_row(ep, stepped, prompt)  # the template rewrote the history: a new row
                env_ids = prompt[len(ep.prompt_ids) + len(ep.completion_ids) :]
        if env_ids is not None and ep.room(self.budgets, extra=len(env_ids)) < 1:
            ep.info["delta_too_long"] = len(env_ids)  # appending it would overshoot: stop before it
            ep.append_env(stepped, [])
            self._end(ep, Ending.LENGTH)
            return False
        ep.append_env(stepped, env_ids or [])
        if env_ids is None:
            self._end(ep, Ending.ENV_DONE if not stepped.alive else Ending.MAX_TURNS)
        return ep.ending is None

    def _new_row(self, ep: Episode, stepped: Stepped, prompt_ids: list[int]) -> bool:
        """``history="deployed"``: the next turn's prompt does not extend the current row, so it starts a row."""
        room = min(self.budgets.max_new_tokens, self.budgets.max_completion_tokens)
        if self.budgets.max_context is not None:
            room = min(room, self.budgets.max_context - len(prompt_ids))
        ep.append_env(stepped, [])
        if room < 1:
            ep.info["prompt_too_long"] = len(prompt_ids)
            self._end(ep, Ending.LENGTH)
            return False
        ep.start_row(prompt_ids)
        return True

    def _on_generation(self, ep: Episode, future: Future[Generation]) -> bool:
        """Append a sampled turn; return True if the env should step on it."""
        try:
            generation = future.result()
            max_tokens = ep.room(self.budgets)
            if not (0 < len(generation.token_ids) == len(generation.logprobs) <= max_tokens):
                raise ServerError(
                    f"the generator returned {len(generation.token_ids)} ids and {len(generation.logprobs)} "
                    f"logprobs for a turn of at most {max_tokens} tokens; expected 1 to {max_tokens} of each."
                )
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001  # a failed request ends only its episode
            self._fail(ep, EpisodeFailure("server_error", e))
            return False
        ep.append_model(generation)
        own = cut_at_own_cap(ep, generation, max_tokens)  # cut at its chat request's own cap: the env answers it
        if own:
            ep.info["max_tokens_cut"] = ep.info.get("max_tokens_cut", 0) + 1
        if generation.finish_reason is FinishReason.LENGTH and not (self.parse_truncated_turns or own):
            ep.append_env(None, [])
            self._end(ep, Ending.LENGTH)
            return False
        return True

    def _fail(self, ep: Episode, failure: EpisodeFailure) -> None:
        error = failure.cause
        if self.strict:
            if isinstance(error, TrlEnvError):
                raise error
            raise EnvError(
                f"episode {ep.index} (seed {ep.seed!r:.60}) failed at turn {len(ep.turns)}: "
                f"{type(error).__name__}: {error}",
                env_index=ep.index,
                turn=len(ep.turns),
            ) from error
        ep.info["error_kind"] = failure.kind
        tail = "".join(traceback.format_exception(type(error), error, error.__traceback__)[-3:])
        error.__traceback__ = failure.__traceback__ = None  # frames hold the batch (and every env) in a cycle
        if ep.sampled is not None:  # keep the sampled turn that was being processed
            ep.append_env(None, [])
        self._end(ep, Ending.ERROR, f"{type(error).__name__}: {error}\n{tail}")

    def _end(self, ep: Episode, ending: Ending, error: str = "") -> None:
        ep.finish(ending, error)
        built = self.built.pop(ep.index, None)
        env = built.take() if built is not None else ep.env  # the env a failed or abandoned reset left, or the last
        cut = ending in (Ending.MAX_TURNS, Ending.LENGTH) and bool(ep.turns)
        told = ending.value if cut and isinstance(env, Truncatable) else None
        if told is not None:
            ep.info["truncated"] = told
        if env is not None and (told is not None or isinstance(env, Closable)):
            self.closed[ep.index] = env
            self._submit(ep, "close", self.calls.close, env, ep.index, told)  # off this thread, bounded by env_timeout
        if self.on_episode_end is not None:
            self.on_episode_end(ep.index)
