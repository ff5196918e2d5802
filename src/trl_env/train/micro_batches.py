"""Rows of multi-row episodes in micro-batches bounded by a token budget, each normalised as its whole step's batch.

``EpisodeGRPOTrainer`` (``history="deployed"``) hands TRL more rows than episodes; this module splits one generation
batch of rows into TRL's micro-steps and each micro-step into chunks of at most ``budget`` tokens (rows x padded
length), and scales each chunk's TRL loss so that the chunks of one optimizer step, on every process, sum to TRL's
loss of that step's rows as one batch. Padding rows (there only to give every process the same shapes) count in no
denominator. TRL's loss is ``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``); this module never
recomputes it, it only picks the rows and the factor.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trl_env.errors import ConfigError
from trl_env.train.packing import TokenTrie
from trl_env.train.trl_internals import ITEM_LOSSES, ROW_LOSSES, TOKEN_LOSSES

__all__ = [
    "REAL_ROW",
    "MicroStep",
    "check_micro_batches",
    "chunk_scale",
    "micro_step_loss",
    "plan_micro_steps",
    "take_rows",
]

REAL_ROW = "trl_env_real_row"
"""Key of the scored batch: 1 for a row of an episode, 0 for a padding row (one per row)."""


@dataclass(frozen=True)
class MicroStep:
    """One of TRL's micro-steps: its rows in chunks that fit the budget, and the denominators of its optimizer step."""

    chunks: list[dict[str, Any]]
    """TRL batches (same keys as TRL's), each at most ``budget`` tokens; every process has as many, of equal sizes."""
    rows: int
    """Real rows in this micro-step's optimizer step, on every process (a row-mean loss's denominator)."""
    tokens: int
    """Trained tokens (completion mask x env mask) of those rows (a token-mean loss's denominator)."""
    steps: int
    """Micro-steps per generation batch (TRL's ``steps_per_generation``; 1 in eval)."""


def check_micro_batches(steps: int, accumulation: int, budget: int | None, extras: list[str]) -> None:
    """Refuse what the row micro-batches cannot normalise as one batch of the optimizer step's rows.

    Raises:
        ConfigError: for an optimizer step spanning two generation batches, a budget below one token, or a loss
            term TRL normalises per micro-batch (``extras``, from ``trl_internals.loss_extras``).
    """
    if steps % accumulation:
        raise ConfigError(
            f"history='deployed' with steps_per_generation={steps} and gradient_accumulation_steps={accumulation}: "
            "an optimizer step's rows must come from one generation batch, so that each micro-batch is normalised by "
            "all of them; make steps_per_generation a multiple of gradient_accumulation_steps."
        )
    if budget is not None and budget < 1:
        raise ConfigError(f"max_micro_batch_tokens={budget}: expected a positive number of tokens, or None.")
    if extras:
        raise ConfigError(
            f"history='deployed' with {' and '.join(extras)}: TRL normalises it per micro-batch, which the row "
            "micro-batches cannot make one batch of the step's rows; turn it off, or use history='sampled'."
        )


