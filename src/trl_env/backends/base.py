"""The generator seam: the one interface between the rollout engine and whatever samples tokens.

A generator takes token-id prompts with stop ids and a token budget and returns the sampled ids,
their processed logprobs and why sampling stopped. ``submit`` returns futures so a backend can
answer each request on its own (a server) or a whole wave at once (an in-process model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from trl_env.errors import ConfigError


class FinishReason(str, Enum):
    """Why the sampler stopped a turn."""

    STOP = "stop"
    """It sampled a stop token (kept as the turn's last id)."""
    LENGTH = "length"
    """It hit the turn's ``max_tokens``."""


_NO_SAMPLING: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class GenerationRequest:
    """One model turn to sample."""

    prompt_ids: list[int]
    """The whole context so far: episode prompt plus completion up to this turn."""
    max_tokens: int
    """Most tokens to sample; the engine has already capped it by every remaining budget."""
    stop_token_ids: tuple[int, ...]
    """Ids that end the turn; the one sampled is returned as the last id."""
    sampling: Mapping[str, float] = field(default_factory=lambda: _NO_SAMPLING)
    """This request's own sampling settings (``temperature``, ``top_p``), over the generator's; empty: the generator's.
    Only a generator whose ``request_sampling`` names them may be given them (``check_request_sampling``)."""


@dataclass(frozen=True)
class Generation:
    """What the sampler produced for one request."""

    token_ids: list[int]
    """Sampled ids, verbatim."""
    logprobs: list[float]
    """Processed logprob of each sampled id (after temperature, top-k/top-p), one per id."""
    finish_reason: FinishReason
    policy: str | None = None
    """Which weights sampled it, where the backend knows: the model or LoRA adapter the request named."""


@runtime_checkable
class Generator(Protocol):
    """Samples model turns. ``continuous`` tells the engine how to schedule.

    With ``continuous = True`` (a server) the engine submits each episode's turn as soon as that
    episode is ready; with ``False`` (an in-process model) it waits until every episode that is
    still running is ready and submits them as one wave, the batch the backend needs anyway.
    ``context_limit`` is the model's context length (``None``: unknown), and ``session()`` wraps one
    rollout (e.g. wakes a sleeping engine). ``GeneratorBase`` gives both their defaults; a plain
    object with only ``continuous`` and ``submit`` is accepted too (``as_generator``).
    """

    continuous: bool

    @property
    def context_limit(self) -> int | None:
        """Most prompt + completion tokens the model takes; ``None`` if unknown."""
        ...

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Wrap one rollout."""
        ...

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Start sampling ``requests``; one future per request, in order."""
        ...


class GeneratorBase:
    """Defaults for a generator's optional capabilities: subclass it and write ``continuous`` and ``submit``."""

    continuous: bool = True
    request_sampling: frozenset[str] = frozenset()
    """The ``GenerationRequest.sampling`` keys this generator honours per request (none by default)."""

    @property
    def context_limit(self) -> int | None:
        """Unknown by default."""
        return None

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to do around a rollout by default."""
        return contextlib.nullcontext()

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Start sampling ``requests``; one future per request, in order."""
        raise NotImplementedError


@runtime_checkable
class _Limited(Protocol):
    @property
    def context_limit(self) -> int | None: ...


@runtime_checkable
class _Sessioned(Protocol):
    def session(self) -> contextlib.AbstractContextManager[None]: ...


class _Minimal(GeneratorBase):
    """A plain object with ``continuous`` and ``submit``; its ``context_limit`` and ``session()`` where it has them."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.continuous = inner, bool(inner.continuous)

    @property
    def context_limit(self) -> int | None:
        return self.inner.context_limit if isinstance(self.inner, _Limited) else None

    def session(self) -> contextlib.AbstractContextManager[None]:
        return self.inner.session() if isinstance(self.inner, _Sessioned) else contextlib.nullcontext()

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        return list(self.inner.submit(requests))


def as_generator(generator: object) -> Generator:
    """``generator`` as a full ``Generator``: a ``GeneratorBase`` (or a complete one) as it is, a minimal one wrapped.

    The wrapper keeps what the object has of ``context_limit`` and ``session()`` and gives the rest their defaults.

    Raises:
        ConfigError: for an object without ``continuous`` and ``submit``.
    """
    if isinstance(generator, GeneratorBase) or isinstance(generator, Generator):
        return generator  # type: ignore[return-value]  # checked by the runtime protocol
    if callable(getattr(generator, "submit", None)) and hasattr(generator, "continuous"):
        return _Minimal(generator)
    raise ConfigError(
        f"{type(generator).__name__} is not a generator: it needs `continuous: bool` and "
        "`submit(requests) -> list[Future[Generation]]` (subclass trl_env.backends.base.GeneratorBase)."
    )


def request_sampling_of(generator: object) -> frozenset[str]:
    """The per-request sampling keys ``generator`` honours: a ``GeneratorBase``'s ``request_sampling``, else none."""
    return generator.request_sampling if isinstance(generator, GeneratorBase) else frozenset()


def check_request_sampling(generator: object, keys: Collection[str], *, why: str) -> None:
    """Refuse per-request sampling ``keys`` that ``generator`` does not honour (``GeneratorBase.request_sampling``).

    Raises:
        ConfigError: naming the generator, the keys it cannot honour, ``why`` they are asked for, and the fix.
    """
    missing = sorted(set(keys) - request_sampling_of(generator))
    if missing:
        inner = generator.inner if isinstance(generator, _Minimal) else generator
        raise ConfigError(
            f"{why} needs per-request sampling ({', '.join(missing)}), and {type(inner).__name__} samples every "
            "request with its own settings; use a generator that honours them (VLLMServerGenerator), or leave the "
            "sampling to the trainer."
        )


def resolved(generation: Generation) -> Future[Generation]:
    """A future that already holds ``generation`` (for synchronous backends)."""
    future: Future[Generation] = Future()
    future.set_result(generation)
    return future


# Sampling fields of vLLM's /v1/completions request (0.32) that generation_kwargs may set.
VLLM_SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "min_tokens",
        "ignore_eos",
        "bad_words",
        "logit_bias",
        "allowed_token_ids",
        "length_penalty",
        "structured_outputs",
        "response_format",
        "thinking_token_budget",
        "priority",
        "vllm_xargs",
        "repetition_detection",
        "spaces_between_special_tokens",
    }
)
# Set by trl-env per turn, or needed to keep the sampled ids and logprobs exact.
VLLM_MANAGED_KEYS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "n",
        "stop",
        "stop_token_ids",
        "include_stop_str_in_output",
        "logprobs",
        "prompt_logprobs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "skip_special_tokens",
        "stream",
        "echo",
        "use_beam_search",
        "truncate_prompt_tokens",
        "add_special_tokens",
        "suffix",
    }
)
_VLLM_REQUEST_ONLY = {"response_format", "priority", "vllm_xargs", "length_penalty"}  # HTTP fields, not SamplingParams


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of a ``GRPOConfig``, read once and shared by every backend."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables it."""
    min_p: float = 0.0
    """0.0 disables it."""
    repetition_penalty: float = 1.0
    generation_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """``GRPOConfig.generation_kwargs``: more settings for the backend; each backend refuses keys it cannot honour."""

    @classmethod
    def from_args(cls, args: Any) -> Sampling:
        """Read ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``generation_kwargs``."""
        return cls(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or 0,
            min_p=args.min_p or 0.0,
            repetition_penalty=args.repetition_penalty,
            generation_kwargs=dict(getattr(args, "generation_kwargs", None) or {}),
        )

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a backend's constructor."""
        return dict(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            generation_kwargs=dict(self.generation_kwargs),
        )


