"""The discrete-log (code tool in a sandbox) and reach-target (per-turn shaping) examples: rules and smoke runs."""

from __future__ import annotations

import json
import random
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from trl_env import ChatMLProcessor, Ending, Generation, batch_rollout
from trl_env.backends.base import FinishReason
from trl_env.sandbox import Sandbox

EXAMPLES = Path(__file__).parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))

from discrete_log import DiscreteLogEnv, primitive_root  # noqa: E402  # the examples folder is not a package
from reach_target import BONUS, INVALID, STEP_COST, ReachTargetEnv  # noqa: E402

pytestmark = pytest.mark.slow  # runs the example scripts

FAST = Sandbox(cpu_seconds=1, wall_seconds=10, memory_bytes=128 * 2**20, max_output_bytes=1000)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")


def fresh(seed: str, **kwargs) -> DiscreteLogEnv:
    env = DiscreteLogEnv(sandbox=FAST, **kwargs)
    env.reset(seed)
    return env


def brute_force(env: DiscreteLogEnv) -> str:
    return f"<code>\nprint(next(x for x in range({env.p}) if pow({env.g}, x, {env.p}) == {env.h}))\n</code>"


# -- discrete log: rules ----------------------------------------------------------------------------------


def test_discrete_log_problem_comes_from_the_seed_and_is_well_posed():
    a, b = fresh("dlog-3"), fresh("dlog-3")
    assert (a.p, a.g, a.h, a.secret) == (b.p, b.g, b.h, b.secret)
    assert (a.p, a.g) != (fresh("dlog-4").p, fresh("dlog-4").g)
    assert all(a.p % d for d in range(2, a.p)) and pow(a.g, a.secret, a.p) == a.h
    assert len({pow(a.g, k, a.p) for k in range(a.p - 1)}) == a.p - 1  # g generates the whole group
    assert primitive_root(7, random.Random(0)) in (3, 5)


def test_discrete_log_correct_answer_wins_and_any_equivalent_exponent_counts():
    env = fresh("dlog-1")
    _, delta = env.step(f"I think <answer>{env.secret}</answer>")
    assert delta == "Correct!" and not env.alive and env.reward == 1.0
    env = fresh("dlog-1")
    env.step(f"<answer>{env.secret + env.p - 1}</answer>")
    assert env.reward == 1.0


def test_discrete_log_wrong_or_malformed_answers_get_partial_credit_and_end_the_episode():
    env = fresh("dlog-1")
    _, delta = env.step(f"<answer>{env.secret + 1}</answer>")
    assert not env.alive and env.reward == pytest.approx(0.1) and str(env.secret) in delta
    env = fresh("dlog-1")
    env.step("<answer>about seven</answer>")
    assert not env.alive and env.reward == 0.0


def test_discrete_log_turn_without_a_tag_costs_and_explains_the_format():
    env = fresh("dlog-1", max_turns=2)
    _, delta = env.step("Let me think about it.")
    assert "<code>" in delta and "<answer>" in delta and env.alive and env.reward == pytest.approx(-0.1)
    env.step("still thinking")
    assert not env.alive and env.reward == pytest.approx(-0.2)


@linux_only
@pytest.mark.parametrize("fence", ["tag", "markdown"])
def test_discrete_log_code_runs_in_the_sandbox_and_its_output_is_the_observation(fence):
    env = fresh("dlog-2")
    code = brute_force(env)
    if fence == "markdown":
        code = code.replace("<code>", "```python").replace("</code>", "```")
    _, delta = env.step(code)
    assert delta.startswith(f"Tool output:\n{env.secret}\n") and "2 turns left" in delta
    assert env.alive and env.reward == pytest.approx(0.2)  # partial credit for code that ran
    env.step(f"<answer>{env.secret}</answer>")
    assert env.reward == 1.0 and not env.alive


@linux_only
def test_discrete_log_code_errors_come_back_as_tool_errors():
    env = fresh("dlog-2")
    _, delta = env.step("<code>\nx = 1\n1 / 0\n</code>")
    assert delta.startswith("Tool error (error):") and "ZeroDivisionError: division by zero" in delta
    assert env.alive and env.reward == 0.0


