"""Self-play through the tools: make_rollout_func with a Seating on both trainers, per-seat metrics, trl-env eval."""

from __future__ import annotations

import functools
import json
import math

import pytest

pytest.importorskip("textarena")

from tests.helpers import train_grpo  # noqa: E402
from trl_env import ChatMLProcessor, ConfigError, Ending, env_reward, make_rollout_func  # noqa: E402
from trl_env.adapters.textarena_seats import TextArenaGame, random_move  # noqa: E402
from trl_env.rollout import Rollout, Turn  # noqa: E402
from trl_env.rollout.seated import seat_counts, seat_rates  # noqa: E402
from trl_env.seats import POLICY, Seating  # noqa: E402

TICTACTOE = functools.partial(TextArenaGame, "TicTacToe-v0")
SELF_PLAY = Seating(TICTACTOE, (POLICY, POLICY))
OPTIONS = dict(max_turns=2, max_new_tokens=6, parse_truncated_turns=True)


def rollout(seat: int, reward: float | None, ending: Ending = Ending.ENV_DONE, invalid: bool = False) -> Rollout:
    turn = Turn("t", "", "[4]", "d", reward, "stop", 2, 0, 0.0, 0.0)  # type: ignore[arg-type]
    return Rollout.single("1", [1], [2, 3], [0.0, 0.0], [1, 1], (turn,), reward, ending,
                          info={"seat": seat, "game": 0, "env": {"invalid_move": invalid}})  # fmt: skip


def test_per_seat_rates_by_hand():
    rollouts = [rollout(0, 1.0), rollout(1, -1.0, invalid=True), rollout(0, 0.0), rollout(1, 0.0),
                rollout(0, None, Ending.ERROR), rollout(1, None, Ending.ERROR)]  # fmt: skip
    rates = seat_rates(seat_counts(rollouts))
    assert rates["seat0/win_rate"] == 0.5 and rates["seat0/draw_rate"] == 0.5 and rates["seat0/loss_rate"] == 0.0
    assert rates["seat1/loss_rate"] == 0.5 and rates["seat1/reward_mean"] == -0.5 and rates["seat1/scored"] == 2
    assert rates["seat1/invalid_move_rate"] == 0.5 and rates["seat0/error_rate"] == pytest.approx(1 / 3)
    assert rates["seat0/turns_mean"] == 1.0 and rates["seat0/model_tokens_mean"] == 2.0
    assert seat_rates(seat_counts([Rollout.single("1", [1], [2], [0.0], [1], (), None, Ending.ENV_DONE)])) == {}


def test_a_tictactoe_win_by_the_opponents_invalid_moves_counts_for_the_seat_that_never_moved(tokenizer):
    from tests.helpers import ReplyGenerator
    from trl_env import Budgets
    from trl_env.rollout.seated import play_seats

    generator = ReplyGenerator(tokenizer, lambda prompt: "hello<|im_end|>")  # never a cell: an invalid move
    rollouts = play_seats(["1", "1", "2", "2"], SELF_PLAY, ChatMLProcessor(), tokenizer, generator,
                          budgets=Budgets(max_turns=4, max_new_tokens=6))  # fmt: skip
    # TextArena's error allowance: seat 0's first invalid move is retried, its second loses the game
    assert [len(r.turns) for r in rollouts] == [2, 0, 2, 0] and all(r.ending is Ending.ENV_DONE for r in rollouts)
    assert [r.reward for r in rollouts] == [-1.0, None, -1.0, None]  # nothing to train on for seat 1
    rates = seat_rates(seat_counts(rollouts))
    assert (rates["seat1/scored"], rates["seat1/win_rate"], rates["seat1/invalid_move_rate"]) == (2, 1.0, 0.0)
    assert (rates["seat0/scored"], rates["seat0/loss_rate"], rates["seat0/invalid_move_rate"]) == (2, 1.0, 1.0)


def test_grpo_trainer_plays_both_seats_and_logs_per_seat_metrics(tmp_path, model, tokenizer):
    rollout_func = make_rollout_func(SELF_PLAY, ChatMLProcessor(), **OPTIONS)
    history = train_grpo(tmp_path, model, tokenizer, rollout_func, ["1", "2"], batch=8, max_completion_length=512)
    logged = [h for h in history if "env/seat0/win_rate" in h]
    assert len(logged) == 2 and all(h["env/ending_error_rate"] == 0.0 for h in logged)
    keys = ("env/seat1/loss_rate", "env/seat0/invalid_move_rate", "env/seat1/turns_mean")
    assert all(key in logged[0] for key in keys)


def test_episode_trainer_with_per_role_credit(tmp_path, model, tokenizer):
    from datasets import Dataset
    from trl import GRPOConfig

    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    rollout_func = make_rollout_func(SELF_PLAY, ChatMLProcessor(), credit="per_role", **OPTIONS)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=2,
                      max_completion_length=512, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                      bf16=False, seed=0)  # fmt: skip
    trainer = EpisodeGRPOTrainer(model=model, reward_funcs=env_reward, args=args, processing_class=tokenizer,
                                 train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 4}),
                                 rollout_func=rollout_func)  # fmt: skip
    trainer.train()
    logged = [h for h in trainer.state.log_history if "credit/scored_turns" in h]
    assert len(logged) == 2 and all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_a_group_that_does_not_divide_into_games_fails_with_the_fix(tokenizer):
    from types import SimpleNamespace

    from tests.helpers import ReplyGenerator

    generator = ReplyGenerator(tokenizer, lambda prompt: "[4]<|im_end|>")
    rollout_func = make_rollout_func(SELF_PLAY, ChatMLProcessor(), generator=generator, **OPTIONS)
    trainer = SimpleNamespace(processing_class=tokenizer, args=SimpleNamespace(max_completion_length=64))
    with pytest.raises(ConfigError, match="num_generations a multiple of 2"):
        rollout_func.rollouts(["1", "1", "2"], trainer)
    with pytest.raises(ConfigError, match="env_executor='process' with a Seating"):
        make_rollout_func(SELF_PLAY, ChatMLProcessor(), env_executor="process")


def test_trl_env_eval_reports_each_seat_against_a_fixed_random_opponent(tmp_path, capsys):
    from trl_env.tools.cli import main

    out = tmp_path / "eval"
    spec = "trl_env.adapters.textarena_seats"
    status = main(["eval", "--env", f"{spec}:TextArenaGame", "--env-kwargs", json.dumps({"game": "TicTacToe-v0"}),
                   "--seats", f"{spec}:random_move,policy", "--model", "tiny", "--n", "3", "--max-turns", "3",
                   "--max-new-tokens", "6", "--parse-truncated-turns", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0 and "| episodes | 3 |" in printed and "| seat | scored | reward_mean | win_rate" in printed
    assert "\n| 1 | " in printed and "\n| 0 | " not in printed  # only the policy's seat has episodes
    lines = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert [(line["info"]["game"], line["info"]["seat"]) for line in lines] == [(0, 1), (1, 1), (2, 1)]
    assert "game 0, seat 1" in (out / "transcripts.md").read_text()
    assert random_move("Available Moves: '[3]'") == "[3]"


@pytest.mark.slow
def test_selfplay_example_training_script_smoke(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))
    import selfplay_tictactoe

    summary = selfplay_tictactoe.main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path), "--save"])
    assert summary["steps"] == 2.0 and math.isfinite(summary["wall_s"])
    assert (tmp_path / "transcripts_seed0.jsonl").is_file() and (tmp_path / "model" / "config.json").is_file()
    lines = [json.loads(line) for line in (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()]
    assert {line["info"]["seat"] for line in lines} == {0, 1}
