"""history="deployed" rows go to the optimizer in token-bounded micro-batches, each normalised as one batch of the
optimizer step's rows: real steps with steps_per_generation and gradient_accumulation_steps > 1, for every loss type,
against TRL's own loss of the same rows in one micro-batch; and two processes (torchrun, gloo)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import NO_TORCHRUN, run_two_processes
from history_support import FlakyTalkEnv, NumberedTalkEnv, ReplyGenerator, thinking_tokenizer, thinks_by_episode

from trl_env import ConfigError, env_reward, make_rollout_func
from trl_env.render.processors import from_tokenizer
from trl_env.train.episode_trainer import EpisodeGRPOTrainer

pytestmark = pytest.mark.slow  # GRPO steps with the tiny model and a two-process torchrun run

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "sapo", "luspo", "cispo", "vespo"]
BUDGET = 300  # tokens per micro-batch: rows x padded length


def config(tmp_path, **settings):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, steps_per_generation=2,
                gradient_accumulation_steps=2, num_generations=4, max_completion_length=128, max_steps=1,
                max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
                seed=0)  # fmt: skip
    return GRPOConfig(**(base | settings))


class Recording(EpisodeGRPOTrainer):
    """Keeps the scored batches, each micro-step's loss and the first optimizer step's gradients."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.scored.append(out)
        return out

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


def deployed_func(tok):
    FlakyTalkEnv.count = 1  # NumberedTalkEnv numbers its instances here: envs 2 to 5 give 3 + 1 + 2 + 1 rows (5 fails)
    processor = from_tokenizer(tok)
    gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
    return make_rollout_func(NumberedTalkEnv, processor, history="deployed", generator=gen, max_turns=3)


def real_rows(batch, n):
    """The first ``n`` rows of a scored batch (today's padding rows came last), scalars kept."""
    return {k: v[:n] if isinstance(v, torch.Tensor) and v.ndim else v for k, v in batch.items()}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_deployed_rows_train_in_budgeted_micro_batches_with_the_one_batch_loss_and_gradient(
    tmp_path, model, tokenizer, loss_type
):
    """steps_per_generation=2, gradient_accumulation_steps=2: every forward with a gradient holds at most BUDGET
    tokens, and the optimizer step's loss and gradient are TRL's for its rows as one micro-batch (no padding)."""
    from datasets import Dataset

    tok = thinking_tokenizer(tokenizer)
    func = deployed_func(tok)
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    reference_model = copy.deepcopy(model)
    forwards, grads = [], {}
    model.register_forward_pre_hook(
        lambda _m, args, kwargs: forwards.append(tuple(kwargs["input_ids"].shape)) if torch.is_grad_enabled() else None,
        with_kwargs=True,
    )
    trainer = Recording(model=model, reward_funcs=env_reward, args=config(tmp_path, loss_type=loss_type),
                        processing_class=tok, train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                        rollout_func=func, callbacks=[grads_callback(grads)],
                        max_micro_batch_tokens=BUDGET)  # fmt: skip
    trainer.scored, trainer.losses = [], []
    trainer.train()
    (episodes,) = seen
    rows = sum(len(r.rows) for r in episodes)
    assert rows % 2 and rows > 4, "episodes split into an odd number of rows: 2 micro-steps cannot share them evenly"
    assert len(trainer.losses) == 2
    assert max(r * w for r, w in forwards) <= BUDGET, forwards
    assert len(forwards) > 2, "the budget split a micro-step"

    reference = EpisodeGRPOTrainer(model=reference_model, reward_funcs=env_reward, processing_class=tok,
                                   args=config(tmp_path, loss_type=loss_type, per_device_train_batch_size=4,
                                               steps_per_generation=1, gradient_accumulation_steps=1),
                                   train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                                   rollout_func=deployed_func(tok))  # fmt: skip
    reference.current_gradient_accumulation_steps = 1
    reference.model.train()
    from trl import GRPOTrainer

    (batch,) = trainer.scored
    expected = GRPOTrainer._compute_loss(reference, reference.model, real_rows(batch, rows))
    expected.backward()
    assert sum(trainer.losses) == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    for name, p in reference.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("settings", "kwargs", "message"),
    [
        (dict(steps_per_generation=2, gradient_accumulation_steps=4, per_device_train_batch_size=4), {},
         r"steps_per_generation=2 and gradient_accumulation_steps=4: .* multiple of gradient_accumulation_steps"),
        (dict(entropy_coef=0.01), {}, r"with the entropy bonus \(entropy_coef\): .* use history='sampled'"),
        ({}, dict(max_micro_batch_tokens=0), r"max_micro_batch_tokens=0: expected a positive number"),
    ],
)  # fmt: skip
def test_deployed_rows_refuse_what_micro_batches_cannot_normalise_as_one_batch(
    tmp_path, model, tokenizer, settings, kwargs, message
):
    from datasets import Dataset

    tok = thinking_tokenizer(tokenizer)
    with pytest.raises(ConfigError, match=message):
        EpisodeGRPOTrainer(model=model, reward_funcs=env_reward, args=config(tmp_path, **settings),
                           processing_class=tok, train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                           rollout_func=deployed_func(tok), **kwargs)  # fmt: skip


