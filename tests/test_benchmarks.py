"""Smoke tests of benchmarks/: each script's --quick mode runs, prints a markdown table and writes its PNG and JSON.

Timing targets live in the benchmarks (benchmarks/README.md), never here: these only check that the scripts
work. bench_scheduling runs against the session's real vLLM server fixture (skipped without .venv-vllm unless
TRL_ENV_REQUIRE_VLLM=1); bench_scale's --quick mode uses its local stand-in server and bench_turn_cost needs
no server, so both run everywhere. bench_async runs against the session's server too (LoRA enabled: it needs the
trainer's adapter sync). bench_credit trains the tiny model in process (no server).
bench_agents runs against the session's vLLM server too. bench_sandbox needs what the sandbox needs (Linux,
bubblewrap, root or user namespaces) and the git history (it extracts the sandbox at 37d30fd with git archive); it is
skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import BENCH, REPO, run_quick

pytestmark = pytest.mark.slow  # runs the benchmark scripts


def test_bench_turn_cost_quick(tmp_path):
    text = run_quick("bench_turn_cost.py", tmp_path)
    assert "Ratio 8192 / 512" in text


def test_bench_scale_quick_with_the_stand_in_server(tmp_path):
    text = run_quick("bench_scale.py", tmp_path, "--server", "stub")
    data = json.loads((tmp_path / "bench_scale.json").read_text())
    assert data["results"] and all(r["bad_episodes"] == 0 for r in data["results"]), text
    assert all(r["peak_sockets"] <= r["max_in_flight"] + 8 for r in data["results"]), text


def test_bench_scheduling_quick_against_vllm(vllm_server, tmp_path):
    text = run_quick("bench_scheduling.py", tmp_path, "--base-url", vllm_server.base_url)
    for variant in ("continuous", "lockstep", "sequential", "raw limit"):
        assert f"| {variant} |" in text


def test_bench_agents_quick_env_and_agent_side_by_side_against_vllm(vllm_server, tmp_path):
    """Issue 33 item 2's benchmark: the same task as an Env and as an openai-SDK agent through the gateway."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_agents.py"), "--quick", "--out", str(tmp_path), "--url",
         vllm_server.base_url],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "| 4 | " in proc.stdout and "added p50" in proc.stdout, proc.stdout
    saved = json.loads((tmp_path / "bench_agents.json").read_text())
    assert [r["requests"] >= 1 for r in saved["runs"]["agent 4"]] == [True]
    assert saved["latency_ms"]["4"]["added p50"] > 0.0


