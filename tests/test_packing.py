"""Prefix-shared packed forwards (trl_env.train.packing) give every row the per-token logprobs of its own padded
forward, and EpisodeGRPOTrainer(packing=True) the loss and gradient of the unpacked step, for every loss type."""

from __future__ import annotations

import copy

import pytest
import torch
from history_support import NumberedTalkEnv, ReplyGenerator, thinking_tokenizer, thinks_by_episode
from trl.trainer.utils import add_fused_lm_head

from trl_env import ConfigError, env_reward, make_rollout_func
from trl_env.render.processors import from_tokenizer
from trl_env.train.episode_trainer import EpisodeGRPOTrainer
from trl_env.train.packing import (
    pack_rows,
    packed_logps,
    packing_enabled,
    pair_weight_of,
    unique_tokens,
    unpackable_reason,
)

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "sapo", "luspo", "cispo", "vespo"]


def padded(rows, pad_id):
    """TRL's layout of (prompt, completion) rows: prompts left-padded, completions right-padded."""
    width_p = max(len(p) for p, _ in rows)
    width_c = max(len(c) for _, c in rows)
    ids = torch.full((len(rows), width_p + width_c), pad_id)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p)
        ids[i, width_p : width_p + len(c)] = torch.tensor(c)
        mask[i, width_p - len(p) : width_p + len(c)] = 1
    return ids, mask, width_c