@pytest.mark.skipif(NO_TORCHRUN, reason="no torchrun")
def test_two_processes_train_deployed_rows_each_row_once_with_the_whole_steps_denominators(tmp_path, monkeypatch):
    """Groups of 8 split 4 + 4 over two processes, whose rows differ in number: each process trains each of its rows
    once, padding rows nowhere, and every micro-batch divides by the rows and tokens of both processes' step."""
    monkeypatch.setenv("TRL_ENV_TEST_HISTORY", "deployed")
    result = run_two_processes(tmp_path)
    assert result["num_processes"] == 2
    steps = [h for h in result["log_history"] if "episodes" in h]
    assert len(steps) == 2 and all(h["episodes"] == 8 for h in steps)  # each episode once, both processes'
    ranks = [json.loads((tmp_path / f"log.json.rank{r}.json").read_text()) for r in (0, 1)]
    assert any(a["rows"] != b["rows"] for a, b in zip(*ranks, strict=True)), ranks  # rows per process differ
    for a, b in zip(*ranks, strict=True):
        assert a["trained"] == a["rows"] and b["trained"] == b["rows"]  # each real row in exactly one chunk
        assert a["denominators"] == b["denominators"] == [[a["rows"] + b["rows"], a["tokens"] + b["tokens"]]] * 2


def test_deployed_rows_evaluate_in_budgeted_micro_batches_with_the_one_batch_loss(tmp_path, model, tokenizer):
    """Evaluation (no accumulation): every forward holds at most BUDGET tokens, the loss is TRL's of all rows."""
    from datasets import Dataset
    from trl import GRPOTrainer

    tok = thinking_tokenizer(tokenizer)
    forwards = []
    model.register_forward_pre_hook(lambda _m, args, kwargs: forwards.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)  # fmt: skip
    settings = dict(loss_type="grpo", per_device_eval_batch_size=4, num_generations_eval=4)
    trainer = Recording(model=model, reward_funcs=env_reward, processing_class=tok, args=config(tmp_path, **settings),
                        train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 2}),
                        eval_dataset=Dataset.from_dict({"prompt": ["1"]}), rollout_func=deployed_func(tok),
                        max_micro_batch_tokens=BUDGET)  # fmt: skip
    trainer.scored, trainer.losses = [], []
    loss = trainer.evaluate()["eval_loss"]
    (batch,) = trainer.scored
    assert batch["completion_ids"].size(0) > 4 and len(forwards) > 1
    assert max(r * w for r, w in forwards) <= BUDGET, forwards
    trainer.model.eval()
    with torch.no_grad():
        expected = GRPOTrainer._compute_loss(trainer, trainer.model, batch).item()
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
