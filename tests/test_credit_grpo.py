"""credit= through EpisodeGRPOTrainer: "episode" is TRL's own advantages; the other estimators reach TRL's loss per
token (each model token its turn's advantage, env tokens 0), in real GRPOTrainer steps on the tiny model."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from history_support import FlakyTalkEnv, ReplyGenerator, none_for_short, thinking_tokenizer, turns_reward

import trl_env
from trl_env import ChatMLProcessor, env_reward, make_rollout_func
from trl_env.errors import ConfigError
from trl_env.render.processors import from_tokenizer
from trl_env.train.credit import DiscountedReturns, EpisodeCredit, GiGPO, get_estimator, token_advantages
from trl_env.train.episode_trainer import EpisodeGRPOTrainer, env_reward_columns

pytestmark = pytest.mark.slow  # two real GRPO steps per estimator and loss type


def recording(cls):
    class Recording(cls):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorded.append(out)
            return out

    return Recording


def run(tmp_path, model, tok, cls, func, funcs, *, steps=1, seen=None, **config):
    from datasets import Dataset
    from trl import GRPOConfig

    if seen is not None:
        rollouts = func.rollouts
        func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=steps,
                    max_completion_length=128, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                    bf16=False, seed=0) | config  # fmt: skip
    FlakyTalkEnv.count = 0  # every 5th env fails: the same ones in every run
    dataset = Dataset.from_dict({"prompt": ["1", "2"] * 8})
    trainer = recording(cls)(model=model, reward_funcs=funcs, args=GRPOConfig(**settings), processing_class=tok,
                             train_dataset=dataset, rollout_func=func)  # fmt: skip
    trainer.recorded = []
    trainer.train()
    return trainer


@pytest.mark.parametrize("funcs", [1, 2, 3])
def test_credit_episode_gives_exactly_trls_own_advantages(tmp_path, model, tokenizer, funcs):
    """Same episodes (a scripted sampler, one env worker), 1 to 3 reward functions, failed episodes among them."""
    from trl import GRPOTrainer

    reward_funcs = [env_reward, turns_reward, none_for_short][:funcs]
    outputs = []
    for cls, credit in ((GRPOTrainer, None), (EpisodeGRPOTrainer, "episode")):
        processor = ChatMLProcessor()
        gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
        kwargs = {} if credit is None else {"credit": credit}
        func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1, **kwargs)
        outputs.append(run(tmp_path, model, tokenizer, cls, func, reward_funcs).recorded[0])
    trl_out, ours = outputs
    assert (trl_out["advantages"] != 0).any() and (trl_out["advantages"] == 0).any()  # failed rows get 0
    assert torch.equal(trl_out["advantages"], ours["advantages"])
    assert torch.equal(trl_out["completion_ids"], ours["completion_ids"])


def test_episode_trainer_builds_the_batch_trl_builds_without_entering_trl(tmp_path, model, tokenizer, monkeypatch):
    """history="sampled", credit="episode", two reward functions, failed episodes and two iterations (old logprobs):
    EpisodeGRPOTrainer's own batch is GRPOTrainer's, key by key and bit for bit, the step logs the same values under
    TRL's names, and TRL's _generate_and_score_completions is never entered."""
    import copy

    from trl import GRPOTrainer

    reward_funcs = [env_reward, turns_reward]
    trainers = []
    for cls, credit in ((GRPOTrainer, None), (EpisodeGRPOTrainer, "episode")):
        processor = ChatMLProcessor()
        gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
        kwargs = {} if credit is None else {"credit": credit}
        func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1, **kwargs)
        if cls is EpisodeGRPOTrainer:
            monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", None)  # entering TRL's would fail
        trainer = run(tmp_path, copy.deepcopy(model), tokenizer, cls, func, reward_funcs, num_iterations=2)
        trainers.append(trainer)
    trl_out, ours = (t.recorded[0] for t in trainers)
    assert {"old_per_token_logps", "tool_mask", "sampling_per_token_logps"} <= set(trl_out)
    assert set(ours) == set(trl_out)
    for key, value in trl_out.items():
        assert torch.equal(value, ours[key]), key
    trl_log, our_log = (t.state.log_history[0] for t in trainers)
    assert our_log.pop("episodes") == 8.0
    assert set(our_log) == set(trl_log)
    clock = ("time", "per_second", "_s_", "_s")  # wall-clock values (env/step_s_mean, train_runtime, ...)
    same = {k for k in trl_log if not any(c in k for c in clock[:3]) and not k.endswith(clock[3])}
    assert {"loss", "grad_norm", "reward", "reward_std", "num_tokens", "completions/mean_length"} <= same
    assert {k: our_log[k] for k in same} == pytest.approx({k: trl_log[k] for k in same})
    assert [len(t._logs["advantages"]) for t in trainers] == [8, 8]  # one value per row, logged once


def hand_discounted(turn_rewards_by_episode):
    """DiscountedReturns(gamma=1, baseline="turn", scale_rewards="none") by hand: return-to-go minus its turn mean."""
    scored = [r for r in turn_rewards_by_episode if r is not None]
    togo = [[sum(r[t:]) for t in range(len(r))] for r in scored]
    longest = max(map(len, togo))
    base = [sum(g[t] for g in togo if t < len(g)) / len(togo) for t in range(longest)]
    it = iter([[g[t] - base[t] for t in range(len(g))] for g in togo])
    return [None if r is None else next(it) for r in turn_rewards_by_episode]


@functools.wraps(env_reward)
def logged_env_reward(completions, env_reward, **kwargs):
    """A user's decorator around env_reward (functools.wraps): the same values, the same name."""
    return trl_env.env_reward(completions, env_reward, **kwargs)


