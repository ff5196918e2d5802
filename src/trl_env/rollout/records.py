"""What an episode produces: ``Turn`` and ``Rollout`` records, their ``Ending``, and the ``Budgets`` that bound them.

All are frozen dataclasses; the engine builds them and ``trl_env.train.grpo`` converts them to TRL's dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trl_env.backends.base import FinishReason
from trl_env.env import Seed
from trl_env.errors import ConfigError


class Ending(str, Enum):
    """Why an episode ended; every episode has exactly one."""

    ENV_DONE = "env_done"
    """The env set ``alive = False`` (terminated)."""
    MAX_TURNS = "max_turns"
    """The turn budget ran out (truncated)."""
    LENGTH = "length"
    """A token budget or the context limit ran out (truncated)."""
    ERROR = "error"
    """The env, the processor or the generator failed for this episode (see ``Rollout.error``)."""


@dataclass(frozen=True)
class Budgets:
    """Limits no episode ever exceeds; a turn's ``max_tokens`` is capped by what remains of each."""

    max_turns: int = 8
    """Most model turns per episode."""
    max_new_tokens: int = 256
    """Most tokens the model samples in one turn."""
    max_completion_tokens: int = 1024
    """Most completion tokens per episode, model and env tokens together (what the trainer holds)."""
    max_context: int | None = None
    """Most prompt + completion tokens (the model's context length); ``None`` for no limit."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: it must be a positive int.")
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 2):
            raise ConfigError(f"max_context={self.max_context!r}: it must be an int >= 2, or None for no limit.")


@dataclass(frozen=True)
class Turn:
    """One model turn and the env's answer to it."""

    text: str
    """The decoded sampled ids, special tokens included."""
    reasoning: str
    """What the processor parsed as reasoning (a chat env's turn, an agent's call: the reasoning it was answered)."""
    action: str | None
    """The action given to ``env.step`` (a chat env's: the content it was answered, ``Reply``); ``None`` when the
    turn was not parsed (cut by a length limit)."""
    delta: str | None
    """The env's observation after the step; ``None`` without a step."""
    reward: float | None
    """``env.reward`` after the step."""
    finish_reason: FinishReason
    num_model_tokens: int
    num_env_tokens: int
    """Env tokens appended after this turn (0 if the episode ended here)."""
    generation_s: float
    env_s: float
    parse_status: str | None = None
    """How the family processor read the turn (``trl_env.render.processors.base.ParseStatus`` value: ``ok``,
    ``cut_in_reasoning``, ``no_action_marker``, ``unclosed_action``); ``None`` when not parsed or for
    processors that report none."""
    tool_calls: tuple[tuple[str, bool], ...] = ()
    """(tool name, succeeded) for each tool result the env answered this turn with (``trl_env.render.tools``)."""
    policy: str | None = None
    """The weights that sampled this turn (``Generation.policy``: the served model or LoRA adapter the request
    named), ``None`` where the backend does not say. Turns of one episode can differ across a weight sync."""
    anchor: str | None = None
    """The env's key for the state this turn acted on: ``str(env.info["anchor"])`` after the reset or step before
    it, ``None`` when the env's ``info`` has no ``"anchor"`` (GiGPO then groups turns by observation text)."""


@dataclass(frozen=True)
class Span:
    """One model turn's place in its row's completion: its sampled tokens, then the env tokens that answered it."""

    turn: int
    """Its index in ``Rollout.turns``."""
    model: slice
    """Its model tokens in ``Row.completion_ids`` (trained on)."""
    env: slice
    """The env tokens after it (masked; empty when the episode ended with this turn)."""


@dataclass(frozen=True)
class Row:
    """One training row, token-exact: each model turn it holds was sampled from ``prompt_ids + completion_ids[:k]``."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """One entry per completion token: the sampler's logprob, 0.0 on env tokens."""
    env_mask: list[int]
    """One entry per completion token: 1 = sampled (trained on), 0 = env text."""
    spans: tuple[Span, ...]
    """Its turns' places in ``completion_ids`` (consecutive turns of the episode, in order), recorded when the row was
    built (``Row.of_turns``); empty for a placeholder row (an episode without a model turn)."""

    @property
    def turns(self) -> int:
        """How many of the episode's model turns it holds."""
        return len(self.spans)

    @classmethod
    def of_turns(
        cls,
        prompt_ids: list[int],
        completion_ids: list[int],
        logprobs: list[float],
        env_mask: list[int],
        turns: Sequence[Turn],
        first: int = 0,
    ) -> Row:
        """A row holding ``turns``, the episode's turns ``first``, ``first + 1``, ...

        They lie in ``completion_ids`` one after another: each turn's ``num_model_tokens`` sampled tokens, then its
        ``num_env_tokens`` env tokens.
        """
        return cls(prompt_ids, completion_ids, logprobs, env_mask, _laid(turns, first))


