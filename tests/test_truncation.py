"""The env's side of an episode's end: a Truncatable env settles its reward when trl-env cuts the episode."""

from __future__ import annotations

from tests.helpers import ReplyGenerator
from trl_env import Budgets, ChatMLProcessor, Ending, batch_rollout
from trl_env.rollout.isolation import isolated


class PartialCreditEnv:
    """Scores only when its own game ends (after `seed` moves); `truncate` settles partial credit instead."""

    closed: list[str] = []

    def __init__(self) -> None:
        self.reward, self.alive, self.moves, self.goal = 0.0, True, 0, 0
        self.info: dict[str, object] = {}

    def reset(self, seed):
        self.goal = int(seed)
        return self, f"Make {self.goal} moves."

    def step(self, action):
        self.moves += 1
        self.alive = self.moves < self.goal
        if not self.alive:
            self.reward, self.info = 1.0, {"over": "won"}
        return self, "Next move."

    def truncate(self, reason: str) -> None:
        self.reward = self.moves / self.goal / 2
        self.info = {"over": reason, "moves": self.moves}

    def close(self) -> None:
        PartialCreditEnv.closed.append(str(self.moves))


class BrokenTruncate(PartialCreditEnv):
    def truncate(self, reason: str) -> None:
        raise RuntimeError("no score for you")


def run(tokenizer, env_factory, seeds, **budgets):
    generator = ReplyGenerator(tokenizer, lambda prompt: "move<|im_end|>")
    return batch_rollout(seeds, env_factory, ChatMLProcessor(), tokenizer, generator, budgets=Budgets(**budgets))


def test_a_cut_at_max_turns_lets_the_env_settle_its_reward_before_it_is_read(tokenizer):
    PartialCreditEnv.closed.clear()
    cut, won = run(tokenizer, PartialCreditEnv, ["4", "2"], max_turns=2)
    assert cut.ending is Ending.MAX_TURNS and cut.reward == 0.25 and cut.info["truncated"] == "max_turns"
    assert cut.info["env"] == {"over": "max_turns", "moves": 2}
    assert won.ending is Ending.ENV_DONE and won.reward == 1.0 and "truncated" not in won.info
    assert sorted(PartialCreditEnv.closed) == ["2", "2"]  # close() still runs, after truncate


def test_a_cut_by_the_token_budget_is_reported_as_length(tokenizer):
    [cut] = run(tokenizer, PartialCreditEnv, ["9"], max_turns=8, max_completion_tokens=24)
    assert cut.ending is Ending.LENGTH and cut.info["truncated"] == "length"
    assert cut.reward == cut.info["env"]["moves"] / 9 / 2 > 0


def test_a_truncate_that_raises_keeps_the_last_reward_and_records_the_error(tokenizer):
    PartialCreditEnv.closed.clear()
    [cut] = run(tokenizer, BrokenTruncate, ["4"], max_turns=2)
    assert cut.ending is Ending.MAX_TURNS and cut.reward == 0.0 and "no score for you" in cut.info["close_error"]
    assert PartialCreditEnv.closed == ["2"]


def test_truncate_reaches_an_env_in_a_worker_process(tokenizer):
    [cut] = run(tokenizer, isolated(PartialCreditEnv, pool_size=1), ["4"], max_turns=2)
    assert cut.reward == 0.25 and cut.info["env"] == {"over": "max_turns", "moves": 2}


def test_env_facts_become_metrics_numbers_averaged_and_flags_as_rates(tokenizer):
    from collections import defaultdict
    from types import SimpleNamespace

    from trl_env.train.grpo import log_metrics

    rollouts = run(tokenizer, PartialCreditEnv, ["4", "2", "4"], max_turns=2)
    rollouts[1].info["env"] = {"over": "won", "won": True, "moves": 2}
    rollouts[0].info["env"]["won"] = False
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)}, model=SimpleNamespace(training=True))
    log_metrics(trainer, rollouts)
    got = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("env/info/")}
    assert got == {"env/info/moves_mean": 2.0, "env/info/won_rate": 0.5}  # strings ("over") are not metrics