@pytest.mark.parametrize(
    "env_func",
    [env_reward, logged_env_reward, functools.partial(env_reward), functools.partial(logged_env_reward)],
    ids=["itself", "wraps", "partial", "partial-of-wraps"],
)
def test_discounted_credit_reaches_each_model_token_as_computed_by_hand(tmp_path, model, tokenizer, env_func):
    """One step, the scripted sampler: the per-token table TRL trains on, against a hand computation. env_reward is
    found through functools.wraps and functools.partial too (it once was by identity alone: weight 0, all the
    credit on the last turn)."""
    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1,
                             credit=DiscountedReturns(scale_rewards="none"))  # fmt: skip
    seen = []
    trainer = run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [env_func], seen=seen)
    (out,), (episodes,) = trainer.recorded, seen
    assert out["advantages"].shape == out["completion_ids"].shape
    for g in range(0, len(episodes), 4):
        group = episodes[g : g + 4]
        rewards = []
        for r in group:  # FlakyTalkEnv: +1 for an odd digit, per step
            steps = [t.reward for t in r.turns]
            rewards.append(
                None if r.ending.value == "error" else [b - a for a, b in zip([0.0, *steps], steps, strict=False)]
            )
        expected = hand_discounted(rewards)
        for i, (r, adv) in enumerate(zip(group, expected, strict=True), start=g):
            row = out["advantages"][i].tolist()
            k = 0
            for t, turn in enumerate(r.turns):
                want = 0.0 if adv is None else adv[t]
                assert row[k : k + turn.num_model_tokens] == pytest.approx([want] * turn.num_model_tokens, abs=1e-6)
                assert row[k + turn.num_model_tokens : k + turn.num_model_tokens + turn.num_env_tokens] == [0.0] * (
                    turn.num_env_tokens
                )
                k += turn.num_model_tokens + turn.num_env_tokens
            assert row[k:] == [0.0] * (len(row) - k)  # padding
    assert len({tuple(a) for a in out["advantages"].tolist() if any(a)}) > 2, "turns of an episode differ"


@functools.wraps(env_reward)
def doubled_env_reward(completions, env_reward, **kwargs):
    """Wraps env_reward but changes its values: per turn, credit could only guess how."""
    return [None if r is None else 2 * r for r in env_reward]


