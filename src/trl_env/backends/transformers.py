"""In-process generation with a transformers model (the trainer's own model when ``use_vllm=False``).

Episodes waiting for a turn are sampled together in one left-padded ``model.generate`` call; the
logprobs returned are the processed ones (log-softmax of the scores after temperature, top-k,
top-p, min-p and repetition penalty), the distribution the tokens were actually drawn from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from transformers import GenerationConfig

from trl_env.backends.base import (
    FinishReason,
    Generation,
    GenerationRequest,
    GeneratorBase,
    Sampling,
    check_generation_kwargs,
    resolved,
)
from trl_env.errors import ConfigError

# Set per wave by the engine, or needed for the logprobs: not for generation_kwargs.
_MANAGED = {
    "max_new_tokens",
    "max_length",
    "min_length",
    "eos_token_id",
    "pad_token_id",
    "do_sample",
    "num_beams",
    "num_return_sequences",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "stop_strings",
}


class TransformersGenerator(GeneratorBase):
    """Samples turns with ``model.generate`` in waves (``continuous = False``)."""

    continuous = False

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float | None = 0.0,
        repetition_penalty: float = 1.0,
        generation_kwargs: dict[str, Any] | None = None,
        max_batch_size: int = 64,
        unwrap: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        """Wrap ``model`` (a transformers causal LM, or a wrapped one with ``unwrap`` to reach it).

        Args:
            model: the model to sample from.
            pad_token_id: id used to left-pad prompts of different lengths.
            temperature: sampling temperature, > 0 (GRPO samples; greedy decoding has no logprobs to learn from).
            top_p: nucleus sampling; 1.0 disables it.
            top_k: top-k sampling; 0 disables it.
            min_p: min-p sampling; 0.0 or ``None`` disables it.
            repetition_penalty: 1.0 disables it.
            generation_kwargs: more ``GenerationConfig`` settings (``GRPOConfig.generation_kwargs``); they
                override the ones above.
            max_batch_size: most sequences per ``generate`` call.
            unwrap: context manager factory yielding the plain model (the trainer's unwrap for generation).
        """
        if not temperature > 0:
            raise ConfigError(f"temperature={temperature!r}: sampling needs temperature > 0 (e.g. 1.0).")
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size={max_batch_size!r} must be >= 1.")
        self.model = model
        self.max_batch_size = max_batch_size
        self._unwrap = unwrap or (lambda: contextlib.nullcontext(model))
        self._sampling = dict(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p or None,
            repetition_penalty=repetition_penalty,
            pad_token_id=pad_token_id,
        )
        known = set(GenerationConfig().to_dict())
        self._sampling.update(
            check_generation_kwargs("transformers", generation_kwargs or {}, allowed=known - _MANAGED, managed=_MANAGED)
        )

    @classmethod
    def from_trainer(cls, trainer: Any, *, max_batch_size: int = 64) -> TransformersGenerator:
        """Sample with ``trainer.model`` and the sampling settings of ``trainer.args`` (a GRPOConfig)."""
        from trl.models import unwrap_model_for_generation

        args, tokenizer = trainer.args, trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a multimodal processor wraps its tokenizer
        return cls(
            trainer.model_wrapped,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            **Sampling.from_args(args).as_kwargs(),
            max_batch_size=max_batch_size,
            unwrap=lambda: unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation
            ),
        )

    @property
    def context_limit(self) -> int | None:
        """The model's context length (``max_position_embeddings``), if it says."""
        config = getattr(getattr(self.model, "module", self.model), "config", None)
        return getattr(config, "max_position_embeddings", None)

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Sample every request now, ``max_batch_size`` at a time; the futures are already done."""
        results: list[Generation] = []
        with self._unwrap() as model, _eval_mode(model), torch.no_grad():
            for start in range(0, len(requests), self.max_batch_size):
                results.extend(self._generate(model, requests[start : start + self.max_batch_size]))
        return [resolved(g) for g in results]

    def _generate(self, model: Any, requests: Sequence[GenerationRequest]) -> list[Generation]:
        stops = requests[0].stop_token_ids
        assert all(r.stop_token_ids == stops for r in requests), "one wave shares its stop ids"
        pad = self._sampling["pad_token_id"]
        width = max(len(r.prompt_ids) for r in requests)
        # (B, width), left-padded so every row's next token is at the same position
        input_ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests])
        attention_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests])
        config = GenerationConfig(
            **self._sampling,
            max_new_tokens=max(r.max_tokens for r in requests),
            eos_token_id=list(stops),
            output_scores=True,
            return_dict_in_generate=True,
        )
        device = model.device
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
        )
        new_ids = out.sequences[:, width:].cpu()  # (B, steps)
        # processed scores -> logprob of the sampled id at each step: (B, steps)
        scores = torch.stack(out.scores, dim=1).float().cpu()
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)
        rows = zip(new_ids.tolist(), logprobs.tolist(), requests, strict=True)
        return [_cut(ids, lps, r.max_tokens, stops) for ids, lps, r in rows]


def _cut(ids: list[int], logprobs: list[float], max_tokens: int, stops: tuple[int, ...]) -> Generation:
    """Keep a row up to its first stop id (inclusive) or its own budget, whichever comes first.

    Sampling is causal, so cutting a longer sample at ``max_tokens`` is the sample it would have drawn alone.
    """
    for i, token in enumerate(ids[:max_tokens]):
        if token in stops:
            return Generation(ids[: i + 1], logprobs[: i + 1], FinishReason.STOP)
    return Generation(ids[:max_tokens], logprobs[:max_tokens], FinishReason.LENGTH)


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """Sample without dropout, as the trainer's logprob recomputation assumes; restore the mode after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
