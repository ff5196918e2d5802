"""EpisodeGRPOTrainer: several rows per episode, group statistics per episode, real GRPOTrainer steps in both modes."""

from __future__ import annotations

import statistics

import pytest
import torch
from helpers import SpyGenerator, train_grpo
from history_support import (
    FlakyTalkEnv,
    NumberedTalkEnv,
    ReplyGenerator,
    none_for_short,
    thinking_tokenizer,
    thinks_by_episode,
    turns_reward,
)

from trl_env import make_rollout_func
from trl_env.errors import ConfigError
from trl_env.render.processors import from_tokenizer
from trl_env.train.episode_trainer import EpisodeGRPOTrainer, episode_advantages

NAN = float("nan")


def hand_advantages(rewards_per_func, group):
    """TRL's sum_then_normalize with scale_rewards='group', by hand: sum the non-None rewards, drop all-None rows."""
    totals = [None if all(v != v for v in row) else sum(v for v in row if v == v) for row in rewards_per_func]
    out = []
    for g in range(0, len(totals), group):
        kept = [t for t in totals[g : g + group] if t is not None]
        mean = statistics.fmean(kept) if kept else NAN
        std = statistics.stdev(kept) if len(kept) > 1 else NAN
        for t in totals[g : g + group]:
            adv = NAN if t is None else (t - mean) / (std + 1e-4)
            out.append(0.0 if adv != adv else adv)
    return out


@pytest.mark.parametrize("funcs", [1, 2, 3])
def test_episode_advantages_match_a_hand_computation(funcs):
    table = [
        [1.0, 0.5, NAN], [0.0, NAN, 2.0], [NAN, NAN, NAN], [1.0, 1.0, 1.0],  # group 1: one failed episode
        [0.2, 0.0, NAN], [NAN, NAN, NAN], [NAN, NAN, NAN], [0.7, 3.0, 0.0],  # group 2: two failed
        [NAN, NAN, NAN], [NAN, NAN, NAN], [0.3, NAN, NAN], [NAN, NAN, NAN],  # group 3: one scored -> all 0
    ]  # fmt: skip
    rows = [r[:funcs] for r in table]
    rewards = torch.tensor(rows)
    advantages, _ = episode_advantages(rewards, torch.ones(funcs), 4)
    assert advantages.tolist() == pytest.approx(hand_advantages(rows, 4), abs=1e-5)


class Recording(EpisodeGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.recorded.append(out)
        return out


@pytest.mark.parametrize("funcs", [1, 2, 3])
def test_trainer_rows_share_their_episode_advantage_from_per_episode_group_statistics(
    tmp_path, model, tokenizer, funcs
):
    from datasets import Dataset
    from trl import GRPOConfig

    from trl_env import env_reward

    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    # a thinking turn is rewritten later, so episodes have 1 to 3 rows, whatever order they run in
    gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
    func = make_rollout_func(NumberedTalkEnv, processor, history="deployed", generator=gen, max_turns=3, env_workers=2)
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=128, max_steps=1, logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = Recording(model=model, reward_funcs=[env_reward, turns_reward, none_for_short][:funcs], args=args,
                        processing_class=tok, train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                        rollout_func=func)  # fmt: skip
    trainer.recorded = []
    trainer.train()
    (out,) = trainer.recorded
    (episodes,) = seen
    assert any(r.ending.value == "error" for r in episodes), "the flaky env fails some episodes"
    assert len({len(r.rows) for r in episodes if r.ending.value != "error"}) > 1, "rows per episode vary"
    table = []
    for r in episodes:
        failed = r.ending.value == "error"
        values = [NAN if failed else r.reward, NAN if failed else len(r.turns) / 3]
        text = tok.decode([t for row in r.rows for t in row.completion_ids], skip_special_tokens=True)
        values.append(NAN if failed or len(r.turns) < 3 else float(len(text)) % 2)
        table.append(values[:funcs])
    expected = hand_advantages(table, 4)
    episode_of_row = [e for e, r in enumerate(episodes) for _ in r.rows]
    assert out["completion_ids"].size(0) == len(episode_of_row)
    assert out["advantages"].tolist() == pytest.approx([expected[e] for e in episode_of_row], abs=1e-4)
    for i, e in enumerate(episode_of_row):  # failed episodes' rows are masked out of the loss
        if episodes[e].ending.value == "error":
            assert (out["tool_mask"][i] * out["completion_mask"][i]).sum() == 0


@pytest.mark.parametrize("history", ["sampled", "deployed"])
def test_two_real_grpo_steps_in_both_modes_with_a_thinking_template(tmp_path, model, tokenizer, history, monkeypatch):
    """The tiny model samples every turn; every request the generator got is a row's context at one of its turns."""
    import trl

    from trl_env.backends.transformers import TransformersGenerator

    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    spies = []

    def generator(trainer):
        spies.append(SpyGenerator(TransformersGenerator.from_trainer(trainer)))
        return spies[-1]

    func = make_rollout_func(FlakyTalkEnv, processor, history=history, generator=generator, max_turns=3,
                             max_new_tokens=24)  # fmt: skip
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    monkeypatch.setattr(trl, "GRPOTrainer", EpisodeGRPOTrainer)  # train_grpo builds trl.GRPOTrainer
    history_log = train_grpo(tmp_path, model, tok, func, ["1", "2"] * 8, batch=8, max_completion_length=128)
    assert sum("loss" in h for h in history_log) == 2
    contexts = {tuple(row.prompt_ids + row.completion_ids[:k]) for batch in seen for r in batch for row in r.rows
                for k in range(len(row.completion_ids) + 1)}  # fmt: skip
    requests = [tuple(q.prompt_ids) for spy in spies for q in spy.requests]
    assert requests and all(q in contexts for q in requests)


def test_plain_grpo_trainer_refuses_deployed_rows(tmp_path, model, tokenizer):
    tok = thinking_tokenizer(tokenizer)
    func = make_rollout_func(FlakyTalkEnv, from_tokenizer(tok), history="deployed")
    with pytest.raises(ConfigError, match="EpisodeGRPOTrainer"):
        func(["1"], object())