def env_reward_copy(completions, env_reward, **kwargs):
    return list(env_reward)


env_reward_copy.__name__ = env_reward_copy.__qualname__ = "env_reward"  # a copy of it (or one of your own)


def test_an_env_reward_whose_turns_credit_cannot_read_is_refused(tmp_path, model, tokenizer):
    """A wrapper that changes env_reward's values is refused at the first step (naming them); a function called
    env_reward that is not trl_env's at construction. Either once silently spread all its credit on the last turn."""
    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1, credit="discounted")
    with pytest.raises(ConfigError, match=r"env_reward.* scored episode \d+ as [\d.]+ where the env's reward "
                                          r"is [\d.]+.*reward_weights"):  # fmt: skip
        run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [doubled_env_reward])
    with pytest.raises(ConfigError, match=r"reward_funcs\[1\].*env_reward.*not trl_env\.env_reward"):
        run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [turns_reward, env_reward_copy])
    episode = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1)
    run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, episode, [env_reward_copy])  # credit="episode": per episode


def test_env_reward_columns_finds_env_reward_however_it_is_wrapped():
    funcs = [turns_reward, env_reward, logged_env_reward, functools.partial(logged_env_reward), lambda **kw: None]
    assert env_reward_columns(funcs) == [1, 2, 3]
    with pytest.raises(ConfigError, match=r"reward_funcs\[0\] is named env_reward but is not trl_env\.env_reward"):
        env_reward_columns([functools.partial(env_reward_copy)])


class FirstTurnCredit:
    """A user's estimator (the CreditEstimator protocol): the episode's return minus the group mean, first turn only."""

    def __call__(self, group):
        scored = [e.total for e in group if not e.failed]
        mean = sum(scored) / len(scored) if scored else 0.0
        return [None if e.failed else [e.total - mean] + [0.0] * (len(e.turn_rewards) - 1) for e in group]


@pytest.mark.parametrize(
    "credit, loss_type, history",
    [
        ("discounted", "grpo", "sampled"),
        ("gigpo", "dapo", "sampled"),
        ("per_turn_index", "dr_grpo", "sampled"),
        (FirstTurnCredit(), "bnpo", "sampled"),
        ("gigpo", "dapo", "deployed"),
    ],
    ids=["discounted-grpo", "gigpo-dapo", "per_turn_index-dr_grpo", "custom-bnpo", "gigpo-dapo-deployed"],
)
def test_two_real_grpo_steps_with_each_estimator(tmp_path, model, tokenizer, credit, loss_type, history):
    """The tiny model samples; the advantages TRL trains on are the estimator's, per token, row by row."""
    from trl_env.backends.transformers import TransformersGenerator

    tok = thinking_tokenizer(tokenizer) if history == "deployed" else tokenizer
    processor = from_tokenizer(tok) if history == "deployed" else ChatMLProcessor()
    func = make_rollout_func(FlakyTalkEnv, processor, history=history, max_turns=3, max_new_tokens=16,
                             generator=TransformersGenerator.from_trainer, credit=credit)  # fmt: skip
    seen = []
    trainer = run(tmp_path, model, tok, EpisodeGRPOTrainer, func, [env_reward, turns_reward], steps=2, seen=seen,
                  loss_type=loss_type)  # fmt: skip
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    estimator = get_estimator(credit, scale_rewards="group") if isinstance(credit, str) else credit
    for out, episodes in zip(trainer.recorded, seen, strict=True):
        credits = []
        for r in episodes:  # env_reward (weight 1) per turn, turns_reward (whole episode) on the last turn
            total = None if r.ending.value == "error" else r.reward + len(r.turns) / 3
            credits.append(EpisodeCredit.from_rollout(r, total=total, env_weight=1.0))
        advantages = [a for g in range(0, len(credits), 4) for a in estimator(credits[g : g + 4])]
        rows = [row for r, a in zip(episodes, advantages, strict=True) for row in token_advantages(r, a)]
        table = out["advantages"]
        assert table.shape == out["completion_ids"].shape and table.size(0) >= len(rows)
        for i, expected in enumerate(rows):
            assert table[i, : len(expected)].tolist() == pytest.approx(expected, abs=1e-5)
            assert not table[i, len(expected) :].any()
        assert not table[len(rows) :].any()  # fully masked padding rows
    logged = [h for h in trainer.state.log_history if "credit/advantage_std" in h]
    assert len(logged) == 2 and all("credit/turn0/advantage_mean" in h for h in logged)


