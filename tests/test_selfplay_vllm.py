"""Issue 34's acceptance run: two real EpisodeGRPOTrainer steps of self-play (both seats of a game played by the
policy, credit="per_role"), every turn sampled by the REAL vLLM CPU server, and every row of every seat checked token
by token against what the server answered and against what the trainer trained."""

from __future__ import annotations

import collections

from async_support import Recorder
from seat_games import SecretNim

from trl_env import VLLMServerGenerator, env_reward, make_rollout_func
from trl_env.render.processors import from_tokenizer
from trl_env.seats import POLICY, Seating
from trl_env.train.episode_trainer import EpisodeGRPOTrainer


class Recording(EpisodeGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.recorded.append(out)
        return out


def trained_rows(out):
    """The trainer's rows with a trained token: (prompt ids, completion ids, completion mask), padding removed."""
    rows = []
    for i in range(out["completion_ids"].size(0)):
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        n = int(out["completion_mask"][i].nonzero().max()) + 1 if out["completion_mask"][i].any() else 0
        if n:
            rows.append((tuple(prompt), tuple(out["completion_ids"][i][:n].tolist())))
    return rows


def test_two_real_self_play_steps_every_seat_row_is_what_the_server_answered(vllm_server, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    url, model_dir = vllm_server.base_url, vllm_server.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    recorder = Recorder()
    gen = VLLMServerGenerator(url, model=model_dir, post=recorder, temperature=1.0)
    func = make_rollout_func(Seating(SecretNim, (POLICY, POLICY)), from_tokenizer(tok), credit="per_role",
                             generator=gen, max_turns=4, max_new_tokens=6, parse_truncated_turns=True)  # fmt: skip
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=2,
                      max_completion_length=256, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                      bf16=False, seed=0)  # fmt: skip
    trainer = Recording(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=env_reward, args=args,
                        processing_class=tok, rollout_func=func,
                        train_dataset=Dataset.from_dict({"prompt": ["5", "6"] * 8}))  # fmt: skip
    trainer.recorded = []
    trainer.train()

    assert sum("loss" in h for h in trainer.state.log_history) == 2 and len(seen) == 2
    answered, _ = recorder.answered()
    checked = collections.Counter()
    for batch, out in zip(seen, trainer.recorded, strict=True):
        assert [r.info["seat"] for r in batch] == [0, 1] * 4  # every game: both seats, each the policy's episode
        assert all(r.ending.value != "error" for r in batch), [r.error for r in batch]
        for r in batch:
            for row, spans in r.spans():
                for span in spans:  # each model turn: exactly the server's answer to exactly this context
                    context = tuple(row.prompt_ids + row.completion_ids[: span.model.start])
                    sampled = (row.completion_ids[span.model], row.logprobs[span.model])
                    assert sampled in [(ids, lps) for ids, lps, _ in answered[context]], (r.info, span)
                    assert row.env_mask[span.model] == [1] * len(sampled[0]) and not any(row.env_mask[span.env])
                    checked[r.info["seat"]] += 1
        expected = [(tuple(row.prompt_ids), tuple(row.completion_ids)) for r in batch for row in r.rows]
        assert trained_rows(out) == expected  # the trainer trained these rows, in this order, nothing else
    assert checked[0] >= 8 * 2 and checked[1] >= 8 * 1, checked  # several turns per seat in both steps
    # per-role credit reached the loss: a step has a non-zero advantage exactly when, in one of its groups (one seed,
    # 2 games), a seat's outcome differs between the games (the same outcome twice gives that role no signal)
    logged = [h["credit/advantage_abs_mean"] for h in trainer.state.log_history if "credit/advantage_abs_mean" in h]
    assert len(logged) == 2, trainer.state.log_history
    for batch, advantage in zip(seen, logged, strict=True):
        varied = any(len({r.reward for r in batch[g : g + 4] if r.info["seat"] == seat}) > 1
                     for g in (0, 4) for seat in (0, 1))  # fmt: skip
        assert (advantage > 0) == varied, ([(r.info["seat"], r.reward) for r in batch], advantage)
