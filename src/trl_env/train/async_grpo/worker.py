"""``TrlEnvRolloutWorker``: trl-env episodes, continuously, as ``AsyncGRPOTrainer``'s rows (see the package docs)."""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import re
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from typing_extensions import Unpack

from trl_env.backends.base import Generation, Generator, Sampling, as_generator, check_request_sampling
from trl_env.backends.vllm_server import VLLMServerGenerator
from trl_env.env import Env
from trl_env.errors import ServerError
from trl_env.render.chat import SamplingEnvFactory
from trl_env.render.history import DeployedHistory
from trl_env.render.processors.base import Processor
from trl_env.rollout import History, Rollout
from trl_env.rollout.isolation import isolated
from trl_env.rollout.transcripts import write_transcripts
from trl_env.seats import Seating
from trl_env.train.async_grpo.buffer import RolloutBuffer
from trl_env.train.async_grpo.groups import push_group, run_group, score_group, settle_future
from trl_env.train.async_grpo.samples import GroupRecord, ScaleRewards, Unscored, rollout_sample
from trl_env.train.async_grpo.worker_options import (
    LORA_NAME,
    WorkerOptions,
    check_adapter_served,
    check_worker_args,
)
from trl_env.train.credit import CreditEstimator
from trl_env.train.grpo import seed_or_error, with_system_prompt
from trl_env.train.options import EngineOptions, FlatOptions, Limits, LoggingOptions
from trl_env.train.trl_internals import require_tested_trl

if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MPQueue

    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample


logger = logging.getLogger(__name__)


