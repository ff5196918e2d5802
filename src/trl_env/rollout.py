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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from trl_env.backends.base import FinishReason, Generation, GenerationRequest, Generator
from trl_env.env import Env, Seed, check_result
from trl_env.errors import (
    ConfigError,
    EnvError,
    EnvTimeoutError,
    ProcessorError,
    ServerError,
    TrlEnvError,
    error_kind,
)
from trl_env.processor import check_processor, stop_token_ids
from trl_env.trajectory import Budgets, Ending, Rollout, Turn
from trl_env.workers import Workers, drain


class _Episode:
    """Mutable state of one running episode; the engine turns it into a ``Rollout`` at the end."""

    def __init__(self, index: int, seed: Seed) -> None:
        self.index, self.seed = index, seed
        self.env: Env | None = None
        self.prompt_ids: list[int] = []
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.env_mask: list[int] = []
        self.turns: list[Turn] = []
        self.ending: Ending | None = None
        self.error = ""
        self.info: dict[str, Any] = {}
        self.pending: dict[str, Any] = {}  # the turn being built, between generation and env step
        self.submitted_at = 0.0

    def finish(self, ending: Ending, error: str = "") -> None:
        assert self.ending is None, "an episode ends once"
        self.ending, self.error = ending, error


def _name(obj: object) -> str:
    return str(getattr(obj, "__qualname__", type(obj).__name__))


def batch_rollout(
    seeds: Sequence[Seed],
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
    on_episode_end: Callable[[int], None] | None = None,
) -> list[Rollout]:
    """Run one episode per seed, each with a fresh env from ``env_factory()``, and return them in order.

    Episodes advance independently: a continuous generator gets each turn as soon as its episode
    is ready, a wave generator gets every waiting episode at once. Env calls run on a pool of
    ``env_workers`` threads, overlapping generation.

    Args:
        seeds: one per episode; each is passed to ``env.reset``.
        env_factory: builds a fresh env; called once per episode.
        processor: chat formatting (see ``trl_env.Processor``).
        tokenizer: the model's tokenizer, used only for env text and decoding sampled ids.
        generator: the sampler (see ``trl_env.backends``).
        budgets: token and turn limits; defaults to ``Budgets()``.
        parse_truncated_turns: give a turn cut by ``max_new_tokens`` to the env as an action (its
            end-of-turn marker is then appended as env text) instead of ending the episode.
        strict: raise the first env or processor error instead of recording it on its episode.
        env_workers: threads running ``env_factory``, ``reset`` and ``step``.
        env_timeout: seconds one env call may run before its episode is abandoned as an error
            (``EnvTimeoutError``); ``None`` waits forever.
        on_episode_end: called with an episode's index as it ends (on the scheduler thread), e.g. for a
            progress bar.

    Returns:
        One ``Rollout`` per seed, in the order of ``seeds``.

    Raises:
        ConfigError: for a non-callable ``env_factory`` or bad budgets or stop strings.
        ProcessorError: for a processor missing a method.
        EnvError: only with ``strict=True``.
    """
    if not callable(env_factory):
        raise ConfigError(
            f"env_factory={env_factory!r} is not callable; pass the env class or a function that returns a "
            "fresh env, e.g. `env_factory=MyEnv`, not `MyEnv()`."
        )
    check_processor(processor)
    budgets = budgets or Budgets()
    stops = stop_token_ids(processor, tokenizer)
    if env_timeout is not None and not env_timeout > 0:
        raise ConfigError(f"env_timeout={env_timeout!r}: it must be > 0 seconds, or None to wait forever.")
    engine = _Engine(
        env_factory,
        processor,
        tokenizer,
        generator,
        budgets,
        stops,
        parse_truncated_turns,
        strict,
        env_timeout,
        on_episode_end,
    )
    return engine.run([_Episode(i, str(seed)) for i, seed in enumerate(seeds)], env_workers)


