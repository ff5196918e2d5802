"""The in-process backend on a real (tiny) model: processed logprobs, token-exact prefixes, per-row budgets."""

from __future__ import annotations

import torch
from helpers import GuessEnv, SpyGenerator, assert_token_exact

from trl_env import Budgets, ChatMLProcessor, FinishReason, GenerationRequest, TransformersGenerator, batch_rollout


def recomputed_logprobs(model, rollout, temperature, top_k=0):
    """The trainer's view: log-softmax(logits / T) of the returned sequence, at each completion token."""
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(rollout.prompt_ids) - 1 : -1].float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    target = torch.tensor(rollout.completion_ids).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, target).squeeze(-1)


def run(model, tokenizer, seeds, **sampling):
    torch.manual_seed(0)
    generator = SpyGenerator(TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id, **sampling))
    rollouts = batch_rollout(
        seeds,
        GuessEnv,
        ChatMLProcessor(),
        tokenizer,
        generator,
        budgets=Budgets(max_turns=4, max_new_tokens=6, max_completion_tokens=200),
        parse_truncated_turns=True,
    )
    return rollouts, generator


def test_logprobs_equal_the_models_recomputed_log_softmax_at_the_sampling_temperature(model, tokenizer, guess_env):
    rollouts, _ = run(model, tokenizer, [str(i % 10) for i in range(12)], temperature=0.7)
    checked = 0
    for r in rollouts:
        mask = torch.tensor(r.env_mask, dtype=torch.bool)
        mine = torch.tensor(r.logprobs)[mask]
        assert torch.allclose(mine, recomputed_logprobs(model, r, 0.7)[mask], atol=1e-4, rtol=0)
        assert not torch.allclose(mine, recomputed_logprobs(model, r, 1.0)[mask], atol=1e-3)  # temperature applied
        checked += int(mask.sum())
    assert checked > 100


def test_logprobs_are_the_processed_ones_under_top_k(model, tokenizer, guess_env):
    rollouts, _ = run(model, tokenizer, ["1", "2", "3", "4"], temperature=1.0, top_k=5)
    for r in rollouts:
        mask = torch.tensor(r.env_mask, dtype=torch.bool)
        assert torch.allclose(
            torch.tensor(r.logprobs)[mask], recomputed_logprobs(model, r, 1.0, top_k=5)[mask], atol=1e-4, rtol=0
        )


def test_every_request_is_the_trajectory_prefix_on_a_real_model(model, tokenizer, guess_env):
    rollouts, spy = run(model, tokenizer, [str(i % 10) for i in range(16)], temperature=1.0)
    assert assert_token_exact(rollouts, spy.requests, spy.outputs) >= 40
    assert max(len(r.turns) for r in rollouts) >= 3


def test_each_row_keeps_its_own_budget_and_stops_at_its_stop_id(model, tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    generator = TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id)
    requests = [GenerationRequest(prompt, n, (stop,)) for n in (1, 3, 17)]
    results = [f.result() for f in generator.submit(requests)]
    for request, result in zip(requests, results, strict=False):
        assert 1 <= len(result.token_ids) == len(result.logprobs) <= request.max_tokens
        assert (result.finish_reason is FinishReason.STOP) == (result.token_ids[-1] == stop)
        assert stop not in result.token_ids[:-1]
    assert generator.context_limit == model.config.max_position_embeddings
