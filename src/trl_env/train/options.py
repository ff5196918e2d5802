"""``make_rollout_func``'s options in typed groups: limits, the engine's failure policy, the backend, logging.

Each group can be passed whole (``limits=Limits(max_turns=4)``) or through today's flat keywords
(``max_turns=4``); ``RolloutOptions.build`` merges them and refuses a keyword given both ways.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from trl_env.backends.base import Generator
from trl_env.errors import ConfigError
from trl_env.render.history import History, as_history
from trl_env.rollout.calls import check_env_timeout
from trl_env.rollout.engine import check_coalesce
from trl_env.rollout.records import Budgets


@dataclass(frozen=True)
class Limits:
    """Turn and token limits; ``None`` takes the default from the trainer or the generator."""

    max_turns: int = 8
    """Most model turns per episode."""
    max_new_tokens: int | None = None
    """Most tokens per turn; default: ``max_completion_tokens``."""
    max_completion_tokens: int | None = None
    """Most completion tokens (model + env) per episode; default: ``GRPOConfig.max_completion_length``."""
    max_context: int | None = None
    """Most prompt + completion tokens; default: the generator's ``context_limit``."""

    def __post_init__(self) -> None:
        Budgets(max_turns=self.max_turns)  # validate early; token budgets are checked once the trainer is known

    def budgets(self, max_completion_length: int, context_limit: int | None) -> Budgets:
        """The budgets for one rollout, with the trainer's and the generator's defaults filled in."""
        completion = self.max_completion_tokens or max_completion_length
        return Budgets(
            max_turns=self.max_turns,
            max_new_tokens=self.max_new_tokens or completion,
            max_completion_tokens=completion,
            max_context=self.max_context or context_limit,
        )


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs env code and treats failures (see ``batch_rollout``)."""

    parse_truncated_turns: bool = False
    """Give a turn cut by ``max_new_tokens`` to the env as an action instead of ending the episode."""
    strict: bool = False
    """Raise the first env or processor error instead of recording it on its episode (for debugging)."""
    stop_on_config_failure: bool = True
    """Stop training (``ConfigFailureError``) at a step in which every episode failed for one configuration reason:
    a processor or chat template that cannot render the request, or budgets that leave the opening prompt no room
    (``trl_env.rollout.failures``). ``False`` trains on, saying so in the log."""
    env_workers: int = 16
    """Threads running user code and tokenisation."""
    env_timeout: float | None = 300.0
    """Seconds one call into env code may run before it is abandoned; ``None`` waits forever."""
    env_executor: str = "thread"
    """``"thread"``: env code on the worker threads, in this process; ``"process"``: each env in a worker
    process of its own (``trl_env.rollout.isolation.isolated``: a segfault, exit or hang ends only its episode)."""
    env_memory_mb: int | None = None
    """With ``env_executor="process"``: each worker's address-space limit in MiB."""
    coalesce_s: float | Literal["auto"] = "auto"
    """Most seconds a ready turn waits for the turns being prepared beside it, so that they go to a server as
    one batched request (``batch_rollout``); ``"auto"``: a third of a typical env step, 10 to 50 ms; 0 sends
    each turn as soon as it is ready."""
    history: History | str = History.SAMPLED
    """``"sampled"``: every turn sampled from every token so far, one row per episode. ``"deployed"``: each turn
    sampled from the chat template's rendering of the conversation so far, one row per turn (merged where a context
    extends the previous row); train with ``trl_env.train.episode_trainer.EpisodeGRPOTrainer``. See
    docs/history.md."""
    template_kwargs: Mapping[str, Any] | None = None
    """With ``history="deployed"``: extra chat-template variables, e.g. ``{"enable_thinking": False}``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", as_history(self.history))
        check_env_timeout(self.env_timeout)
        check_coalesce(self.coalesce_s)
        if self.env_executor not in ("thread", "process"):
            raise ConfigError(f"env_executor={self.env_executor!r}: use 'thread' (default) or 'process'.")
        if not isinstance(self.env_workers, int) or self.env_workers < 1:
            raise ConfigError(f"env_workers={self.env_workers!r}: it must be a positive int.")


@dataclass(frozen=True)
class BackendOptions:
    """Which generator samples the turns."""

    generator: Generator | Callable[[Any], Generator] | None = None
    """A ``Generator``, or a function ``trainer -> Generator``; default: from the trainer's ``GRPOConfig``."""
    base_url: str | Sequence[str] | None = None
    """vLLM server URL(s), overriding ``trainer.args`` (several = data-parallel servers)."""
    lora_sync: str | os.PathLike[str] | None = None
    """A directory: serve the trainer's PEFT adapter from the vLLM server(s) when the step changes."""


