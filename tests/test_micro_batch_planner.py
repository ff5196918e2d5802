"""Direct unit tests of the micro-batch planner (``plan_micro_steps``) and its loss factor (``chunk_scale``).

No trainer and no model: a scored batch is a dict of tensors, ``gather`` stands in for ``accelerator.gather`` (one
process, or this process's numbers next to another process's). The end-to-end check (loss and gradient equal TRL's
one-batch computation) is tests/test_micro_batches.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_env.train.micro_batches import REAL_ROW, MicroStep, chunk_scale, plan_micro_steps, trained_tokens
from trl_env.train.trl_internals import ROW_LOSSES, TOKEN_LOSSES


def scored_batch(trained, *, prompt_len=3, completion_len=6, padding_rows=0, env_tokens=False):
    """Rows whose ``completion_ids`` hold their own row number; row i trains ``trained[i]`` tokens."""
    n = len(trained) + padding_rows
    completion_mask = torch.zeros(n, completion_len, dtype=torch.long)
    for i, k in enumerate(trained):
        completion_mask[i, :k] = 1
    batch = {
        "prompt_ids": torch.zeros(n, prompt_len, dtype=torch.long),
        "completion_ids": torch.arange(n).unsqueeze(1).repeat(1, completion_len),
        "completion_mask": completion_mask,
        "advantages": torch.arange(n, dtype=torch.float),
        "num_items_in_batch": torch.tensor(7),
        REAL_ROW: torch.tensor([1] * len(trained) + [0] * padding_rows),
    }
    if env_tokens:  # the first trained token of each row is env text: not trained
        tool_mask = torch.ones(n, completion_len, dtype=torch.long)
        tool_mask[:, 0] = 0
        batch["tool_mask"] = tool_mask
    return batch


def one_process(tensor):
    return tensor


def plan(batch, *, steps=1, accumulation=1, budget=None, default_rows=2, gather=one_process):
    return plan_micro_steps(
        batch, steps=steps, accumulation=accumulation, budget=budget, default_rows=default_rows, gather=gather
    )


def real_rows_of(chunk):
    """The rows of ``chunk`` that train something (padding rows have an all-zero completion mask)."""
    rows = range(chunk["completion_ids"].size(0))
    return [int(chunk["completion_ids"][r, 0]) for r in rows if chunk["completion_mask"][r].any()]


@settings(max_examples=60, deadline=None)
@given(
    trained=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    padding_rows=st.integers(0, 3),
    steps_accumulation=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (3, 3)]),
    budget=st.one_of(st.none(), st.integers(1, 60)),
)
def test_every_real_row_is_trained_exactly_once_in_chunks_within_the_budget(
    trained, padding_rows, steps_accumulation, budget
):
    steps, accumulation = steps_accumulation
    batch = scored_batch(trained, padding_rows=padding_rows)
    width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    micro = plan(batch, steps=steps, accumulation=accumulation, budget=budget, default_rows=2)
    assert len(micro) == steps
    per_chunk = max(1, budget // width) if budget is not None else 2
    seen = []
    for step in micro:
        assert all(chunk["completion_ids"].size(0) <= per_chunk for chunk in step.chunks)
        assert all(REAL_ROW not in chunk for chunk in step.chunks)
        seen += [r for chunk in step.chunks for r in real_rows_of(chunk)]
    assert sorted(seen) == list(range(len(trained)))  # padding rows of the batch never trained, no row twice
    sizes = [sum(len(real_rows_of(c)) for c in step.chunks) for step in micro]
    assert max(sizes) - min(sizes) <= 1  # near-equal micro-steps


@pytest.mark.parametrize("env_tokens", [False, True])
def test_each_optimizer_step_is_normalised_by_its_own_real_rows_and_trained_tokens(env_tokens):
    trained = [1, 2, 3, 4, 5, 6, 2, 3]
    batch = scored_batch(trained, padding_rows=2, env_tokens=env_tokens)
    micro = plan(batch, steps=4, accumulation=2, budget=None, default_rows=8)
    per_row = trained_tokens(batch).tolist()
    assert per_row == [t - env_tokens for t in trained] + [0, 0]
    for window in (micro[0:2], micro[2:4]):
        rows = [r for step in window for chunk in step.chunks for r in real_rows_of(chunk)]
        assert {step.rows for step in window} == {len(rows)}
        assert {step.tokens for step in window} == {sum(per_row[r] for r in rows)}
        assert all(step.steps == 4 for step in window)
    assert micro[0].rows + micro[2].rows == len(trained)


def test_a_row_longer_than_the_budget_gets_a_chunk_of_its_own():
    micro = plan(scored_batch([6, 6, 6]), budget=1)  # 9 tokens per row > 1
    assert [chunk["completion_ids"].size(0) for chunk in micro[0].chunks] == [1, 1, 1]


def test_every_process_gets_as_many_chunks_of_the_same_sizes_and_the_step_counts_both_processes():
    """Two processes: this one has 2 real rows, the other 5 (and wider rows): the chunks follow the larger."""
    batch = scored_batch([2, 3])
    width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    other = torch.tensor([width + 3, 5, 20])  # width, rows of the one micro-step, trained tokens

    def gather(mine):
        return torch.cat([mine, other])

    (step,) = plan(batch, budget=2 * (width + 3), gather=gather)  # 2 rows of the wider process per chunk
    assert [chunk["completion_ids"].size(0) for chunk in step.chunks] == [2, 2, 1]  # 5 rows in 3 chunks
    assert sorted(r for chunk in step.chunks for r in real_rows_of(chunk)) == [0, 1]
    assert sum(int(chunk["completion_mask"].any(dim=1).sum()) for chunk in step.chunks) == 2  # the rest: padding
    assert (step.rows, step.tokens) == (2 + 5, 5 + 20)


def test_micro_steps_that_split_an_optimizer_step_are_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        plan(scored_batch([1, 2, 3]), steps=3, accumulation=2)


def trl_chunk_loss(loss_type, chunk, per_row_sum, accumulation):
    """TRL's normalisation of a chunk (as chunk_scale's docstring states it): its summed loss over its rows (row
    losses) or its trained tokens (bnpo), then over the accumulation steps."""
    rows = [int(chunk["completion_ids"][r, 0]) for r in range(chunk["completion_ids"].size(0))]
    masked = [per_row_sum[r] if chunk["completion_mask"][i].any() else 0.0 for i, r in enumerate(rows)]
    if loss_type in ROW_LOSSES:
        return sum(masked) / len(rows) / accumulation
    return sum(masked) / max(float(trained_tokens(chunk).sum()), 1.0) / accumulation


@pytest.mark.parametrize("loss_type", sorted(ROW_LOSSES | TOKEN_LOSSES))
@pytest.mark.parametrize("budget", [9, 18, 45, None])
def test_the_chunks_of_an_optimizer_step_sum_to_its_one_batch_loss_whatever_their_sizes(loss_type, budget):
    trained = [1, 2, 3, 4, 5, 6, 2]
    per_row_sum = [0.5 * (r + 1) * (-1) ** r for r in range(len(trained))]  # each row's summed loss
    batch = scored_batch(trained, padding_rows=1)
    micro = plan(batch, steps=2, accumulation=2, budget=budget, default_rows=3)
    total = sum(
        trl_chunk_loss(loss_type, chunk, per_row_sum, 2)
        * chunk_scale(loss_type, chunk, step, processes=1, accumulation=2)
        for step in micro
        for chunk in step.chunks
    )
    one_batch = sum(per_row_sum) / (len(trained) if loss_type in ROW_LOSSES else sum(trained))
    assert total == pytest.approx(one_batch, rel=1e-12)


def test_an_unknown_loss_type_is_refused_by_name():
    step = MicroStep(chunks=[], rows=1, tokens=1, steps=1)
    with pytest.raises(ValueError, match="loss_type='mystery'"):
        chunk_scale("mystery", scored_batch([1]), step, processes=1, accumulation=1)


def test_packed_chunks_count_unique_tokens_so_rows_sharing_a_prompt_fill_one_chunk():
    """30 shared prompt tokens + 2 of its own per row: 32 x 6 padded tokens, 29 + 6 x 3 unique (a fork costs one)."""
    batch = scored_batch([2] * 6, prompt_len=30)
    width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    assert 60 // width == 1  # the padded count: one row per chunk
    (step,) = plan_micro_steps(batch, steps=1, accumulation=1, budget=60, default_rows=2, gather=one_process,
                               packed=True)  # fmt: skip
    assert [chunk["completion_ids"].size(0) for chunk in step.chunks] == [6]
    assert sorted(real_rows_of(step.chunks[0])) == list(range(6))
    (step,) = plan_micro_steps(batch, steps=1, accumulation=1, budget=40, default_rows=2, gather=one_process,
                               packed=True)  # fmt: skip
    assert [chunk["completion_ids"].size(0) for chunk in step.chunks] == [3, 3]  # 29 + 3 x 3 <= 40 < 29 + 4 x 3


def test_packed_chunks_are_as_many_and_as_large_on_every_process_padded_with_the_chunks_own_first_row():
    batch = scored_batch([2] * 4, prompt_len=30)

    def gather(mine):  # the other process dealt its 4 rows as 1 + 3
        return torch.cat([mine, torch.tensor([1, 3, 0, 0])]) if mine.numel() == 4 else torch.cat([mine, mine])

    (step,) = plan_micro_steps(batch, steps=1, accumulation=1, budget=38, default_rows=2, gather=gather,
                               packed=True)  # fmt: skip
    assert [chunk["completion_ids"].size(0) for chunk in step.chunks] == [3, 3]  # this one dealt 3 + 1
    second = step.chunks[1]
    assert len(real_rows_of(second)) == 1
    assert (second["completion_ids"] == second["completion_ids"][0]).all()  # padding copies the chunk's own row
