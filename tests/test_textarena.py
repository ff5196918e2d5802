"""TextArena games through TextArenaEnv, against the real library (textarena 0.7.4, the `textarena` extra)."""

from __future__ import annotations

import functools
import math
import re

import pytest

pytest.importorskip("textarena")

from tests.helpers import ReplyGenerator  # noqa: E402
from trl_env import Budgets, ChatMLProcessor, Ending, batch_rollout  # noqa: E402
from trl_env.adapters.textarena import TextArenaEnv  # noqa: E402
from trl_env.errors import ConfigError  # noqa: E402

GUESS = functools.partial(TextArenaEnv, "GuessTheNumber-v0")


def target(env: TextArenaEnv) -> int:
    return int(env.game.state.game_state["game_number"])


def first_free(observation: str) -> str:
    return "[" + observation.rsplit("Available Moves: '[", 1)[1][0] + "]"


def test_the_seed_picks_the_game_and_only_new_text_comes_back():
    a, b, c = GUESS(), GUESS(), GUESS()
    _, intro = a.reset("game-1")
    b.reset("game-1")
    c.reset("game-2")
    assert target(a) == target(b) and "Guess The Number" in intro
    assert len({target(GUESS().reset(f"game-{i}")[0]) for i in range(8)}) > 1
    wrong = 1 if target(a) != 1 else 2
    _, hint = a.step(f"[{wrong}]")
    assert hint == "[GAME] The target number is higher." and a.alive  # no intro again, no "[Player] [1]" echo
    _, _ = a.step(f"[{target(a)}]")
    assert not a.alive and a.reward == 1.0 and a.info["turn_count"] == 2 and "guessed" in a.info["reason"]


def test_other_seats_are_played_by_the_opponent():
    env = TextArenaEnv("TicTacToe-v0", num_players=2, opponent=first_free)
    env.reset("1")
    for move in ["[4]", "[8]", "[2]", "[6]"]:
        if env.alive:
            env.step(move)
    assert not env.alive and env.reward == 1.0 and "won" in env.info["reason"]


def test_bad_configuration_fails_early_with_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match="give opponent="):
        TextArenaEnv("TicTacToe-v0", num_players=2)
    with pytest.raises(ConfigError, match="textarena.make failed"):
        TextArenaEnv("NoSuchGame-v9")
    monkeypatch.setitem(__import__("sys").modules, "textarena", None)
    with pytest.raises(ConfigError, match=r"pip install 'trl-env\[textarena\]'"):
        GUESS()


def guesser(prompt: str) -> str:
    """Binary search on the hints in the conversation so far."""
    low, high = 1, 20
    for guess, hint in re.findall(
        r"\[(\d+)\]<\|im_end\|>\n<\|im_start\|>user\n\[GAME\] The target number is (\w+)", prompt
    ):
        low, high = (int(guess) + 1, high) if hint == "higher" else (low, int(guess) - 1)
    return f"[{(low + high) // 2}]<|im_end|>"


def test_concurrent_episodes_keep_their_own_games_and_win(tokenizer):
    seeds = [f"game-{i % 8}" for i in range(32)]  # 4 copies of each game, on 16 threads at once
    rollouts = batch_rollout(seeds, GUESS, ChatMLProcessor(), tokenizer, ReplyGenerator(tokenizer, guesser),
                             budgets=Budgets(max_turns=6, max_new_tokens=8))  # fmt: skip
    assert all(r.ending is Ending.ENV_DONE and r.reward == 1.0 for r in rollouts), [r.error for r in rollouts]
    for i in range(8):  # the copies of a game played the same moves
        assert len({tuple(t.action for t in r.turns) for r in rollouts[i::8]}) == 1


def test_a_game_cut_by_trl_env_learns_why(tokenizer):
    [cut] = batch_rollout(["game-3"], GUESS, ChatMLProcessor(), tokenizer,
                          ReplyGenerator(tokenizer, lambda prompt: "[1]<|im_end|>"),
                          budgets=Budgets(max_turns=2, max_new_tokens=8))  # fmt: skip
    assert cut.ending is Ending.MAX_TURNS and cut.reward == 0.0
    assert cut.info["truncated"] == "max_turns" and cut.info["env"]["reason"] == "cut by trl-env (max_turns)"


@pytest.mark.slow
def test_grpo_trains_two_steps_on_a_textarena_game(tmp_path, model, tokenizer):
    from tests.helpers import train_grpo
    from trl_env import make_rollout_func

    rollout_func = make_rollout_func(
        GUESS, ChatMLProcessor(), max_turns=2, max_new_tokens=6, parse_truncated_turns=True
    )
    history = train_grpo(
        tmp_path, model, tokenizer, rollout_func, ["game-1", "game-2"], batch=4, max_completion_length=64
    )
    logged = [h for h in history if "env/turns_mean" in h]
    assert len(logged) == 2 and all(h["env/ending_error_rate"] == 0.0 for h in logged)


@pytest.mark.slow
def test_textarena_example_training_script_smoke(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "experiment" / "examples"))
    import textarena_guess

    summary = textarena_guess.main(["--model", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert math.isfinite(summary["wall_s"]) and (tmp_path / "transcripts_seed0.jsonl").is_file()


def test_trl_env_eval_runs_a_textarena_game_with_the_tiny_model(tmp_path, capsys):
    import json

    from trl_env.tools.cli import main

    out = tmp_path / "eval"
    status = main(["eval", "--env", "trl_env.adapters.textarena:TextArenaEnv",
                   "--env-kwargs", json.dumps({"game": "GuessTheNumber-v0"}), "--model", "tiny", "--n", "2",
                   "--seed-format", "game-{i}", "--max-turns", "2", "--max-new-tokens", "8",
                   "--parse-truncated-turns", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0 and "| episodes | 2 |" in printed and "| error_rate | 0 |" in printed, printed
    lines = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert {line["seed"] for line in lines} == {"game-0", "game-1"}
    assert all("Guess The Number" in json.dumps(line["conversation"]) for line in lines)  # the game reached the model