@dataclass(frozen=True)
class LoggingOptions:
    """What is written besides the trainer's metrics."""

    transcripts: str | os.PathLike[str] | None = None
    """A JSONL file to append every episode to (see ``write_transcripts``)."""
    transcripts_every: int = 1
    """Write transcripts at every N-th trainer step only."""
    check_template_every: int = 0
    """Compare every N-th rollout's ids with the chat template's rendering and warn once at the first
    difference (``trl_env.tools.additivity.RolloutCheck``); 0 turns the check off."""


class LimitKeywords(TypedDict, total=False):
    """``Limits`` as flat keywords."""

    max_turns: int
    max_new_tokens: int | None
    max_completion_tokens: int | None
    max_context: int | None


class EngineKeywords(TypedDict, total=False):
    """``EngineOptions`` as flat keywords."""

    parse_truncated_turns: bool
    strict: bool
    stop_on_config_failure: bool
    env_workers: int
    env_timeout: float | None
    env_executor: str
    env_memory_mb: int | None
    coalesce_s: float | Literal["auto"]
    history: History | str
    template_kwargs: Mapping[str, Any] | None


class TranscriptKeywords(TypedDict, total=False):
    """The transcript part of ``LoggingOptions`` as flat keywords."""

    transcripts: str | os.PathLike[str] | None
    transcripts_every: int


class FlatOptions(LimitKeywords, EngineKeywords, TranscriptKeywords, total=False):
    """Today's keywords of ``make_rollout_func``, each belonging to one group."""

    generator: Generator | Callable[[Any], Generator] | None
    base_url: str | Sequence[str] | None
    lora_sync: str | os.PathLike[str] | None
    check_template_every: int


@dataclass(frozen=True)
class RolloutOptions:
    """Every option of ``make_rollout_func``, grouped."""

    limits: Limits = field(default_factory=Limits)
    engine: EngineOptions = field(default_factory=EngineOptions)
    backend: BackendOptions = field(default_factory=BackendOptions)
    logging: LoggingOptions = field(default_factory=LoggingOptions)

    @classmethod
    def build(cls, groups: dict[str, Any], flat: FlatOptions) -> RolloutOptions:
        """Merge the groups given whole (``None`` for absent) with the flat keywords.

        Raises:
            ConfigError: for an unknown keyword, or one given both flat and inside its group.
        """
        merged: dict[str, Any] = {}
        for name, group_type in (
            ("limits", Limits),
            ("engine", EngineOptions),
            ("backend", BackendOptions),
            ("logging", LoggingOptions),
        ):
            names = {f.name for f in dataclasses.fields(group_type)}
            mine: dict[str, Any] = {k: v for k, v in flat.items() if k in names}
            given = groups.get(name)
            if given is not None and mine:
                raise ConfigError(
                    f"{', '.join(mine)} given both as keyword(s) and in {name}={given!r:.80}; give each option once."
                )
            merged[name] = given if given is not None else group_type(**mine)
        unknown = set(flat) - {f.name for g in merged.values() for f in dataclasses.fields(g)}
        if unknown:
            raise ConfigError(f"make_rollout_func got unknown option(s) {sorted(unknown)}; see its docstring.")
        return cls(**merged)
