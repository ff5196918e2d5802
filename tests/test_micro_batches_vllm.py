"""Issue 32 item 3's acceptance run: four real EpisodeGRPOTrainer steps, history="deployed", credit="gigpo",
steps_per_generation=2 and gradient_accumulation_steps=2, every turn sampled by the REAL vLLM CPU server."""

from __future__ import annotations

import collections

import torch
from async_support import THINK_END_BIAS, Recorder
from history_support import FlakyTalkEnv, thinking_tokenizer

from trl_env import VLLMServerGenerator, env_reward, make_rollout_func
from trl_env.render.processors import from_tokenizer
from trl_env.train.episode_trainer import EpisodeGRPOTrainer

BUDGET = 240  # tokens per micro-batch (rows x padded length): a micro-step's rows take several


class Planned(EpisodeGRPOTrainer):
    """Keeps every generation batch's micro-steps (``_row_steps``) as they are planned."""

    def _prepare_inputs(self, generation_batch):
        before = self._row_steps
        out = super()._prepare_inputs(generation_batch)
        if self._row_steps is not before:
            self.plans.append(self._row_steps)
        return out


def row_key(chunk, i):
    """A trained row as (its prompt ids, its completion ids), padding removed."""
    prompt = chunk["prompt_ids"][i][chunk["prompt_mask"][i].bool()].tolist()
    completion = chunk["completion_ids"][i][: int(chunk["completion_mask"][i].sum())].tolist()
    return tuple(prompt), tuple(completion)


def test_four_real_steps_deployed_gigpo_against_vllm_every_sampled_token_trained_once_within_the_budget(
    vllm_server, tmp_path
):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tok = thinking_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    recorder = Recorder()
    think_end = tok.convert_tokens_to_ids("</think>")
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0,
                              extra_body={"logit_bias": {str(think_end): THINK_END_BIAS}})  # fmt: skip
    func = make_rollout_func(FlakyTalkEnv, from_tokenizer(tok), history="deployed", credit="gigpo", generator=gen,
                             max_turns=3, max_new_tokens=8, parse_truncated_turns=True)  # fmt: skip
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    forwards = []
    model.register_forward_pre_hook(
        lambda _m, args, kwargs: forwards.append(tuple(kwargs["input_ids"].shape)) if torch.is_grad_enabled() else None,
        with_kwargs=True,
    )
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, steps_per_generation=2,
                      gradient_accumulation_steps=2, num_generations=4, max_completion_length=128, max_steps=4,
                      logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = Planned(model=model, reward_funcs=env_reward, args=args, processing_class=tok, rollout_func=func,
                      train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                      max_micro_batch_tokens=BUDGET)  # fmt: skip
    trainer.plans = []
    trainer.train()

    assert sum("loss" in h for h in trainer.state.log_history) == 4
    assert len(seen) == len(trainer.plans) == 4  # one generation batch per optimizer step
    episodes = [r for batch in seen for r in batch]
    assert sum(len(r.rows) for r in episodes) > len(episodes), "the template dropped earlier reasoning"
    contexts = {tuple(row.prompt_ids + row.completion_ids[:k]) for r in episodes for row in r.rows
                for k in range(len(row.completion_ids) + 1)}  # fmt: skip
    _, sent = recorder.answered()
    assert len(sent) >= 4 * 4 and all(tuple(prompt) in contexts for _, _, prompt in sent)  # every request a context
    for batch, plan in zip(seen, trainer.plans, strict=True):  # each step: every row, every sampled token, once
        chunks = [c for step in plan for c in step.chunks]
        trained = collections.Counter(row_key(c, i) for c in chunks for i in range(c["completion_ids"].size(0))
                                      if c["completion_mask"][i].any())  # fmt: skip
        expected = collections.Counter(
            (tuple(row.prompt_ids), tuple(row.completion_ids)) for r in batch for row in r.rows
        )
        assert trained == expected
        model_tokens = sum(t.num_model_tokens for r in batch if r.ending.value != "error" for t in r.turns)
        mask_sum = sum(int((c["completion_mask"] * c["tool_mask"]).sum()) for c in chunks)
        assert mask_sum == model_tokens
        assert all(step.tokens == model_tokens and step.rows == sum(len(r.rows) for r in batch) for step in plan)
    assert max(r * w for r, w in forwards) <= BUDGET, forwards  # the peak micro-batch
    assert len(forwards) > 4 * 2, "the budget split micro-steps"