class TrlEnvRolloutWorker:
    """A ``RolloutWorkerProtocol`` for ``AsyncGRPOTrainer``: trl-env episodes, continuously, as ``RolloutSample``s.

    ``max_inflight_groups`` threads each loop: wait until the admission rule lets a group start, take the
    next seed, run ``batch_rollout`` on ``num_generations`` fresh envs with that seed (one GRPO group) through
    the one shared generator, score the group and push its rows. So up to ``max_inflight_groups ×
    num_generations`` episodes are in flight at once, and a group is pushed as soon as its own episodes end.

    The admission rule: a group starts only if the trainer will read its rows before they go stale. They are
    read after the rows of earlier groups not yet read (``unread``), and the trainer reads ``rows_per_version``
    rows per policy version, so: ``unread + num_generations <= max(rows_per_version - read_this_version, 0) +
    max_staleness × rows_per_version``. ``rows_per_version`` is what the trainer read between its last two syncs
    (``buffer_size`` until it is known); a group always starts when no row is unread.

    Args:
        env_factory: builds a fresh env; called once per episode.
        processor: chat formatting for the model family (e.g. ``ChatMLProcessor()``).
        tokenizer: the model's tokenizer.
        generator: a ``VLLMServerGenerator`` (or any trl-env ``Generator``), or the server's URL(s); a URL
            gets a ``VLLMServerGenerator`` with ``sampling`` (match ``AsyncGRPOConfig.temperature``: the
            trainer applies it to its logprobs).
        seeds: the env seeds, cycled in order: the training dataset's prompts (strings, numbers or message
            lists, read as ``make_rollout_func`` reads them); a bad row fails its episodes (``prompt_error``).
        num_generations: episodes per group (all on the same seed).
        max_staleness: ``AsyncGRPOConfig.max_staleness``; older samples are dropped before the trainer sees them.
        max_completion_length: the default of ``Limits.max_completion_tokens`` (``AsyncGRPOConfig``'s field).
        max_inflight_groups: groups generated at once (threads).
        buffer_size: most samples waiting in ``rollout_buffer``; default: ``max_inflight_groups ×
            num_generations``. About one optimizer step of samples keeps the trainer fed with fresh samples. Also the
            admission rule's estimate of the rows the trainer reads per policy version, until it has measured them.
        lora_name: the adapter prefix the trainer publishes (``"trl-policy"``): every new turn names
            ``{lora_name}-v{version}``. ``None`` when the trainer syncs full weights (NCCL or a custom
            ``weight_transfer``): requests then keep the generator's model name.
        scale_rewards: ``"group"`` (divide by the group's std + 1e-4, ``trl_env.train.advantages``) or ``"none"``.
        credit: each turn's advantage (docs/credit.md). ``"episode"`` (default): every token gets its episode's group
            advantage, one sample per row (TRL's rule). A ``train.credit.CREDIT_ESTIMATORS`` name (``"discounted"``,
            ``"gigpo"``, ``"per_turn_index"``, built with ``scale_rewards``) or a ``CreditEstimator``: the episode
            pushes **one sample per model turn** of each row, the row's prefix up to the end of that turn trained on
            that turn only, with that turn's advantage (TRL's ``RolloutSample`` holds one advantage; its trie packing
            forwards the shared prefix once when the samples share a micro-batch). Logs ``credit/*``
            (``trl_env.train.credit.credit_metrics`` per group). ``per_device_train_batch_size`` then counts turns.
        unscored: an episode that did not fail but has no reward: ``"zero"`` (TRL async: advantage 0,
            pushed) or ``"drop"``.
        mask_truncated: like TRL's ``mask_truncated_completions``: an episode trl-env reports as truncated
            (``max_turns``, ``length``) keeps its reward in the group statistics but is not pushed.
        system_prompt: replaces the processor's ``system_prompt`` field.
        limits: ``Limits`` (as ``make_rollout_func``).
        engine: ``EngineOptions`` (as ``make_rollout_func``); ``env_workers`` is per group, capped at
            ``num_generations``. ``history="deployed"`` (with ``template_kwargs``): each turn sampled from the chat
            template's rendering; an episode pushes one sample per ``Rollout.rows`` row, each with the episode's
            advantage (docs/history.md).
        logging: ``LoggingOptions``: ``transcripts`` (JSONL, ``step`` = the version at dispatch),
            ``transcripts_every`` (every N-th group). ``check_template_every`` is not supported here.
        sampling: the sampling settings of a generator built from a URL (default: temperature 1).
        stop_timeout: seconds ``stop()`` waits for the group threads.
        on_group: called on the group's thread with its ``GroupRecord`` and ``Rollout``s after its rows were
            pushed (and for a group cut short by ``stop()``), e.g. for custom logging; an exception in it stops
            the worker like any other.
        **options: the ``limits``, ``engine`` and ``logging`` options by their flat names.

    Raises:
        ConfigError: for bad arguments, at once.
    """

    def __init__(
        self,
        env_factory: Callable[[], Env] | Seating,
        processor: Processor,
        tokenizer: Any,
        generator: Generator | str | Sequence[str],
        seeds: Sequence[Any],
        *,
        num_generations: int = 8,
        max_staleness: int = 4,
        max_completion_length: int = 256,
        max_inflight_groups: int = 4,
        buffer_size: int | None = None,
        lora_name: str | None = LORA_NAME,
        scale_rewards: ScaleRewards = "group",
        credit: str | CreditEstimator = "episode",
        unscored: Unscored = "zero",
        mask_truncated: bool = False,
        system_prompt: str | None = None,
        limits: Limits | None = None,
        engine: EngineOptions | None = None,
        logging: LoggingOptions | None = None,
        sampling: Sampling | None = None,
        stop_timeout: float = 30.0,
        on_group: Callable[[GroupRecord, list[Rollout]], None] | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        require_tested_trl("TrlEnvRolloutWorker")  # it builds TRL's experimental RolloutSample
        built, estimator = check_worker_args(
            env_factory,
            processor,
            seeds,
            num_generations=num_generations,
            max_staleness=max_staleness,
            max_completion_length=max_completion_length,
            max_inflight_groups=max_inflight_groups,
            buffer_size=buffer_size,
            scale_rewards=scale_rewards,
            unscored=unscored,
            credit=credit,
            groups={"limits": limits, "engine": engine, "logging": logging},
            options=cast(FlatOptions, options),
        )
        if system_prompt is not None:
            processor = with_system_prompt(processor, system_prompt)
        if built.engine.history is History.DEPLOYED:  # refused at once, not on the first group's thread
            DeployedHistory.check(processor, tokenizer, None, built.engine.template_kwargs)
        if built.engine.env_executor == "process" and not isinstance(env_factory, Seating):  # Seating: refused
            engine_options = built.engine
            env_factory = isolated(
                env_factory, pool_size=engine_options.env_workers, memory_mb=engine_options.env_memory_mb
            )
        self._owns_generator = isinstance(generator, str) or (
            isinstance(generator, Sequence) and all(isinstance(u, str) for u in generator)
        )
        if self._owns_generator:
            kwargs = (sampling or Sampling()).as_kwargs()
            self.generator: Generator = VLLMServerGenerator(generator, **kwargs)  # type: ignore[arg-type]
        else:
            self.generator = as_generator(generator)
        if isinstance(env_factory, SamplingEnvFactory):  # refused here, not on the first group's thread
            check_request_sampling(self.generator, env_factory.request_sampling, why=repr(env_factory))
        self._named: Any = self.generator if self._owns_generator else generator
        """The object whose ``model`` field names the policy of each request (not a minimal generator's wrapper)."""
        self.env_factory, self.processor, self.tokenizer = env_factory, processor, tokenizer
        rollout_sample()  # import TRL's async module now, not on the first group's thread
        self.seeds = [seed_or_error(p) for p in seeds]
        self.num_generations, self.max_staleness = num_generations, max_staleness
        self.max_inflight_groups, self.lora_name = max_inflight_groups, lora_name
        self.scale_rewards, self.unscored, self.mask_truncated = scale_rewards, unscored, mask_truncated
        self.credit, self.estimator = credit, estimator
        """``credit=`` and its estimator (``None`` for ``"episode"``: one sample per row, the episode's advantage)."""
        self.options, self.stop_timeout, self.on_group = built, stop_timeout, on_group
        self.budgets = built.limits.budgets(max_completion_length, self.generator.context_limit)
        self._policy_re = re.compile(rf"^{re.escape(lora_name)}-v(\d+)$") if lora_name else None

        self.buffer_size = buffer_size or max_inflight_groups * num_generations
        self._buffer = RolloutBuffer(maxsize=self.buffer_size, rows_per_version=self.buffer_size)
        self.rollout_buffer: queue.Queue[Any] | MPQueue[Any] = self._buffer
        """What the trainer reads: ``RolloutSample``s, a group's rows one after the other."""
        self.metrics_queue: queue.Queue[Any] | MPQueue[Any] = queue.Queue(maxsize=4096)
        """Metric dicts for the trainer's ``log()``: ``{key: float}`` or ``{key: (num, den)}`` (a rate)."""
        self.groups: collections.deque[GroupRecord] = collections.deque(maxlen=10_000)
        """The most recent groups, oldest first (for tests, benchmarks and debugging)."""
        self.counts: dict[str, int] = defaultdict(int)
        """Running totals. ``groups`` and ``episodes`` run (stopped ones too); each episode has one fate: ``pushed``
        (its rows put on ``rollout_buffer``, all at once), ``failed``, ``untrainable``, ``truncated_masked``,
        ``dropped_unscored``, ``dropped_stale`` (stale when its group ended) or ``stopped`` (its group was cut short
        by ``stop()``), so ``episodes`` is their sum. ``rows``: the samples pushed (``pushed`` with
        ``history="sampled"``; with ``"deployed"`` one per ``Rollout.rows`` row; with a ``credit=`` other than
        ``"episode"`` one per model turn). ``evicted``: pushed rows removed
        from the buffer as stale at a version sync (``rollout/dropped_stale_total`` is ``dropped_stale + evicted``).
        ``unscored``: episodes without a reward, pushed with advantage 0 or dropped."""

        self.model_version = 0
        """The policy version now live (``update_model_version``); the trainer's first sync makes it 1."""
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()
        self._stopping = threading.Event()
        self._failed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None
        self._error_tb = ""
        self._heartbeat = time.monotonic()
        self._pending: set[Future[Generation]] = set()
        self._seed_index = itertools.count()
        self._transcripts_lock = threading.Lock()
        self._started = False

    @classmethod
    def from_args(
        cls,
        args: Any,
        env_factory: Callable[[], Env] | Seating,
        processor: Processor,
        tokenizer: Any,
        seeds: Sequence[Any],
        **kwargs: Any,
    ) -> TrlEnvRolloutWorker:
        """A worker configured from an ``AsyncGRPOConfig`` (``kwargs`` override any of these).

        Read from ``args``: the server URL and sampling settings, ``num_generations``, ``max_staleness``,
        ``max_completion_length``, and one optimizer step of samples as ``buffer_size``
        (``per_device_train_batch_size × gradient_accumulation_steps``).
        """
        defaults: dict[str, Any] = dict(
            generator=args.vllm_server_base_url,
            sampling=Sampling.from_args(args),
            num_generations=args.num_generations,
            max_staleness=args.max_staleness,
            max_completion_length=args.max_completion_length,
            buffer_size=args.per_device_train_batch_size * args.gradient_accumulation_steps,
        )
        defaults.update(kwargs)
        return cls(env_factory, processor, tokenizer, seeds=seeds, **defaults)

    # -- RolloutWorkerProtocol ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the group threads (the trainer calls this once, after its first weight sync).

        Raises:
            ConfigError: in LoRA mode, when the server does not serve ``{lora_name}-v{model_version}`` (the
                trainer did not sync an adapter: no ``peft_config``, or a server without ``--enable-lora``).
            RuntimeError: when called twice.
        """
        if self._started:
            raise RuntimeError("TrlEnvRolloutWorker.start() was called twice; build a new worker per training run.")
        check_adapter_served(self.generator, self.lora_name, self.model_version)
        self._started = True
        self._heartbeat = time.monotonic()
        for i in range(self.max_inflight_groups):
            thread = threading.Thread(target=self._run, name=f"trl-env-async-group-{i}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Stop: fail the generations in flight, join the threads (``stop_timeout``), close an owned generator.

        Groups still running end at once (their generations fail as ``server_error``) and are not pushed; a
        finished group waiting for room in the buffer pushes no more rows. Either way its ``GroupRecord`` says
        ``complete=False`` and the episodes not pushed count as ``stopped``. An env call under way is waited for
        only up to ``stop_timeout`` (the threads are daemons).
        """
        self._stopping.set()
        with self._buffer.not_full:  # wake the threads waiting for room
            self._buffer.not_full.notify_all()
        with self._lock:
            pending, self._pending = list(self._pending), set()
        for future in pending:
            settle_future(future, error=ServerError("the rollout worker stopped"))
        deadline = time.monotonic() + self.stop_timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning(
                "TrlEnvRolloutWorker.stop: %s still running after %.0f s (left as daemons, e.g. a hung env call)",
                ", ".join(alive),
                self.stop_timeout,
            )
        if self._owns_generator and isinstance(self.generator, VLLMServerGenerator):
            self.generator.close()

    def update_model_version(self, model_version: int) -> None:
        """The trainer synced version ``model_version``: new turns name ``{lora_name}-v{model_version}``."""
        if self.lora_name is not None and hasattr(self._named, "model"):
            # The name before the version: a reader that sees the new name with the old version errs older.
            self._named.model = f"{self.lora_name}-v{model_version}"
        self.model_version = model_version
        self._evict_stale()
        self._buffer.next_version()

    def check_health(self, stale_after_s: float) -> None:
        """Raise if a group thread failed or died, or nothing happened for ``stale_after_s`` seconds.

        "Something happened" is any generation or episode ending, a group ending, or a wait for the trainer
        (for room in the full buffer, or for its reads before a group may start). The trainer calls this whenever
        its read of ``rollout_buffer`` times out.

        Raises:
            RuntimeError: chained to the thread's exception when one failed.
        """
        if self._error is not None:
            raise RuntimeError(f"trl-env rollout worker failed:\n{self._error_tb}") from self._error
        if self._started and not self._stopping.is_set():
            dead = [t.name for t in self._threads if not t.is_alive()]
            if dead:
                raise RuntimeError(f"trl-env rollout worker thread(s) {', '.join(dead)} died without an error.")
        age = time.monotonic() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(
                f"trl-env rollout worker heartbeat stale: nothing generated, finished or pushed for {age:.0f} s > "
                f"{stale_after_s:.0f} s (a hung env call or server?)."
            )

    # -- the group threads ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._halted():
                claim = self._rows_to_claim()
                if not self._buffer.claim(claim, self.max_staleness, timeout=0.2):
                    self._tick()  # waiting for the trainer is not a hang
                    continue
                if self._halted():  # stop() came while it waited
                    self._buffer.release(claim)
                    break
                index = next(self._seed_index)
                run_group(self, index, self.seeds[index % len(self.seeds)], claim)
        except BaseException as e:  # noqa: BLE001  # reported by check_health, which the trainer calls
            with self._lock:
                if self._error is None:
                    self._error, self._error_tb = e, traceback.format_exc()
            self._failed.set()  # every thread stops: the trainer's queue empties and check_health raises
            logger.error("trl-env rollout worker thread %s failed: %r", threading.current_thread().name, e)

    def _rows_to_claim(self) -> int:
        """The rows a group is expected to push: ``num_generations`` times the rows per pushed episode so far.

        Exactly ``num_generations`` with ``history="sampled"`` and ``credit="episode"`` (one row per episode); the
        claim is settled to the rows (samples) the group really made once it is scored.
        """
        with self._lock:
            rows, episodes = self.counts.get("rows", 0), self.counts.get("pushed", 0)
        per_episode = rows / episodes if episodes and rows > episodes else 1.0
        return max(1, round(self.num_generations * per_episode))

    def _score(
        self,
        group_id: int,
        rollouts: list[Rollout],
        versions: list[tuple[int, int] | None],
        fallback: int,
        newest: int | None,
    ) -> tuple[list[list[RolloutSample]], dict[str, Any]]:
        """The group's rows to push, per episode, and its metrics (``groups.score_group``)."""
        return score_group(self, group_id, rollouts, versions, fallback, newest)

    def _push(self, episodes: list[list[RolloutSample]]) -> tuple[int, int, float, int, int]:
        """Put the group's rows on the buffer (``groups.push_group``)."""
        return push_group(self, episodes)

    def _stale(self, sample: RolloutSample) -> bool:
        return self.model_version - sample.model_version > self.max_staleness

    def _evict_stale(self) -> None:
        """Remove the rows the trainer would drop as stale from the buffer, freeing their room."""
        evicted = self._buffer.evict(self._stale)
        if evicted:
            with self._lock:
                self.counts["evicted"] += evicted
            self._put_metrics({"rollout/dropped_stale_total": float(evicted)})

    # -- helpers -------------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._heartbeat = time.monotonic()

    def _halted(self) -> bool:
        return self._stopping.is_set() or self._failed.is_set()

    def _put_metrics(self, metrics: dict[str, Any]) -> None:
        try:
            self.metrics_queue.put_nowait(metrics)
        except queue.Full:  # nobody drains it (no logging): metrics are best effort
            pass

    def _write_transcripts(self, group_id: int, version: int, rollouts: list[Rollout]) -> None:
        logging_options = self.options.logging
        if logging_options.transcripts is None or group_id % max(1, logging_options.transcripts_every):
            return
        with self._transcripts_lock:
            write_transcripts(logging_options.transcripts, rollouts, step=version, tokenizer=self.tokenizer)
