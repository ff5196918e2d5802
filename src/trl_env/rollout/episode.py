"""``Episode``: the token lists one running episode builds, on the scheduler thread (``rollout/engine.py``).

It keeps the invariant that ``completion_ids``, ``logprobs`` and ``env_mask`` stay aligned: model tokens enter only
through ``append_model``, env tokens only through ``append_env``. The calls into user code that advance it are
``rollout/calls.py``'s ``Calls``.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from trl_env.backends.base import FinishReason, Generation, GenerationRequest, Generator, check_request_sampling
from trl_env.env import Env, Seed
from trl_env.render.chat import SamplingEnv
from trl_env.render.history import Conversation
from trl_env.rollout.records import Budgets, Ending, Rollout, Row, Turn

if TYPE_CHECKING:
    from trl_env.rollout.calls import Stepped


@dataclass
class Episode:
    """Mutable state of one running episode; ``to_rollout`` freezes it."""

    index: int
    seed: Seed
    env: Env | None = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    """The reward the last ``reset`` or step reported (read when it returned, never after ``close``)."""
    sampled: Generation | None = None
    """The model turn between generation and its env step."""
    generation_s: float = 0.0
    submitted_at: float = 0.0
    ending: Ending | None = None
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    messages: Conversation | None = None
    """With ``history="deployed"``: the conversation so far; ``prompt_ids`` + ``completion_ids`` is the current row."""
    rows: list[Row] = field(default_factory=list)
    """Finished rows (``history="deployed"``): the current one is ``prompt_ids``, ``completion_ids``, ... ."""
    row_turns: int = 0
    """Model turns in the current row."""
    anchor: str | None = None
    """The env's ``info["anchor"]`` after its last reset or step: the state the next turn acts on (``Turn.anchor``)."""

    def room(self, budgets: Budgets, extra: int = 0) -> int:
        """Tokens the next model turn may sample once ``extra`` more env tokens are appended."""
        used = len(self.completion_ids) + extra
        room = min(budgets.max_new_tokens, budgets.max_completion_tokens - used)
        if budgets.max_context is not None:
            room = min(room, budgets.max_context - len(self.prompt_ids) - used)
        return room

    def append_model(self, sampled: Generation) -> None:
        """Append the sampled ids and their logprobs verbatim (trained on)."""
        self.completion_ids += sampled.token_ids
        self.logprobs += sampled.logprobs
        self.env_mask += [1] * len(sampled.token_ids)
        self.row_turns += 1
        self.sampled = sampled
        self.generation_s = time.perf_counter() - self.submitted_at

    def append_env(self, stepped: Stepped | None, env_ids: list[int]) -> None:
        """Close the turn in progress with what the env answered (``None``: no step) and append ``env_ids``."""
        assert self.sampled is not None, "a turn closes after it was sampled"
        text = stepped.text if stepped is not None else ""
        self.turns.append(
            Turn(
                text=text,
                reasoning=stepped.reasoning if stepped is not None else "",
                action=stepped.action if stepped is not None else None,
                delta=stepped.delta if stepped is not None else None,
                reward=stepped.reward if stepped is not None else None,
                finish_reason=self.sampled.finish_reason,
                num_model_tokens=len(self.sampled.token_ids),
                num_env_tokens=len(env_ids),
                generation_s=self.generation_s,
                env_s=stepped.env_s if stepped is not None else 0.0,
                parse_status=stepped.parse_status if stepped is not None else None,
                tool_calls=stepped.tool_calls if stepped is not None else (),
                policy=self.sampled.policy,
                anchor=self.anchor,
            )
        )
        if stepped is not None:
            self.anchor = anchor_of(stepped.env_info)
        self.completion_ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.env_mask += [0] * len(env_ids)
        self.sampled = None

    def start_row(self, prompt_ids: list[int]) -> None:
        """Close the current row and open one whose prompt is ``prompt_ids`` (a context that does not extend it)."""
        assert self.sampled is None and self.completion_ids, "a row closes after its turn"
        self.rows.append(self._row())
        self.prompt_ids, self.completion_ids, self.logprobs, self.env_mask = prompt_ids, [], [], []
        self.row_turns = 0

    def _row(self) -> Row:
        """The current row, with its turns' spans: the episode's last ``row_turns`` turns, laid out as appended."""
        first = len(self.turns) - self.row_turns
        return Row.of_turns(
            self.prompt_ids, self.completion_ids, self.logprobs, self.env_mask, self.turns[first:], first
        )

    def finish(self, ending: Ending, error: str = "") -> None:
        """Record the episode's one ending."""
        assert self.ending is None, "an episode ends once"
        self.ending, self.error = ending, error

    def to_rollout(self, placeholder_id: int) -> Rollout:
        """The finished episode; without a model turn, prompt and completion are one masked ``placeholder_id``."""
        assert self.ending is not None, "every episode ends"
        # No reward without a model turn (it would only shift the group's baseline) or after a failure.
        scored = self.ending is not Ending.ERROR and bool(self.turns)
        # A row opened, then the episode failed before its turn was sampled: the row is dropped.
        rows = [*self.rows, self._row()] if self.completion_ids else list(self.rows)
        if not rows:
            # TRL needs a non-empty prompt and completion, and pads every row to the batch's longest prompt plus
            # longest completion: one masked stand-in token each, so the row fits any model. Flagged.
            rows = [Row([placeholder_id], [placeholder_id], [0.0], [0], ())]
            self.info["placeholder"] = True
            self.info["prompt_tokens"] = len(self.prompt_ids)
        return Rollout(
            seed=self.seed,
            rows=tuple(rows),
            turns=tuple(self.turns),
            reward=self.reward if scored else None,
            ending=self.ending,
            error=self.error,
            info=self.info,
        )


