"""The generator seam: the one interface between the rollout engine and whatever samples tokens.

A generator takes token-id prompts with stop ids and a token budget and returns the sampled ids,
their processed logprobs and why sampling stopped. ``submit`` returns futures so a backend can
answer each request on its own (a server) or a whole wave at once (an in-process model).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable


class FinishReason(str, Enum):
    """Why the sampler stopped a turn."""

    STOP = "stop"
    """It sampled a stop token (kept as the turn's last id)."""
    LENGTH = "length"
    """It hit the turn's ``max_tokens``."""


@dataclass(frozen=True)
class GenerationRequest:
    """One model turn to sample."""

    prompt_ids: list[int]
    """The whole context so far: episode prompt plus completion up to this turn."""
    max_tokens: int
    """Most tokens to sample; the engine has already capped it by every remaining budget."""
    stop_token_ids: tuple[int, ...]
    """Ids that end the turn; the one sampled is returned as the last id."""


@dataclass(frozen=True)
class Generation:
    """What the sampler produced for one request."""

    token_ids: list[int]
    """Sampled ids, verbatim."""
    logprobs: list[float]
    """Processed logprob of each sampled id (after temperature, top-k/top-p), one per id."""
    finish_reason: FinishReason


@runtime_checkable
class Generator(Protocol):
    """Samples model turns. ``continuous`` tells the engine how to schedule.

    With ``continuous = True`` (a server) the engine submits each episode's turn as soon as that
    episode is ready; with ``False`` (an in-process model) it waits until every episode that is
    still running is ready and submits them as one wave, the batch the backend needs anyway.
    """

    continuous: bool

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Start sampling ``requests``; one future per request, in order."""
        ...


def resolved(generation: Generation) -> Future[Generation]:
    """A future that already holds ``generation`` (for synchronous backends)."""
    future: Future[Generation] = Future()
    future.set_result(generation)
    return future
