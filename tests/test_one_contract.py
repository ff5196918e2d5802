"""One contract from an episode to TRL: the sync trainer and the async worker train the same tokens with the same
per-token advantages for the same rollouts (issue 43 item 2).

The sync side is what ``EpisodeGRPOTrainer`` hands TRL's loss: its rows (``to_trl_rows``: ``env_mask`` zero for a
failed or, with ``mask_truncated``, a truncated episode) with the episode's advantage (``episode_advantages``, TRL's
rule) or, for turn-level credit, the per-token table (``token_advantages`` of the estimator's per-turn advantages).
The async side is what ``TrlEnvRolloutWorker`` pushes (``RolloutSample``: one per row, or one per model turn for
turn-level credit, TRL's async sample type holding one advantage). Both are read as a set of trained tokens, each
``(episode, row, completion position) -> advantage``, and compared.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ScriptedGenerator

from trl_env import ChatMLProcessor
from trl_env.backends.base import FinishReason
from trl_env.rollout import Ending, Rollout
from trl_env.rollout.records import Row, Turn
from trl_env.train.advantages import episode_advantages
from trl_env.train.async_grpo import TrlEnvRolloutWorker
from trl_env.train.credit import EpisodeCredit, credit_estimator, estimate, token_advantages
from trl_env.train.trl_output import to_trl_rows, training_rows


def turn(model, env, reward, anchor):
    return Turn(
        text=f"t{model[0]}",
        reasoning="",
        action="a",
        delta="obs" if env else None,
        reward=reward,
        finish_reason=FinishReason.STOP,
        num_model_tokens=len(model),
        num_env_tokens=len(env),
        generation_s=0.0,
        env_s=0.0,
        anchor=anchor,
    )


def rollout(specs, reward, ending=Ending.ENV_DONE, prompt=(1, 2), seat=None):
    completion, logprobs, mask = [], [], []
    for model, env, _, _ in specs:
        completion += model + env
        logprobs += [-i / 100 for i in model] + [0.0] * len(env)
        mask += [1] * len(model) + [0] * len(env)
    turns = tuple(turn(*spec) for spec in specs)
    row = Row.of_turns(list(prompt), completion, logprobs, mask, turns)
    info = {} if seat is None else {"seat": seat}
    return Rollout(seed="s", rows=(row,), turns=turns, reward=reward, ending=ending, info=info)


def group(seats=False):
    """Four episodes of one seed: varied turn counts, a failed one and a truncated one (max_turns)."""
    seat = (lambda k: k % 2) if seats else (lambda k: None)
    return [
        rollout(
            [([10, 11], [20], 1.0, "s0"), ([12], [21, 22], 1.0, "s1"), ([13, 14], [], 3.0, "s1")], 3.0, seat=seat(0)
        ),
        rollout([([30], [40, 41], 0.0, "s0"), ([31, 32, 33], [], 1.0, "s1")], 1.0, seat=seat(1)),
        rollout([([90], [91], 5.0, "s0")], None, ending=Ending.ERROR, seat=seat(2)),  # failed
        rollout([([60], [70], 0.0, "s0"), ([61], [62], 2.0, "s9")], 2.0, ending=Ending.MAX_TURNS, seat=seat(3)),
        rollout([([50, 51], [52], 0.5, "s0"), ([53], [], 0.5, "s1")], 0.5, seat=seat(4)),
        rollout([([80], [], 4.0, "s0")], 4.0, seat=seat(5)),
    ]


def sync_tokens(rollouts, credit, mask_truncated):
    """EpisodeGRPOTrainer's batch for one group: (episode, row, position) -> advantage, over the trained tokens."""
    rows, episode_of_row = to_trl_rows(rollouts, mask_truncated=mask_truncated)
    rewards = torch.tensor(
        [[math.nan if r.reward is None or r.ending is Ending.ERROR else r.reward] for r in rollouts],
        dtype=torch.float32,
    )
    if credit == "episode":
        advantages, _ = episode_advantages(rewards, torch.ones(1), len(rollouts))
        per_token = [
            [advantages[e].item()] * len(c) for e, c in zip(episode_of_row, rows["completion_ids"], strict=True)
        ]
    else:
        credits = [
            EpisodeCredit.from_rollout(r, total=t) for r, t in zip(rollouts, rewards[:, 0].tolist(), strict=True)
        ]
        per_turn = estimate(credit_estimator(credit, "group"), credits)
        per_token = [row for r, a in zip(rollouts, per_turn, strict=True) for row in token_advantages(r, a)]
    out, seen = {}, {}
    for e, mask, values in zip(episode_of_row, rows["env_mask"], per_token, strict=True):
        k = seen[e] = seen.get(e, -1) + 1
        out.update({(e, k, j): v for j, (m, v) in enumerate(zip(mask, values, strict=True)) if m})
    return out