@dataclass(frozen=True)
class Rollout:
    """One finished episode, token-exact: its training ``rows``; each turn was sampled from a row's context."""

    seed: Seed
    rows: tuple[Row, ...]
    """The training rows, in turn order, never empty. ``history="sampled"``: one, holding every turn.
    ``"deployed"``: one per turn whose context does not extend the previous row verbatim (turns share a row where it
    does). An episode without a model turn has one placeholder row."""
    turns: tuple[Turn, ...]
    reward: float | None
    """``env.reward`` at the end; ``None`` when the episode failed or the model never acted."""
    ending: Ending
    error: str = ""
    """For ``Ending.ERROR``: the error message and the last lines of its traceback."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extra facts, e.g. ``placeholder=True`` when the completion is a single masked stand-in token."""

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError(
                "Rollout(rows=()): an episode has at least one training row; build rows with Row.of_turns(...), or "
                "a one-row episode with Rollout.single(...)."
            )

    @classmethod
    def single(
        cls,
        seed: Seed,
        prompt_ids: list[int],
        completion_ids: list[int],
        logprobs: list[float],
        env_mask: list[int],
        turns: tuple[Turn, ...],
        reward: float | None,
        ending: Ending,
        error: str = "",
        info: dict[str, Any] | None = None,
    ) -> Rollout:
        """An episode of one row holding every turn (what ``history="sampled"`` gives), e.g. built by hand."""
        row = Row.of_turns(prompt_ids, completion_ids, logprobs, env_mask, turns)
        return cls(seed, (row,), turns, reward, ending, error, {} if info is None else info)

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt of the episode's one row (see ``completion_ids``)."""
        return self._only().prompt_ids

    @property
    def completion_ids(self) -> list[int]:
        """The completion of the episode's one row: ``prompt_ids + completion_ids`` is what the sampler saw.

        Raises:
            ConfigError: for an episode of several rows (``history="deployed"``): read ``rows``.
        """
        return self._only().completion_ids

    @property
    def logprobs(self) -> list[float]:
        """The logprobs of the episode's one row (see ``completion_ids``)."""
        return self._only().logprobs

    @property
    def env_mask(self) -> list[int]:
        """The env mask of the episode's one row (see ``completion_ids``)."""
        return self._only().env_mask

    def _only(self) -> Row:
        if len(self.rows) != 1:
            raise ConfigError(
                f"this episode has {len(self.rows)} training rows (history='deployed' starts a row where the chat "
                "template rewrote the history), so it has no single prompt_ids, completion_ids, logprobs or "
                "env_mask: read rollout.rows (each Row has them, and its turns' spans)."
            )
        return self.rows[0]

    def spans(self) -> list[tuple[Row, list[Span]]]:
        """Each training row with the spans of its turns (``Row.spans``, as recorded when the row was built).

        Raises:
            ConfigError: when the spans do not tile a row's completion, or disagree with the turns' token counts (an
                inconsistent record, e.g. built by hand).
        """
        out, first = [], 0
        for row in self.rows:
            end = 0
            for k, span in enumerate(row.spans, start=first):
                if (span,) != _laid(self.turns[k : k + 1], k, end):  # a check of the record, O(turns)
                    raise ConfigError(
                        f"{span} is not where turn {k} of {len(self.turns)} lies after {end} tokens (its own token "
                        "counts, just after the previous turn's): the episode's record is inconsistent."
                    )
                end = span.env.stop
            first += row.turns
            if end != len(row.completion_ids):
                raise ConfigError(
                    f"a row's {row.turns} turns hold {end} tokens but its completion has {len(row.completion_ids)}: "
                    "the episode's record is inconsistent."
                )
            out.append((row, list(row.spans)))
        return out

    @property
    def terminated(self) -> bool:
        """The env ended the episode."""
        return self.ending is Ending.ENV_DONE

    @property
    def truncated(self) -> bool:
        """A budget ended the episode."""
        return self.ending in (Ending.MAX_TURNS, Ending.LENGTH)


def _laid(turns: Sequence[Turn], first: int, start: int = 0) -> tuple[Span, ...]:
    """The spans of ``turns`` (the episode's turns ``first``, ...) laid one after another from token ``start``."""
    spans, end = [], start
    for k, turn in enumerate(turns, start=first):
        model = slice(end, end + turn.num_model_tokens)
        spans.append(Span(k, model, slice(model.stop, model.stop + turn.num_env_tokens)))
        end = model.stop + turn.num_env_tokens
    return tuple(spans)