@dataclass
class _Engine:
    env_factory: Callable[[], Env]
    processor: Any
    tokenizer: Any
    generator: Generator
    budgets: Budgets
    stops: tuple[int, ...]
    parse_truncated_turns: bool
    strict: bool
    env_timeout: float | None
    on_episode_end: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        # Text that closes a turn cut by the length limit: the end-of-turn token (decoded once, here).
        self.closer = str(self.tokenizer.decode([self.stops[0]], skip_special_tokens=False))

    def run(self, episodes: list[_Episode], env_workers: int) -> list[Rollout]:
        workers = self._workers = Workers(env_workers)
        done: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()  # every future lands here once, when done
        env_calls: dict[Future[Any], _Episode] = {}
        generations: dict[Future[Generation], _Episode] = {}

        def track(calls: dict[Any, _Episode], future: Future[Any], ep: _Episode) -> None:
            calls[future] = ep
            future.add_done_callback(done.put)

        for ep in episodes:
            track(env_calls, workers.submit(self._reset, ep.index, ep.seed), ep)
        ready: list[_Episode] = []
        try:
            while env_calls or generations or ready:
                # A wave backend batches every running episode, so it waits for all of them.
                if ready and (self.generator.continuous or not (env_calls or generations)):
                    now = time.perf_counter()
                    for ep in ready:
                        ep.submitted_at = now
                    for ep, future in zip(
                        ready, self.generator.submit([self._request(ep) for ep in ready]), strict=True
                    ):
                        track(generations, future, ep)
                    ready = []
                    continue
                for future in drain(done, timeout=self._poll(workers)):
                    if future in generations:
                        ep = generations.pop(future)
                        if self._on_generation(ep, future):
                            call = workers.submit(self._step, ep.index, ep.env, ep.pending, len(ep.turns) + 1)
                            track(env_calls, call, ep)
                    elif future in env_calls:  # else: an abandoned call that returned late
                        ep = env_calls.pop(future)
                        if self._on_env_result(ep, future):
                            ready.append(ep)
                for future in self._overdue(workers, env_calls):
                    workers.abandon(future)
                    self._time_out(env_calls.pop(future))
        finally:
            workers.close()
        return [self._to_rollout(ep) for ep in episodes]

    def _poll(self, workers: Workers) -> float | None:
        """How long the scheduler may sleep before an env call can be overdue."""
        if self.env_timeout is None:
            return None
        started = list(dict(workers.started_at).values())  # a copy: worker threads update it
        if not started:
            return min(0.1, self.env_timeout)
        return max(0.0, min(started) + self.env_timeout - time.monotonic()) + 0.001

    def _overdue(self, workers: Workers, env_calls: dict[Future[Any], _Episode]) -> list[Future[Any]]:
        """Env calls running past ``env_timeout`` (only running calls are timed, at most ``env_workers``)."""
        if self.env_timeout is None:
            return []
        limit = time.monotonic() - self.env_timeout
        return [f for f, t in dict(workers.started_at).items() if t < limit and f in env_calls and not f.done()]

    def _time_out(self, ep: _Episode) -> None:
        method = "step" if ep.pending else "reset"
        owner = type(ep.env).__name__ if ep.env is not None else _name(self.env_factory)
        error = EnvTimeoutError(
            f"{owner}.{method} did not return within env_timeout={self.env_timeout} s; the episode was abandoned "
            "(its thread is left behind). Raise env_timeout if the env is just slow.",
            env_index=ep.index,
            turn=len(ep.turns) + (1 if ep.pending else 0),
            method=method,
        )
        self._fail(ep, error)

    # -- worker threads: user code only; they return values and never touch an episode ------------

    def _reset(self, index: int, seed: Seed) -> tuple[Env, str]:
        env = self.env_factory()
        result = env.reset(seed)
        env, delta = check_result(result, env, method="reset", env_index=index, turn=0)
        return env, self.processor.init_system_input(delta)

    def _step(self, index: int, env: Env, pending: dict[str, Any], turn: int) -> dict[str, Any]:
        started, text, finish_reason = time.perf_counter(), pending["text"], pending["finish_reason"]
        parsed = self.processor.parse_agent_output(text)
        if not (isinstance(parsed, tuple) and len(parsed) == 2 and all(isinstance(x, str) for x in parsed)):
            raise ProcessorError(
                f"{type(self.processor).__name__}.parse_agent_output returned {parsed!r:.80}; it must return "
                "a tuple (reasoning: str, action: str)."
            )
        env, delta = check_result(env.step(parsed[1]), env, method="step", env_index=index, turn=turn)
        next_text = None
        if env.alive and turn < self.budgets.max_turns:
            closer = "" if finish_reason is FinishReason.STOP else self._closer()
            next_text = closer + self.processor.append_user_input(delta)
        return dict(
            env=env,
            reasoning=parsed[0],
            action=parsed[1],
            delta=delta,
            reward=float(env.reward),
            env_s=time.perf_counter() - started,
            next_text=next_text,
        )

    # -- scheduler thread: token bookkeeping -------------------------------------------------------

    def _on_env_result(self, ep: _Episode, future: Future[Any]) -> bool:
        """Record a reset or step; return True if the episode needs another model turn."""
        try:
            result = future.result()
        except Exception as e:  # noqa: BLE001  # user code: recorded on its episode, or raised in strict mode
            self._fail(ep, e)
            return False
        if not ep.pending:  # the answer to reset (a step always has a pending turn)
            ep.env, text = result
            ep.prompt_ids = self._encode(text)
            if not ep.env.alive:
                ep.info["dead_at_reset"] = True
                self._end(ep, Ending.ENV_DONE)
            elif self._room(ep) < 1:
                ep.info["prompt_too_long"] = len(ep.prompt_ids)
                self._end(ep, Ending.LENGTH)
            return ep.ending is None
        ep.env = result.pop("env")
        text = result.pop("next_text")
        ep.pending.update(result)
        env_ids = self._encode(text) if text is not None else []
        if text is not None and self._room(ep, extra=len(env_ids)) < 1:
            ep.info["delta_too_long"] = len(env_ids)  # appending it would overshoot: stop before it
            env_ids, text = [], None
            self._end(ep, Ending.LENGTH)
        self._close_turn(ep, env_ids)
        if text is None and ep.ending is None:
            self._end(ep, Ending.ENV_DONE if not ep.env.alive else Ending.MAX_TURNS)
        return ep.ending is None

    def _on_generation(self, ep: _Episode, future: Future[Generation]) -> bool:
        """Append a sampled turn; return True if the env should step on it."""
        try:
            generation = future.result()
            max_tokens = self._room(ep)
            if not (0 < len(generation.token_ids) == len(generation.logprobs) <= max_tokens):
                raise ServerError(
                    f"the generator returned {len(generation.token_ids)} ids and {len(generation.logprobs)} "
                    f"logprobs for a turn of at most {max_tokens} tokens; expected 1 to {max_tokens} of each."
                )
        except Exception as e:  # noqa: BLE001  # a failed request ends only its episode
            self._fail(ep, e)
            return False
        ep.completion_ids += generation.token_ids
        ep.logprobs += generation.logprobs
        ep.env_mask += [1] * len(generation.token_ids)
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=False)
        ep.pending = dict(
            text=text,
            finish_reason=generation.finish_reason,
            num_model_tokens=len(generation.token_ids),
            generation_s=time.perf_counter() - ep.submitted_at,
        )
        if generation.finish_reason is FinishReason.LENGTH and not self.parse_truncated_turns:
            self._close_turn(ep, [])
            self._end(ep, Ending.LENGTH)
            return False
        return True

    def _close_turn(self, ep: _Episode, env_ids: list[int]) -> None:
        p = ep.pending
        ep.turns.append(
            Turn(
                text=p["text"],
                reasoning=p.get("reasoning", ""),
                action=p.get("action"),
                delta=p.get("delta"),
                reward=p.get("reward"),
                finish_reason=p["finish_reason"],
                num_model_tokens=p["num_model_tokens"],
                num_env_tokens=len(env_ids),
                generation_s=p["generation_s"],
                env_s=p.get("env_s", 0.0),
            )
        )
        ep.completion_ids += env_ids
        ep.logprobs += [0.0] * len(env_ids)
        ep.env_mask += [0] * len(env_ids)
        ep.pending = {}

    def _request(self, ep: _Episode) -> GenerationRequest:
        return GenerationRequest(ep.prompt_ids + ep.completion_ids, self._room(ep), self.stops)

    def _room(self, ep: _Episode, extra: int = 0) -> int:
        """Tokens the next model turn may sample once ``extra`` more env tokens are appended."""
        b = self.budgets
        used = len(ep.completion_ids) + extra
        room = min(b.max_new_tokens, b.max_completion_tokens - used)
        if b.max_context is not None:
            room = min(room, b.max_context - len(ep.prompt_ids) - used)
        return room

    def _encode(self, text: str) -> list[int]:
        # The processor writes special tokens as text; never let the tokenizer add BOS/EOS again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _closer(self) -> str:
        return self.closer

    def _fail(self, ep: _Episode, error: BaseException) -> None:
        if self.strict:
            if isinstance(error, TrlEnvError):
                raise error
            raise EnvError(
                f"episode {ep.index} (seed {ep.seed!r:.60}) failed at turn {len(ep.turns)}: "
                f"{type(error).__name__}: {error}",
                env_index=ep.index,
                turn=len(ep.turns),
            ) from error
        ep.info["error_kind"] = error_kind(error)
        tail = "".join(traceback.format_exception(type(error), error, error.__traceback__)[-3:])
        error.__traceback__ = None  # its frames hold the whole batch (and every env) in a reference cycle
        if ep.pending:  # keep the sampled turn that was being processed
            self._close_turn(ep, [])
        self._end(ep, Ending.ERROR, f"{type(error).__name__}: {error}\n{tail}")

    def _end(self, ep: _Episode, ending: Ending, error: str = "") -> None:
        ep.finish(ending, error)
        close = getattr(ep.env, "close", None)
        if callable(close):  # an optional hook: give back sessions, files
            self._workers.submit(close)  # on a worker: a slow close must not hold the scheduler
        if self.on_episode_end is not None:
            self.on_episode_end(ep.index)

    def _to_rollout(self, ep: _Episode) -> Rollout:
        assert ep.ending is not None, "every episode ends"
        # No reward without a model turn (it would only shift the group's baseline) or after a failure.
        scored = ep.ending is not Ending.ERROR and bool(ep.turns)
        reward = float(ep.env.reward) if scored and ep.env is not None else None
        prompt_ids, completion_ids, logprobs, env_mask = ep.prompt_ids, ep.completion_ids, ep.logprobs, ep.env_mask
        if not completion_ids:
            # TRL needs a non-empty completion: one masked stand-in token (the end-of-turn id), flagged.
            completion_ids, logprobs, env_mask = [self.stops[0]], [0.0], [0]
            limit = self.budgets.max_context
            if limit is not None and len(prompt_ids) >= limit:
                prompt_ids = prompt_ids[-(limit - 1) :]
            ep.info["placeholder"] = True
        return Rollout(
            seed=ep.seed,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            logprobs=logprobs,
            env_mask=env_mask,
            turns=tuple(ep.turns),
            reward=reward,
            ending=ep.ending,
            error=ep.error,
            info=ep.info,
        )