def anchor_of(info: dict[str, Any] | None) -> str | None:
    """The state key an env's ``info`` names (``info["anchor"]``, as a string), ``None`` without one."""
    if not info or info.get("anchor") is None:
        return None
    return str(info["anchor"])


_SAMPLING_ENVS: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
"""Env class -> whether it is a ``SamplingEnv`` (a runtime-protocol ``isinstance`` costs ~27 us: once per class)."""


def turn_request(ep: Episode, budgets: Budgets, stops: tuple[int, ...], generator: Generator) -> GenerationRequest:
    """An episode's next turn: its ids so far, and the env's own sampling if it asks for any.

    Its ``max_tokens`` is what the budgets allow (``Episode.room``), or a chat request's own cap where that is smaller
    (``ChatRequest.max_tokens``: an agent call's ``max_tokens`` / ``max_completion_tokens``).

    Raises:
        ConfigError: for settings ``generator`` cannot honour (``check_request_sampling``): never silently dropped.
    """
    ids, room, cap = ep.prompt_ids + ep.completion_ids, ep.room(budgets), _own_cap(ep)
    max_tokens = room if cap is None else min(room, cap)
    kind = type(ep.env)
    if kind not in _SAMPLING_ENVS:
        _SAMPLING_ENVS[kind] = isinstance(ep.env, SamplingEnv)
    own = cast(SamplingEnv, ep.env).turn_sampling if _SAMPLING_ENVS[kind] else None
    if not own:
        return GenerationRequest(ids, max_tokens, stops)
    check_request_sampling(generator, own, why=f"{kind.__name__}.turn_sampling")
    return GenerationRequest(ids, max_tokens, stops, dict(own))


def _own_cap(ep: Episode) -> int | None:
    return None if ep.messages is None else ep.messages.max_tokens


def cut_at_own_cap(ep: Episode, sampled: Generation, room: int) -> bool:
    """Whether a turn was cut at its chat request's own cap, below the budgets' ``room``: the env answers it.

    It is stepped with the cut turn (a ``Reply`` with ``finish_reason`` ``length``) and the episode goes on, as an
    OpenAI server answers a call that asked for fewer tokens. Any other ``length`` turn (the cap absent, or not below
    the budgets) was cut by the trainer's budgets or the server's context and ends its episode, unless
    ``parse_truncated_turns``.
    """
    if sampled.finish_reason is not FinishReason.LENGTH:
        return False
    cap = _own_cap(ep)
    return cap is not None and len(sampled.token_ids) == cap < room