def vllm_sampling(
    backend: str,
    generation_kwargs: Mapping[str, Any] | None,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    repetition_penalty: float,
    request_fields: bool = True,
) -> dict[str, Any]:
    """VLLM's sampling fields (``top_k=-1``, ``min_p=0`` disable them) plus the checked ``generation_kwargs``.

    ``request_fields``: the HTTP request's own fields are allowed (server); else only ``SamplingParams``'.
    """
    allowed = VLLM_SAMPLING_KEYS if request_fields else VLLM_SAMPLING_KEYS - _VLLM_REQUEST_ONLY | {"extra_args"}
    return dict(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k or -1,
        min_p=min_p or 0.0,
        repetition_penalty=repetition_penalty,
    ) | check_generation_kwargs(backend, generation_kwargs or {}, allowed=allowed, managed=VLLM_MANAGED_KEYS)


def check_generation_kwargs(
    backend: str, kwargs: Mapping[str, Any], *, allowed: Collection[str], managed: Collection[str]
) -> dict[str, Any]:
    """Refuse a ``generation_kwargs`` key ``backend`` cannot honour, naming the key and the fix.

    Raises:
        ConfigError: for a key trl-env sets itself per turn (``managed``) or one the backend does not know.
    """
    for key in kwargs:
        if key in managed:
            raise ConfigError(
                f"generation_kwargs[{key!r}]: trl-env sets {key!r} itself for every turn of the {backend} backend "
                "(budgets, stop tokens, logprobs); remove it (use make_rollout_func's budgets for lengths)."
            )
        if key not in allowed:
            raise ConfigError(
                f"generation_kwargs[{key!r}] is not a sampling setting the {backend} backend can honour; remove it or "
                f"use one of: {', '.join(sorted(allowed))}."
            )
    return dict(kwargs)