def take_rows(batch: dict[str, Any], index: list[int]) -> dict[str, Any]:
    """``batch`` restricted to the rows ``index`` (tensors along their first dimension, lists by item; scalars kept)."""
    picked = torch.tensor(index, dtype=torch.long)

    def take(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value if value.ndim == 0 else value[picked.to(value.device)]
        if isinstance(value, list):
            return [value[i] for i in index]
        return value

    return {k: take(v) for k, v in batch.items()}


def trained_tokens(batch: dict[str, Any]) -> torch.Tensor:
    """Per row, the tokens TRL's loss trains: ``completion_mask`` x ``tool_mask`` (env tokens 0), summed."""
    mask = batch["completion_mask"]
    if batch.get("tool_mask") is not None:
        mask = mask * batch["tool_mask"]
    return mask.sum(dim=1)


def _split(items: list[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` consecutive pieces whose sizes differ by at most one (larger first)."""
    size, extra = divmod(len(items), parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + size + (p < extra))
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def plan_micro_steps(
    batch: dict[str, Any],
    *,
    steps: int,
    accumulation: int,
    budget: int | None,
    default_rows: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    packed: bool = False,
) -> list[MicroStep]:
    """Split a scored batch of rows into ``steps`` micro-steps of token-bounded chunks, and their denominators.

    The real rows (``REAL_ROW``; all rows without it) are shuffled and dealt into ``steps`` near-equal micro-steps;
    each micro-step's rows go into chunks of at most ``budget // padded length`` rows (``default_rows`` rows when
    ``budget`` is ``None``; at least one row, however long). ``gather`` is the trainer's ``accelerator.gather``:
    every process then has as many chunks per micro-step, of the same sizes, filled up with padding rows (masked
    copies of row 0), because TRL's loss gathers per-row metrics. Each optimizer step (``accumulation`` micro-steps)
    gets the real rows and trained tokens of all its micro-steps on every process.
    """
    if steps % accumulation:
        raise ValueError(f"{steps} micro-steps per generation is not a multiple of {accumulation} per optimizer step")
    width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)  # every chunk keeps the batch's padding
    real = batch.get(REAL_ROW)
    real_rows = [i for i in range(batch["completion_ids"].size(0)) if real is None or bool(real[i])]
    order = [real_rows[int(i)] for i in torch.randperm(len(real_rows))]
    parts = _split(order, steps)
    tokens = trained_tokens(batch)
    mine = [width] + [len(p) for p in parts] + [int(sum(tokens[i].item() for i in p)) for p in parts]
    device = batch["completion_ids"].device
    every = gather(torch.tensor(mine, dtype=torch.long, device=device)).view(-1, 1 + 2 * steps).cpu()
    widest = int(every[:, 0].max())
    per_chunk = max(1, (budget // widest) if budget is not None else default_rows)
    most_rows = every[:, 1 : 1 + steps].max(dim=0).values.tolist()
    rows_of_step = every[:, 1 : 1 + steps].sum(dim=0).tolist()
    tokens_of_step = every[:, 1 + steps :].sum(dim=0).tolist()
    window_rows = [sum(rows_of_step[w : w + accumulation]) for w in range(0, steps, accumulation)]
    window_tokens = [sum(tokens_of_step[w : w + accumulation]) for w in range(0, steps, accumulation)]
    if packed and budget is not None:
        parts, sizes_of = _deal_by_unique_tokens(batch, parts, most_rows, budget, gather)
    else:
        sizes_of = []
        for k in range(steps):
            count = max(1, math.ceil(most_rows[k] / per_chunk))  # every process: as many chunks, as large
            sizes_of.append([len(p) for p in _split(list(range(most_rows[k])), count)])
    plan = []
    for k, part in enumerate(parts):
        chunks, start = [], 0
        for size in sizes_of[k]:
            own = part[start : start + size]
            start += size
            filler = own[0] if packed and own else 0
            chunk = take_rows(batch, own + [filler] * (size - len(own)))
            chunk.pop(REAL_ROW, None)
            chunk["completion_mask"][len(own) :] = 0  # padding rows: no trained token, in no denominator
            chunks.append(chunk)
        window = k // accumulation
        plan.append(MicroStep(chunks=chunks, rows=window_rows[window], tokens=window_tokens[window], steps=steps))
    return plan


def _row_tokens(batch: dict[str, Any], row: int) -> list[int]:
    """The tokens the forward of ``row`` runs: its prompt and completion tokens under their masks."""
    prompt, completion = batch["prompt_ids"][row], batch["completion_ids"][row]
    prompt_mask = batch.get("prompt_mask")
    kept = prompt if prompt_mask is None else prompt[prompt_mask[row].bool()]
    return [*kept.tolist(), *completion[batch["completion_mask"][row].bool()].tolist()]


def _deal_by_unique_tokens(
    batch: dict[str, Any],
    parts: list[list[int]],
    most_rows: list[int],
    budget: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[list[list[int]], list[list[int]]]:
    """Each micro-step's rows sorted by their tokens, and its chunk sizes, the same on every process.

    This process deals its rows into chunks whose unique tokens (``TokenTrie``) stay within ``budget`` (a row alone
    may exceed it); the processes' chunk sizes are gathered and chunk ``j`` gets the most rows any put in theirs.
    """
    sorted_parts, mine = [], []
    for k, part in enumerate(parts):
        tokens = {row: _row_tokens(batch, row) for row in part}
        part = sorted(part, key=lambda row: tokens[row])
        sizes: list[int] = []
        trie = TokenTrie()
        for row in part:
            if sizes and trie.size + trie.new_tokens(tokens[row]) > budget:
                sizes.append(0)
                trie = TokenTrie()
            if not sizes:
                sizes.append(0)
            trie.add(tokens[row])
            sizes[-1] += 1
        sorted_parts.append(part)
        mine += sizes + [0] * (most_rows[k] - len(sizes))
    device = batch["completion_ids"].device
    every = gather(torch.tensor(mine, dtype=torch.long, device=device)).view(-1, max(len(mine), 1)).cpu()
    most = every.max(dim=0).values.tolist() if mine else []
    sizes_of, start = [], 0
    for k in range(len(parts)):
        common = [size for size in most[start : start + most_rows[k]] if size]
        sizes_of.append(common or [0])
        start += most_rows[k]
    return sorted_parts, sizes_of


def chunk_scale(loss_type: str, chunk: dict[str, Any], step: MicroStep, *, processes: int, accumulation: int) -> float:
    """The factor that turns TRL's loss of ``chunk`` into its share of the step's loss as one batch of real rows.

    TRL divides a chunk's summed loss by the chunk's rows (``ROW_LOSSES``) or tokens (``bnpo``), or by
    ``num_items_in_batch`` rescaled to a micro-step (``ITEM_LOSSES``), and by ``accumulation``; the data-parallel
    backward averages over ``processes``. The factor undoes that and divides by the optimizer step's real rows or
    tokens on every process instead: the chunks then sum to the one-batch loss, whatever the chunk sizes.
    """
    if loss_type in ROW_LOSSES:
        return chunk["completion_ids"].size(0) * accumulation * processes / max(step.rows, 1)
    if loss_type in TOKEN_LOSSES:
        own = max(float(trained_tokens(chunk).sum()), 1.0)
        return own * accumulation * processes / max(step.tokens, 1)
    if loss_type in ITEM_LOSSES:
        items = max(float(chunk["num_items_in_batch"]), 1.0)
        return items / processes * accumulation / step.steps * processes / max(step.tokens, 1)
    raise ValueError(f"loss_type={loss_type!r} is not one trl_env knows how to normalise per micro-batch")


def micro_step_loss(
    trainer: Any, model: Any, step: MicroStep, loss_of: Callable[[dict[str, Any]], torch.Tensor]
) -> torch.Tensor:
    """The micro-step's loss, chunk by chunk; in training, every chunk but the last is back-propagated here.

    One chunk's activations at a time: each earlier chunk's loss is back-propagated at once, without the gradient
    all-reduce (``accelerator.no_sync``), and only the last chunk's loss keeps its graph, for the Trainer's own
    backward (synchronised or not, as the Trainer decides). The returned value is the whole micro-step's loss.
    """
    training = model.training and torch.is_grad_enabled()
    processes = trainer.accelerator.num_processes
    accumulation = trainer.current_gradient_accumulation_steps if model.training else 1
    losses = []
    for i, chunk in enumerate(step.chunks):
        deferred = training and i < len(step.chunks) - 1
        scale = chunk_scale(trainer.loss_type, chunk, step, processes=processes, accumulation=accumulation)
        with trainer.accelerator.no_sync(model) if deferred else contextlib.nullcontext():
            loss = loss_of(chunk) * scale
            if deferred:
                trainer.accelerator.backward(loss)
                loss = loss.detach()
        losses.append(loss)
    return losses[-1] + sum(losses[:-1], torch.zeros_like(losses[-1]).detach())
