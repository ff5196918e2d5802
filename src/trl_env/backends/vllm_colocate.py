"""Generation with the trainer's in-process ``vllm.LLM`` (TRL's ``vllm_mode="colocate"``), in waves.

An in-process engine takes a list of prompts per call, so waiting episodes are sampled together
(``continuous = False``), each with its own ``SamplingParams`` (its own ``max_tokens``). With sleep
mode on, the engine is woken once per rollout (weights re-pushed if they were discarded) and put
back to sleep after it, as TRL's own generation does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from trl_env.backends.base import (
    FinishReason,
    Generation,
    GenerationRequest,
    GeneratorBase,
    Sampling,
    resolved,
    vllm_sampling,
)
from trl_env.errors import ServerError


class VLLMColocateGenerator(GeneratorBase):
    """Samples turns with an in-process ``vllm.LLM`` (``continuous = False``)."""

    continuous = False

    def __init__(
        self,
        llm: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        generation_kwargs: dict[str, Any] | None = None,
        vllm_generation: Any = None,
        sampling_params: Callable[..., Any] | None = None,
    ) -> None:
        """Wrap ``llm`` (a ``vllm.LLM`` built with ``logprobs_mode="processed_logprobs"``, as TRL builds it).

        Args:
            llm: the engine.
            temperature: sampling settings, as in GRPOConfig.
            top_p: 1.0 disables it.
            top_k: 0 disables it.
            min_p: 0.0 disables it.
            repetition_penalty: 1.0 disables it.
            generation_kwargs: more ``SamplingParams`` fields (``GRPOConfig.generation_kwargs``); they override
                the ones above. Keys trl-env sets itself are refused.
            vllm_generation: TRL's ``trainer.vllm_generation``, for sleep/wake and weight re-sync.
            sampling_params: ``vllm.SamplingParams`` or a stand-in with the same keywords.
        """
        if sampling_params is None:
            from vllm import SamplingParams  # type: ignore[import-not-found]  # optional: vLLM runs in its own venv

            sampling_params = SamplingParams
        self.llm, self.vllm_generation, self._params = llm, vllm_generation, sampling_params
        self.sampling = vllm_sampling(
            "vLLM colocate",
            generation_kwargs,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            request_fields=False,
        )

    @classmethod
    def from_trainer(cls, trainer: Any) -> VLLMColocateGenerator:
        """Use ``trainer.vllm_generation.llm`` with the sampling settings of ``trainer.args``."""
        args = trainer.args
        return cls(
            trainer.vllm_generation.llm,
            **Sampling.from_args(args).as_kwargs(),
            vllm_generation=trainer.vllm_generation,
        )

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep the engine awake for one rollout when TRL runs it in sleep mode."""
        vg = self.vllm_generation
        sleeping = vg is not None and getattr(vg, "enable_sleep_mode", False)
        if sleeping:
            if getattr(vg, "_llm_weights_sleeping", False):
                vg.sync_weights()  # level-2 sleep discarded the weights: push the training weights again
            self.llm.wake_up(tags=["kv_cache"])
        try:
            yield
        finally:
            if sleeping:
                self.llm.sleep(level=2)
                vg._llm_weights_sleeping = True

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Sample every request in one ``llm.generate`` call; the futures are already done."""
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        params = [
            self._params(max_tokens=r.max_tokens, stop_token_ids=list(r.stop_token_ids), logprobs=0, **self.sampling)
            for r in requests
        ]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return [_future(o.outputs[0]) for o in outputs]


def _future(output: Any) -> Future[Generation]:
    """A done future: the generation, or the error that ends only this episode."""
    try:
        return resolved(_to_generation(output))
    except (ServerError, ValueError, KeyError, TypeError, AttributeError) as e:
        future: Future[Generation] = Future()
        future.set_exception(ServerError(f"vLLM returned an unusable output ({type(e).__name__}: {e})"))
        return future


def _to_generation(output: Any) -> Generation:
    """One vLLM ``CompletionOutput``: the sampled ids and, per position, the logprob of the sampled id."""
    ids = [int(t) for t in output.token_ids]
    if output.logprobs is None or len(output.logprobs) != len(ids):
        raise ServerError("vLLM returned no per-token logprobs; it must be asked for logprobs=0.")
    logprobs = []
    for token, by_id in zip(ids, output.logprobs, strict=True):
        value = by_id[token].logprob
        logprobs.append(math.nan if value is None else float(value))
    return Generation(ids, logprobs, FinishReason(output.finish_reason))