def unpacked(model, ids, mask, keep):
    """Per-token logprobs and entropies exactly as GRPOTrainer._get_per_token_logps_and_entropies computes them."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def random_ids(generator, vocab, n):
    return torch.randint(10, vocab, (n,), generator=generator).tolist()


def group_rows(vocab):
    """Two prompts sharing a 60-token system prompt, 4 completions each (two sharing their first tokens)."""
    g = torch.Generator().manual_seed(0)
    system = random_ids(g, vocab, 60)
    rows = []
    for _ in range(2):
        prompt = system + random_ids(g, vocab, 6)
        first = random_ids(g, vocab, 5)
        rows.append((prompt, first))
        rows.append((prompt, first[:3] + random_ids(g, vocab, 4)))
        rows += [(prompt, random_ids(g, vocab, n)) for n in (2, 9)]
    return rows


def deployed_rows(tokenizer):
    """Rows of deployed-history episodes under Qwen 3's template: each row's prompt extends the conversation."""
    tok = thinking_tokenizer(tokenizer)
    rows = []
    for episode in range(2):
        messages = [{"role": "system", "content": "You play a counting game. " * 8}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"Episode {episode} turn {turn}: say a number."})
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            reply = f"<think>\nturn {turn}\n</think>\n\n{turn + episode}"
            completion = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append((prompt, completion))
            messages.append({"role": "assistant", "content": str(turn + episode)})
    return tok, rows


@pytest.fixture
def fused(model):
    model.config._attn_implementation = "sdpa"
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    return model


@pytest.mark.parametrize("workload", ["groups", "deployed", "nothing_shared"])
def test_packed_logprobs_equal_each_rows_unpacked_forward(fused, tokenizer, workload):
    vocab = fused.config.vocab_size
    if workload == "groups":
        rows = group_rows(vocab)
    elif workload == "deployed":
        tokenizer, rows = deployed_rows(tokenizer)
    else:
        g = torch.Generator().manual_seed(1)
        rows = [(random_ids(g, vocab, 5 + i), random_ids(g, vocab, 3 + 2 * i)) for i in range(5)]
    ids, mask, keep = padded(rows, tokenizer.pad_token_id)
    packed = pack_rows(ids, mask, keep, tokenizer.pad_token_id, pair_weight=pair_weight_of(fused))
    assert packed is not None
    logps, entropies = packed_logps(fused, packed, compute_entropy=True)
    expected_logps, expected_entropies = unpacked(fused, ids, mask, keep)
    torch.testing.assert_close(logps, expected_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropies, expected_entropies, rtol=0, atol=1e-5)
    assert bool((logps[mask[:, -keep:] == 1] != 0).all()), "every completion token got its logprob"
    row_tokens = sum(len(p) + len(c) for p, c in rows)
    assert packed.stats.row_tokens == row_tokens
    assert packed.stats.unique_tokens == unique_tokens([p + c for p, c in rows])
    if workload == "nothing_shared":
        assert packed.stats.unique_tokens == row_tokens
    else:
        assert packed.stats.ratio > 2.0, packed.stats
        assert packed.stats.forwarded_positions <= 1.05 * packed.stats.unique_tokens


def test_packed_gradient_equals_unpacked(fused, tokenizer):
    rows = group_rows(fused.config.vocab_size)
    ids, mask, keep = padded(rows, tokenizer.pad_token_id)
    weights = torch.randn(ids.size(0), keep, generator=torch.Generator().manual_seed(2))
    packed = pack_rows(ids, mask, keep, tokenizer.pad_token_id)
    (packed_logps(fused, packed)[0] * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in fused.named_parameters()}
    fused.zero_grad()
    (unpacked(fused, ids, mask, keep)[0] * weights).sum().backward()
    for name, p in fused.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_rows_sharing_nothing_run_as_the_models_own_causal_chains(tokenizer):
    g = torch.Generator().manual_seed(3)
    rows = [(random_ids(g, 500, 8), random_ids(g, 500, 4)) for _ in range(3)]
    ids, mask, keep = padded(rows, tokenizer.pad_token_id)
    packed = pack_rows(ids, mask, keep, tokenizer.pad_token_id)
    assert packed.attention_mask.ndim == 2 and packed.input_ids.shape == (3, 12)
    assert packed.stats.padding_fraction == 0.0


def test_a_row_with_a_hole_in_its_mask_is_not_packed(tokenizer):
    ids = torch.arange(12).view(2, 6) + 10
    mask = torch.ones_like(ids)
    mask[0, 2] = 0
    assert pack_rows(ids, mask, 3, tokenizer.pad_token_id) is None


def test_models_whose_attention_cannot_take_the_ancestor_mask_are_refused_by_name(model):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=16)  # fmt: skip
    mistral = MistralForCausalLM(config)
    assert "MistralForCausalLM uses sliding-window attention" in unpackable_reason(mistral)
    with pytest.raises(ConfigError, match=r"packing=True: MistralForCausalLM uses sliding-window .*if_supported"):
        packing_enabled(mistral, True)
    with pytest.warns(UserWarning, match="training with padded rows"):
        assert packing_enabled(mistral, "if_supported") is False
    model.config._attn_implementation = "flash_attention_2"
    assert "Qwen2ForCausalLM runs attn_implementation='flash_attention_2'" in unpackable_reason(model)
    model.config._attn_implementation = "sdpa"
    model.config.layer_types = ["full_attention", "sliding_attention"]
    assert "sliding_attention layers" in unpackable_reason(model)
    with pytest.raises(ConfigError, match="packing="):
        packing_enabled(model, "yes")


def config(tmp_path, **settings):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, steps_per_generation=2,
                gradient_accumulation_steps=2, num_generations=4, max_completion_length=128, max_steps=1,
                max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
                seed=0)  # fmt: skip
    return GRPOConfig(**(base | settings))


def deployed_func(tok):
    NumberedTalkEnv.count = 1
    processor = from_tokenizer(tok)
    gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
    return make_rollout_func(NumberedTalkEnv, processor, history="deployed", generator=gen, max_turns=3)


class Recording(EpisodeGRPOTrainer):
    """Keeps the scored batches, each micro-step's loss and the first optimizer step's gradients."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.scored.append(out)
        return out

    def _prepare_inputs(self, generation_batch):
        step = super()._prepare_inputs(generation_batch)
        self.chunks += [(c["completion_ids"].size(0), c["prompt_ids"].size(1) + c["completion_ids"].size(1))
                        for c in step.chunks]  # fmt: skip
        return step

    def training_step(self, model, inputs, num_items_in_batch):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses.append(loss.item())
        return loss


def grads_callback(store):
    from transformers import TrainerCallback

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if not store:
                store.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    return Grads()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_packed_step_trains_the_unpacked_steps_loss_and_gradient(tmp_path, model, tokenizer, loss_type):
    """Deployed rows (Qwen 3 thinking template), steps_per_generation=2, gradient_accumulation_steps=2, micro-batches:
    the packed step's loss and gradient equal TRL's loss of the same rows, unpacked, in one batch."""
    from datasets import Dataset
    from trl import GRPOTrainer

    tok = thinking_tokenizer(tokenizer)
    model.config._attn_implementation = "sdpa"
    reference_model = copy.deepcopy(model)
    grads: dict[str, torch.Tensor] = {}
    trainer = Recording(model=model, reward_funcs=env_reward, args=config(tmp_path, loss_type=loss_type),
                        processing_class=tok, train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                        rollout_func=deployed_func(tok), callbacks=[grads_callback(grads)],
                        max_micro_batch_tokens=300, packing=True)  # fmt: skip
    trainer.scored, trainer.losses, trainer.chunks = [], [], []
    trainer.train()
    assert len(trainer.losses) == 2
    assert any(rows > 300 // width for rows, width in trainer.chunks), (
        "max_micro_batch_tokens counts unique tokens: shared prefixes let more rows into a chunk than rows x width"
    )
    (logged,) = [entry for entry in trainer.state.log_history if "packing/ratio" in entry]
    assert logged["packing/ratio"] > 1.0, "the loss forwards ran packed, sharing prefixes"

    reference = EpisodeGRPOTrainer(model=reference_model, reward_funcs=env_reward, processing_class=tok,
                                   args=config(tmp_path, loss_type=loss_type, per_device_train_batch_size=4,
                                               steps_per_generation=1, gradient_accumulation_steps=1),
                                   train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                                   rollout_func=deployed_func(tok))  # fmt: skip
    reference.current_gradient_accumulation_steps = 1
    reference.model.train()
    (batch,) = trainer.scored
    real = int(batch["trl_env_real_row"].sum())
    rows = {k: v[:real] if isinstance(v, torch.Tensor) and v.ndim else v for k, v in batch.items()}
    rows.pop("trl_env_real_row")
    expected = GRPOTrainer._compute_loss(reference, reference.model, rows)
    expected.backward()
    assert sum(trainer.losses) == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    for name, p in reference.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