ESCAPES = {
    "write-outside": ("open({target!r}, 'w').write('escaped')", "refused"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", "refused"),
    "fork-bomb": ("import os\nwhile True:\n    os.fork()", "refused"),
    "memory": ("x = bytearray(10**10)", "memory"),
    "loop-forever": ("while True:\n    pass", "timeout"),
}


@linux_only
@pytest.mark.parametrize(("code", "status"), ESCAPES.values(), ids=ESCAPES.keys())
def test_discrete_log_sandbox_escapes_are_tool_error_observations_not_exceptions(tmp_path, code, status):
    target = tmp_path / "escaped.txt"
    env = fresh("dlog-5")
    env, delta = env.step(f"<code>\n{code.format(target=str(target))}\n</code>")
    assert delta.startswith(f"Tool error ({status}):") and env.alive and env.reward == 0.0
    assert not target.exists()


class FixedTextGenerator:
    """Answers every turn with the next of ``texts`` (then the last one again), ending it with <|im_end|>."""

    continuous = False

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

    def submit(self, requests):
        futures = []
        for _ in requests:
            text = self.texts[min(self.calls, len(self.texts) - 1)] + "<|im_end|>"
            self.calls += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            future: Future[Generation] = Future()
            future.set_result(Generation(ids, [-1.0] * len(ids), FinishReason.STOP))
            futures.append(future)
        return futures


@linux_only
def test_discrete_log_escape_attempt_through_the_engine_is_an_observation_and_the_episode_goes_on(tokenizer, tmp_path):
    target = tmp_path / "escaped.txt"
    env = fresh("dlog-9")
    texts = [f"<code>open({str(target)!r}, 'w').write('x')</code>", f"<answer>{env.secret}</answer>"]
    [rollout] = batch_rollout(
        ["dlog-9"], DiscreteLogEnv, ChatMLProcessor(), tokenizer, FixedTextGenerator(tokenizer, texts)
    )
    assert rollout.ending is Ending.ENV_DONE and rollout.error == "" and len(rollout.turns) == 2
    assert rollout.turns[0].delta.startswith("Tool error (refused): open") and rollout.reward == 1.0
    assert not target.exists()


# -- reach target: rules ------------------------------------------------------------------------------------


def test_reach_target_game_comes_from_the_seed():
    a, b = ReachTargetEnv(), ReachTargetEnv()
    _, delta = a.reset("walk-3")
    b.reset("walk-3")
    assert (a.start, a.target) == (b.start, b.target) and 1 <= a.start <= 9 and 20 <= a.target <= 60
    assert f"Start at {a.start} and reach {a.target}" in delta


def test_reach_target_each_move_is_rewarded_for_the_distance_it_closes():
    env = ReachTargetEnv()
    env.reset("walk-3")
    start = env.start
    _, delta = env.step("+9")
    expected = env.potential(start + 9) - env.potential(start) - STEP_COST
    assert env.number == start + 9 and env.reward == pytest.approx(expected) and expected > 0
    assert f"{start} + 9 = {start + 9}" in delta and f"{expected:+.2f}" in delta
    before = env.reward
    env.step("-3")  # moving away is penalised by the same potential
    step = env.potential(start + 6) - env.potential(start + 9) - STEP_COST
    assert env.reward - before == pytest.approx(step) and step < 0


def test_reach_target_a_clean_solve_in_k_moves_scores_one_minus_the_step_costs():
    env = ReachTargetEnv(max_turns=10)
    env.reset("walk-7")
    while env.alive:
        env.step(f"+{min(9, env.target - env.number)}")
    k = env.turns
    assert env.number == env.target and env.reward == pytest.approx(1 - STEP_COST * k)
    assert k == -(-(env.target - env.start) // 9)


def test_reach_target_invalid_moves_cost_and_change_nothing():
    env = ReachTargetEnv(max_turns=2)
    env.reset("walk-1")
    for reply in ["I would like to move", "+12"]:
        number = env.number
        _, delta = env.step(reply)
        assert env.number == number and "No valid move" in delta
    assert env.reward == pytest.approx(-2 * INVALID) and not env.alive


def test_reach_target_per_turn_rewards_telescope_to_the_end_state():
    rng = random.Random(0)
    for game in range(30):
        env = ReachTargetEnv()
        env.reset(f"walk-{game}")
        valid = invalid = 0
        while env.alive:
            reply = rng.choice(["+", "-", "*", "?"]) + str(rng.randint(0, 9))
            env.step(reply)
            ok = reply[0] != "?" and reply[1] != "0"
            valid, invalid = valid + ok, invalid + (not ok)
        reached = env.number == env.target
        expected = env.potential(env.number) - env.potential(env.start) - STEP_COST * valid - INVALID * invalid
        assert env.reward == pytest.approx(expected + BONUS * reached)
        assert env.reward >= -0.5 - (STEP_COST + INVALID) * env.max_turns  # the potential is bounded


# -- training smoke runs (tiny model, one step) -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["discrete_log", "reach_target"])
def test_training_script_smoke(tmp_path, name):
    module = __import__(name)
    summary = module.main(["--model", "tiny", "--steps", "1", "--out", str(tmp_path)])
    assert summary["wall_s"] > 0
    assert len(json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]) == 1
    lines = (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["conversation"].startswith("<|im_start|>system")