def test_bench_agents_scripted_quick_measures_cpu_per_call_without_a_server(tmp_path):
    """bench_agents --scripted: the same paths with an instant generator, the trainer-process CPU per call."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_agents.py"), "--scripted", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    saved = json.loads((tmp_path / "bench_agents_scripted.json").read_text())
    for path in ("env", "env-sdk", "agent", "agent-http"):
        (run,) = saved["runs"][f"{path} 4"]
        assert run["requests"] >= 2 and run["cpu"] > 0.0, (path, run)
        assert run["busy"] >= run["cpu"] * 0.5 - 0.05 and run["idle"] >= 0.0, (path, run)  # ours, to the clock tick
    assert "| 4 | agent | " in proc.stdout and "machine busy CPU s" in proc.stdout, proc.stdout
    assert "/ env-sdk" in proc.stdout and "/ env per round" in proc.stdout, proc.stdout


def test_bench_agents_sdk_env_makes_each_agent_call_through_the_real_openai_sdk(monkeypatch):
    """env-sdk's ``SdkEnv``: every step is one real ``chat.completions.create`` with the conversation so far (answered
    with the sampled text), the reply kept as the program keeps it; the observations are ``BenchEnv``'s."""
    import openai

    monkeypatch.syspath_prepend(str(BENCH))
    import bench_agents

    creates = []
    real = openai.resources.chat.completions.Completions.create
    monkeypatch.setattr(openai.resources.chat.completions.Completions, "create",
                        lambda self, **kw: creates.append(len(kw["messages"])) or real(self, **kw))  # fmt: skip
    env = bench_agents.SdkEnv(3)
    _, first = env.reset("s")
    observations = [env.step(f"reply {k}")[1] for k in range(3)]
    assert creates == [1, 3, 5] and not env.alive  # one create per step, with every message so far
    assert env.messages[0] == {"role": "user", "content": first}
    assert env.messages[1::2] == [{"role": "assistant", "content": f"reply {k}"} for k in range(3)]
    assert [m["content"] for m in env.messages[2::2]] == observations[:2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin needs 2 cores")
def test_bench_agents_pin_puts_the_server_on_core_0_and_itself_on_the_others(tmp_path):
    """--pin's pin_cores: the process listening at the URL (every thread) on the first core, the caller on the rest;
    a stand-in server (http.server) started here, in a child process so that this one keeps its cores."""
    cores = sorted(os.sched_getaffinity(0))
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...)"
        port = int(line.split(" port ")[1].split()[0])
        code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from _agents_machine import pin_cores; "
                "print(pin_cores(sys.argv[2])); print(sorted(os.sched_getaffinity(0)))")  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", code, str(BENCH), f"http://127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"pid {server.pid}" in proc.stdout, proc.stdout
        assert proc.stdout.splitlines()[-1] == str(cores[1:]), proc.stdout  # the caller: every core but the first
        assert os.sched_getaffinity(server.pid) == {cores[0]}, proc.stdout
    finally:
        server.kill()  # the one process this test started, by its id
        server.wait()


def test_bench_async_quick_sync_against_async_trainer(vllm_server, tmp_path):
    """Sync GRPOTrainer + rollout_func against AsyncGRPOTrainer + the trl-env worker, on the session's LoRA server
    (its --max-loras 3 is what max_staleness 1 needs; a server of the script's own would cost another cold start)."""
    text = run_quick("bench_async.py", tmp_path, "--base-url", vllm_server.base_url, timeout=420)
    assert "sync" in text and "async" in text, text


def test_bench_credit_quick_trains_every_estimator_side_by_side(tmp_path):
    """Turn-level credit on the text maze: 2 steps per estimator with the tiny model, no server."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_credit.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    labels = ["discounted", "discounted_g0.9", "episode", "gigpo", "per_turn_index"]
    for credit in labels:
        assert f"| `{credit}` |" in proc.stdout, proc.stdout
    data = json.loads((tmp_path / "credit.json").read_text())
    assert sorted(r["credit"] for r in data["runs"]) == labels
    assert all(len(r["rewards"]) == 2 and len(r["success"]) == 2 for r in data["runs"])
    assert len({r["rewards"][0] for r in data["runs"]}) == 1  # same seed: the same first batch under every estimator
    assert (tmp_path / "credit_curves.png").stat().st_size > 10_000
    assert "final reward" in (tmp_path / "credit.md").read_text()


@pytest.mark.parametrize("task", ["rounds", "loop", "early"])
def test_bench_credit_quick_on_each_credit_task(task, tmp_path):
    """``--task NAME`` (trl_env.testing.credit_tasks): 2 steps of two estimators, in two worker processes."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_credit.py"), "--quick", "--task", task, "--credits",
         "episode,discounted_g0", "--jobs", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    data = json.loads((tmp_path / f"credit_{task}.json").read_text())
    assert [r["credit"] for r in data["runs"]] in (["episode", "discounted_g0"], ["discounted_g0", "episode"])
    max_turns = {"rounds": 8, "loop": 12, "early": 10}[task]
    assert all(r["turns"] == [max_turns, max_turns] for r in data["runs"])  # no episode cut short by the budget
    assert len({r["rewards"][0] for r in data["runs"]}) == 1  # the same first batch under both estimators
    assert {q["credit"] for q in data["quality"]} == {"episode", "discounted_g0"}
    assert (tmp_path / f"credit_{task}_curves.png").stat().st_size > 10_000
    assert "| `discounted_g0` |" in (tmp_path / f"credit_{task}.md").read_text()