def async_tokens(tokenizer, rollouts, credit, mask_truncated):
    """The samples TrlEnvRolloutWorker pushes for the same group, read the same way."""
    worker = TrlEnvRolloutWorker(
        lambda: None,
        ChatMLProcessor(),
        tokenizer,
        ScriptedGenerator(range(10, 20), 0),
        ["s"],
        num_generations=len(rollouts),
        credit=credit,
        mask_truncated=mask_truncated,
    )
    episodes, _ = worker._score(7, rollouts, [(1, 1)] * len(rollouts), 1, 1)
    out = {}
    for samples in episodes:
        ids = samples[-1].input_ids.tolist()  # a prefix of the episode's one row (the whole row for "episode")
        full = [r.rows[0].prompt_ids + r.rows[0].completion_ids for r in rollouts]
        (e,) = [e for e, f in enumerate(full) if f[: len(ids)] == ids]
        start = len(rollouts[e].rows[0].prompt_ids)
        for s in samples:
            trained = [j - start for j, m in enumerate(s.completion_mask.tolist()) if m]
            assert not set(trained) & {j for (_, _, j) in out if _ == e}, "a token trained twice"
            out.update({(e, 0, j): s.advantage for j in trained})
    return out


@pytest.mark.parametrize("mask_truncated", [False, True])
@pytest.mark.parametrize("credit", ["episode", "discounted", "gigpo", "per_role"])
def test_sync_and_async_train_the_same_tokens_with_the_same_advantages(tokenizer, credit, mask_truncated):
    rollouts = group(seats=credit == "per_role")
    sync, pushed = (
        sync_tokens(rollouts, credit, mask_truncated),
        async_tokens(tokenizer, rollouts, credit, mask_truncated),
    )
    assert set(sync) == set(pushed)
    assert all(sync[k] == pytest.approx(pushed[k], rel=1e-5, abs=1e-6) for k in sync)  # float32 (TRL) against float64
    episodes = {e for e, _, _ in sync}
    assert 2 not in episodes  # the failed episode trains no token in either
    assert (3 in episodes) is not mask_truncated  # the truncated one: trained unless mask_truncated, in both
    distinct = len({v for (e, _, _), v in sync.items() if e == 0})  # episode 0's 3 turns
    assert distinct == 1 if credit in ("episode", "per_role") else distinct > 1


def test_training_rows_is_the_one_rule_both_trainers_read():
    """training_rows: a failed episode, and with mask_truncated a truncated one, trains no token; every other row
    trains its model tokens (env_mask), each with its turn's advantage; to_trl_rows is its dict."""
    rollouts = group()
    per_turn = [[1.0, 2.0, 3.0], [4.0, 5.0], None, [6.0, 7.0], [8.0, 9.0], [10.0]]
    for mask_truncated in (False, True):
        rows = training_rows(rollouts, per_turn, mask_truncated=mask_truncated)
        assert [t.episode for t in rows] == [0, 1, 2, 3, 4, 5]
        output, episode_of_row = to_trl_rows(rollouts, mask_truncated=mask_truncated)
        assert output["env_mask"] == [t.trained for t in rows] and episode_of_row == [0, 1, 2, 3, 4, 5]
        for t in rows:
            masked = t.episode == 2 or (mask_truncated and t.episode == 3)
            assert t.trained == ([0] * len(t.row.env_mask) if masked else t.row.env_mask)
            assert t.advantages == token_advantages(rollouts[t.episode], per_turn[t.episode])[0]
    first = training_rows(rollouts, per_turn)[0]
    assert [a for a, m in zip(first.advantages, first.trained, strict=True) if m] == [1.0, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["episode", "discounted"])
def test_a_real_episode_trainer_step_and_the_worker_train_the_same_tokens(tmp_path, model, tokenizer, credit):
    """End to end: the batch a real EpisodeGRPOTrainer step hands TRL's loss, and the samples the async worker makes
    of the same rollouts (failed episodes among them, every other one truncated at max_turns): the same trained
    tokens, each with the same advantage."""
    from datasets import Dataset
    from history_support import FlakyTalkEnv, ReplyGenerator
    from trl import GRPOConfig

    from trl_env import env_reward, make_rollout_func
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    class Recording(EpisodeGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            self.recorded.append(super()._generate_and_score_completions(inputs))
            return self.recorded[-1]

    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=2, env_workers=1, credit=credit)
    seen = []
    rollouts_of = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts_of(prompts, trainer)) or seen[-1]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=1,
        max_completion_length=128,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    FlakyTalkEnv.count = 0
    trainer = Recording(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 4}),
        rollout_func=func,
    )
    trainer.recorded = []
    trainer.train()
    (rollouts,), batch = seen, trainer.recorded[0]
    assert any(r.ending is Ending.ERROR for r in rollouts) and any(r.truncated for r in rollouts)
    sync = {}
    trained = batch["completion_mask"] * batch["tool_mask"]
    for i in range(len(rollouts)):  # one row per episode (history="sampled")
        values = batch["advantages"][i]
        for j in trained[i].nonzero().flatten().tolist():
            sync[(i, 0, j)] = float(values if values.ndim == 0 else values[j])
    pushed = {}
    for g in range(0, len(rollouts), 4):
        got = async_tokens(tokenizer, rollouts[g : g + 4], credit, False)
        pushed.update({(g + e, k, j): v for (e, k, j), v in got.items()})
    assert set(sync) == set(pushed) and any(v != 0 for v in sync.values())
    assert all(sync[k] == pytest.approx(pushed[k], rel=1e-5, abs=1e-6) for k in sync)
