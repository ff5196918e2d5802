"""The bundled examples: each env's rules, and a short training smoke run of each script (tiny model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))

from guess_number import GuessNumberEnv  # noqa: E402  # the examples folder is not a package

pytestmark = pytest.mark.slow  # runs the example scripts


def play(env, seed, actions):
    env, delta = env.reset(seed)
    deltas = [delta]
    for action in actions:
        env, delta = env.step(action)
        deltas.append(delta)
    return env, deltas


def test_guess_number_secret_comes_from_the_seed_and_hints_point_to_it():
    a, b = GuessNumberEnv(), GuessNumberEnv()
    a.reset("game-7")
    b.reset("game-7")
    assert a.secret == b.secret and 1 <= a.secret <= 10
    env, deltas = play(GuessNumberEnv(), "game-7", ["0"])
    assert deltas[1] == "Higher." and env.alive and 0 <= env.reward < 0.5


def test_guess_number_win_ends_the_episode_with_a_turn_discount():
    env = GuessNumberEnv()
    env.reset("game-3")
    secret = env.secret
    env, deltas = play(GuessNumberEnv(), "game-3", [str(secret + 1 if secret < 10 else secret - 1), f"It is {secret}"])
    assert deltas[-1] == "Correct!" and not env.alive and env.reward == pytest.approx(0.9)


def test_guess_number_penalises_replies_without_a_number_and_ends_after_max_turns():
    env, deltas = play(GuessNumberEnv(max_turns=2), "game-1", ["no idea", "still none"])
    assert "Please reply with a number" in deltas[1] and not env.alive and env.reward == pytest.approx(-0.4)


def test_guess_number_training_script_smoke(tmp_path):
    import guess_number

    summary = guess_number.main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert summary["wall_s"] > 0
    rewards = json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]
    assert len(rewards) == 2
    lines = (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 8 and json.loads(lines[0])["conversation"].startswith("<|im_start|>system")
    assert (tmp_path / "reward_seed0.png").stat().st_size > 1000