class GlobalRandomEnv:
    """Seeds Python's global random in reset, as TextArena does: not thread-safe."""

    active = 0
    most = 0

    def __init__(self) -> None:
        self.reward, self.alive, self.secret = 0.0, True, 0.0

    def reset(self, seed):
        import random
        import time

        GlobalRandomEnv.active += 1
        GlobalRandomEnv.most = max(GlobalRandomEnv.most, GlobalRandomEnv.active)
        random.seed(seed)
        time.sleep(0.01)
        self.secret = random.random()
        GlobalRandomEnv.active -= 1
        return self, "go"

    def step(self, action):
        self.alive = False
        self.reward = self.secret
        return self, ""


def test_serialized_envs_run_one_call_at_a_time_and_keep_their_seeds(tokenizer):
    import random

    from trl_env.rollout.isolation import serialized

    GlobalRandomEnv.most = 0
    seeds = [str(i) for i in range(16)]
    rollouts = run(tokenizer, serialized(GlobalRandomEnv), seeds, max_turns=1)
    assert GlobalRandomEnv.most == 1
    assert [r.reward for r in rollouts] == [random.Random(s).random() for s in seeds]


def test_int_seed_is_stable_and_keeps_numbers():
    import subprocess
    import sys

    from trl_env.env import int_seed

    assert int_seed("7") == 7 and int_seed("game-3") == int_seed("game-3") != int_seed("game-4")
    assert 0 <= int_seed("game-3", bits=16) < 2**16 and int_seed(str(2**40)) < 2**32
    assert int_seed("\u00b2") != int_seed("\u0661\u0662") != 12  # non-ASCII digits are text, not numbers
    other = subprocess.run([sys.executable, "-c", "from trl_env.env import int_seed; print(int_seed('game-3'))"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert int(other.stdout) == int_seed("game-3")  # the same in another process (hash() is salted per process)


class ScoredAtReset:
    """Sets a reward in reset (a shaping baseline): what an episode cut before its first step has earned."""

    def reset(self, seed):
        self.reward, self.alive = -0.25, True
        return self, f"Make {seed} moves."

    def step(self, action):
        self.reward = 1.0
        return self, "Next move."


def first_turn_cut(tokenizer, model, env_factory, seeds):
    """Episodes whose first turn runs past max_new_tokens (the tiny random model never stops within 2 tokens)."""
    from trl_env import TransformersGenerator

    generator = TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id)
    rollouts = batch_rollout(
        seeds, env_factory, ChatMLProcessor(), tokenizer, generator, budgets=Budgets(max_turns=4, max_new_tokens=2)
    )
    assert all(r.ending is Ending.LENGTH and len(r.turns) == 1 and r.turns[0].action is None for r in rollouts)
    return rollouts


def test_an_episode_cut_on_its_first_turn_is_scored_with_the_reward_after_reset(tokenizer, model):
    rollouts = first_turn_cut(tokenizer, model, ScoredAtReset, ["3", "5"])
    assert [r.reward for r in rollouts] == [-0.25, -0.25]  # was None: an unscorable row, no signal to stop


def test_an_episode_cut_on_its_first_turn_lets_a_truncatable_env_settle_its_reward(tokenizer, model):
    [cut] = first_turn_cut(tokenizer, model, PartialCreditEnv, ["4"])
    assert cut.reward == 0.0 and cut.info["truncated"] == "length" and cut.info["env"] == {"over": "length", "moves": 0}


def test_the_async_worker_scores_an_episode_cut_on_its_first_turn(tokenizer, model):
    from trl_env import TransformersGenerator
    from trl_env.train.async_grpo import TrlEnvRolloutWorker

    groups = []
    worker = TrlEnvRolloutWorker(
        ScoredAtReset,
        ChatMLProcessor(),
        tokenizer,
        TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id),
        ["3"],
        num_generations=2,
        max_staleness=1,
        max_inflight_groups=1,
        max_turns=4,
        max_new_tokens=2,
        max_completion_length=32,
        on_group=lambda record, rollouts: groups.append(rollouts),
    )
    worker.update_model_version(1)
    worker.start()
    try:
        rows = [worker.rollout_buffer.get(timeout=120) for _ in range(2)]
    finally:
        worker.stop()
    first = groups[0]
    assert all(r.ending is Ending.LENGTH and len(r.turns) == 1 for r in first)
    assert [r.reward for r in first] == [-0.25, -0.25] and len(rows) == 2
    assert worker.counts["unscored"] == 0  # was 2: pushed with advantage 0 as if they had no reward