def test_the_loss_trains_each_token_on_its_own_turns_advantage(tmp_path, model, tokenizer):
    """TRL's own loss on the recorded batch: its value is minus the mean advantage over the trained tokens (dapo,
    ratio 1, beta 0), and its gradient differs from the one a per-row scalar (all TRL alone can carry) would give."""
    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1,
                             credit=DiscountedReturns(baseline="episode", scale_rewards="none"))  # fmt: skip
    trainer = run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [env_reward], loss_type="dapo")
    (out,) = trainer.recorded
    mask = (out["completion_mask"] * out["tool_mask"]).float()

    def loss_and_grad(advantages):
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, dict(out, advantages=advantages))
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    loss, grad = loss_and_grad(out["advantages"])
    assert loss == pytest.approx(-((out["advantages"] * mask).sum() / mask.sum()).item(), abs=1e-5)
    row_means = (out["advantages"] * mask).sum(1) / mask.sum(1).clamp(min=1)
    same_loss, row_grad = loss_and_grad(row_means)
    assert same_loss == pytest.approx(loss, abs=1e-5)  # the value cannot tell them apart: the gradient can
    assert (grad - row_grad).norm() > 1e-3 * grad.norm()


def test_credit_is_refused_where_it_cannot_be_honoured(tmp_path, model, tokenizer):
    with pytest.raises(ConfigError, match="credit='ppo'"):
        make_rollout_func(FlakyTalkEnv, ChatMLProcessor(), credit="ppo")
    with pytest.raises(ConfigError, match=r"credit=GiGPO\(gamma=0.9\)"):  # the class, not an estimator
        make_rollout_func(FlakyTalkEnv, ChatMLProcessor(), credit=GiGPO)
    func = make_rollout_func(FlakyTalkEnv, ChatMLProcessor(), credit="gigpo")
    with pytest.raises(ConfigError, match="EpisodeGRPOTrainer"):
        func(["1"], object())  # plain GRPOTrainer carries one advantage per row
    for config, match in (({"scale_rewards": "batch"}, "scale_rewards='batch'"),
                          ({"multi_objective_aggregation": "normalize_then_sum"}, "normalize_then_sum")):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [env_reward], **config)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "luspo", "vespo"])
def test_the_other_loss_types_take_per_token_advantages(tmp_path, model, tokenizer, loss_type):
    """One real step each on the scripted sampler: a finite loss from the (rows, tokens) table."""
    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1, credit="gigpo")
    trainer = run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [env_reward], loss_type=loss_type)
    (out,) = trainer.recorded
    assert out["advantages"].shape == out["completion_ids"].shape
    (loss,) = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(loss)


def test_a_custom_estimator_of_the_wrong_shape_is_named(tmp_path, model, tokenizer):
    processor = ChatMLProcessor()
    gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)

    def one_per_episode(group):  # a common mistake: one advantage per episode, not per turn
        return [None if e.failed else [e.total] for e in group]

    func = make_rollout_func(FlakyTalkEnv, processor, generator=gen, max_turns=3, env_workers=1,
                             credit=one_per_episode)  # fmt: skip
    with pytest.raises(ConfigError, match=r"gave 1 advantages for \d turns: one per turn"):
        run(tmp_path, model, tokenizer, EpisodeGRPOTrainer, func, [env_reward])