class StandIn:
    """What trainer_packed_logps reads of a trainer: its tokenizer, accelerator (autocast) and metrics."""

    def __init__(self, tokenizer):
        import contextlib
        from collections import defaultdict
        from types import SimpleNamespace

        self._tokenizer = tokenizer
        self.accelerator = SimpleNamespace(autocast=contextlib.nullcontext)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}


def test_a_batch_whose_trie_saves_almost_nothing_takes_the_padded_forward(fused, tokenizer):
    """Unique tokens >= PACK_BELOW x row tokens: the caller's padded forward (None), the ratio still logged."""
    from trl_env.train.packing import PACK_BELOW, trainer_packed_logps

    vocab = fused.config.vocab_size
    g = torch.Generator().manual_seed(4)
    nothing = [(random_ids(g, vocab, 9 + i), random_ids(g, vocab, 4 + i)) for i in range(6)]
    nothing[1] = (nothing[0][0][:2] + nothing[1][0][2:], nothing[1][1])  # two rows share their first two tokens
    ids, mask, keep = padded(nothing, tokenizer.pad_token_id)
    row_tokens = int(mask.sum())
    assert unique_tokens([p + c for p, c in nothing]) >= PACK_BELOW * row_tokens
    trainer = StandIn(tokenizer)
    fused.train()
    assert trainer_packed_logps(trainer, fused, ids, mask, keep, batch_size=3) is None
    logged = trainer._metrics["train"]
    assert logged["packing/ratio"] == [pytest.approx(row_tokens / (row_tokens - 1))]
    assert logged["packing/padding_fraction"] == [pytest.approx(1 - row_tokens / ids.numel())]

    ids, mask, keep = padded(group_rows(vocab), tokenizer.pad_token_id)
    logps, _ = trainer_packed_logps(trainer, fused, ids, mask, keep, batch_size=4)
    torch.testing.assert_close(logps, unpacked(fused, ids, mask, keep)[0], rtol=0, atol=1e-5)
    assert logged["packing/ratio"][-1] > 2.0


@pytest.mark.parametrize("workload", ["agent", "selfplay"])
def test_bench_packings_agent_and_selfplay_rows_share_their_prefixes_and_pack_exactly(fused, tokenizer, workload):
    """benchmarks/bench_packing.py's (c) agent calls with tool schemas and (d) two-seat self-play rows: each row's
    prompt extends its conversation's previous one, and their packed logprobs equal the padded forward's."""
    import importlib.util

    from helpers import BENCH

    spec = importlib.util.spec_from_file_location("bench_packing", BENCH / "bench_packing.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.rows_of(workload, copy.deepcopy(tokenizer), fused.config.vocab_size)
    assert len(rows) == (48 if workload == "agent" else 64)
    per_conversation, offset = (6, 0) if workload == "agent" else (8, 2)  # self-play: a seat's turns alternate
    first, later = rows[0], rows[offset or per_conversation - 1]
    assert later[0][: len(first[0])] == first[0] and len(later[0]) > len(first[0]) + 10  # the conversation extends
    text = tokenizer.decode(first[0])
    assert ("<tools>" in text and "search_files" in text) if workload == "agent" else "player 1" in text
    ids, mask, keep = padded(rows[:8], tokenizer.pad_token_id)
    packed = pack_rows(ids, mask, keep, tokenizer.pad_token_id, pair_weight=pair_weight_of(fused))
    assert packed.stats.ratio > 2.0, packed.stats
    torch.testing.assert_close(packed_logps(fused, packed)[0], unpacked(fused, ids, mask, keep)[0], rtol=0, atol=1e-5)
