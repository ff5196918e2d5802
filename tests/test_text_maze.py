"""The text-maze example (turn-level credit, issue 27): its rules, its anchors through the engine, and a smoke run."""

from __future__ import annotations

import json
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from trl_env import ChatMLProcessor, Ending, Generation, batch_rollout
from trl_env.backends.base import FinishReason
from trl_env.train.credit import EpisodeCredit, GiGPO

EXAMPLES = Path(__file__).parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))

from text_maze import GOAL, INVALID, MAX_TURNS, STEP_COST, MazeEnv, main, parse_move  # noqa: E402


def walk(*moves: str) -> MazeEnv:
    env = MazeEnv()
    env.reset("maze-0")
    for move in moves:
        env.step(move)
    return env


def test_replies_are_read_leniently_first_direction_letter_in_any_case():
    assert [parse_move(r) for r in ("E", "w", " north", "Go south", "xyz", "", "123!")] == [
        "E", "W", "N", "S", None, None, None,
    ]  # fmt: skip


def test_the_shortest_path_reaches_the_goal_and_ends_the_episode():
    env = MazeEnv()
    _, first = env.reset("maze-0")
    assert first == "Cell (1,0). Exits: E, W." and env.shortest() == 3
    for move in "ESE":
        _, delta = env.step(move)
    assert delta == "Goal!" and not env.alive and env.cell == env.goal
    assert env.reward == pytest.approx(GOAL - 3 * STEP_COST) == pytest.approx(env.best_reward())


def test_walls_and_invalid_replies_keep_the_cell_and_its_observation():
    env = MazeEnv()
    _, first = env.reset("maze-0")
    _, bumped = env.step("N")  # a wall: same cell, same text
    assert bumped == first and env.reward == pytest.approx(-STEP_COST)
    _, invalid = env.step("I? 42!")  # no n, e, s or w
    assert invalid == first and env.reward == pytest.approx(-2 * STEP_COST - INVALID)
    assert env.info == {"anchor": "(1,0)"} and env.alive


def test_a_wrong_first_move_leads_into_the_dead_end_and_the_episode_runs_out():
    env = walk("W", "S", "S")
    assert env.cell == (0, 2) and env.exits(env.cell) == ["N"]
    while env.alive:
        env.step("E")  # the dead end's walls
    assert env.turns == MAX_TURNS and env.reward == pytest.approx(-MAX_TURNS * STEP_COST)
    detour = walk("W", "E", "E", "S", "E")  # out to (0,0) and back: the goal in 5 moves, 1 turn to spare
    assert detour.cell == detour.goal and detour.reward == pytest.approx(GOAL - 5 * STEP_COST)


def test_anchors_through_the_engine_are_the_cells_and_gigpo_groups_revisits(tokenizer):
    class Fixed:
        continuous = False

        def __init__(self, moves: str) -> None:
            self.moves, self.calls = moves, 0

        def submit(self, requests):
            out = []
            for _ in requests:
                ids = tokenizer.encode(self.moves[self.calls] + "<|im_end|>", add_special_tokens=False)
                self.calls += 1
                future: Future[Generation] = Future()
                future.set_result(Generation(ids, [-1.0] * len(ids), FinishReason.STOP))
                out.append(future)
            return out

    [rollout] = batch_rollout(["maze-0"], MazeEnv, ChatMLProcessor(), tokenizer, Fixed("WEESE"))
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == pytest.approx(GOAL - 5 * STEP_COST)
    assert [t.anchor for t in rollout.turns] == ["(1,0)", "(0,0)", "(1,0)", "(2,0)", "(2,1)"]
    credit = EpisodeCredit.from_rollout(rollout)
    assert credit.anchors[0] == credit.anchors[2]  # the start cell, at reset and when walked back to
    _, groups = GiGPO().step_advantages([credit])
    assert groups == 1


def test_training_smoke_run_with_the_tiny_model(tmp_path):
    result = main(["--model", "tiny", "--steps", "2", "--credit", "gigpo", "--out", str(tmp_path)])
    assert len(result["rewards"]) == 2 and len(result["success"]) == 2 and result["wall_s"] > 0
    saved = json.loads((tmp_path / "rewards_gigpo_seed0.json").read_text())
    assert saved["rewards"] == result["rewards"] and saved["credit"] == "gigpo"
    lines = (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 16 and "Cell (1,0). Exits: E, W." in json.loads(lines[0])["conversation"]
    assert (tmp_path / "reward_gigpo_seed0.png").stat().st_size > 5_000
