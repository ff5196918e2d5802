"""Smoke tests of benchmarks/: each script's --quick mode runs, prints a markdown table and writes its PNG and JSON.

Timing targets live in the benchmarks (benchmarks/README.md), never here: these only check that the scripts
work. bench_scheduling runs against the session's real vLLM server fixture (skipped without .venv-vllm unless
TRL_ENV_REQUIRE_VLLM=1); bench_scale's --quick mode uses its local stand-in server and bench_turn_cost needs
no server, so both run everywhere. bench_async starts its own vLLM server with LoRA enabled (it needs the
trainer's adapter sync), so it needs .venv-vllm too. bench_credit trains the tiny model in process (no server).
bench_sandbox needs what the sandbox needs (Linux, bubblewrap, root or user namespaces) and the git history (it
extracts the sandbox at 37d30fd with git archive); it is skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def run_quick(script: str, out: Path, *args: str, timeout: float = 120) -> str:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    stem = script.removesuffix(".py")
    assert "|---|" in proc.stdout, proc.stdout  # a markdown table
    assert (out / f"{stem}.png").stat().st_size > 10_000
    json.loads((out / f"{stem}.json").read_text())
    return proc.stdout


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


def test_bench_async_quick_sync_against_async_trainer(vllm_server, tmp_path):
    """Sync GRPOTrainer + rollout_func against AsyncGRPOTrainer + the trl-env worker (own LoRA server)."""
    text = run_quick("bench_async.py", tmp_path, timeout=420)
    assert "sync" in text and "async" in text, text


def test_bench_credit_quick_trains_every_estimator_side_by_side(tmp_path):
    """Turn-level credit on the text maze: 2 steps per estimator with the tiny model, no server."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_credit.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    for credit in ("episode", "discounted", "gigpo", "per_turn_index"):
        assert f"| `{credit}` |" in proc.stdout, proc.stdout
    data = json.loads((tmp_path / "credit.json").read_text())
    assert sorted(r["credit"] for r in data["runs"]) == ["discounted", "episode", "gigpo", "per_turn_index"]
    assert all(len(r["rewards"]) == 2 and len(r["success"]) == 2 for r in data["runs"])
    assert len({r["rewards"][0] for r in data["runs"]}) == 1  # same seed: the same first batch under every estimator
    assert (tmp_path / "credit_curves.png").stat().st_size > 10_000
    assert "final reward" in (tmp_path / "credit.md").read_text()


def test_bench_sandbox_quick_times_the_current_sandbox_against_an_older_revision(tmp_path):
    """Sandbox.run: the current source and the sandbox at 37d30fd (git archive), 2 interleaved runs each."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the sandbox is Linux-only")
    if subprocess.run(
        ["git", "cat-file", "-e", "37d30fd:src/trl_env/sandbox"], cwd=REPO, capture_output=True
    ).returncode:
        pytest.skip("no git history with 37d30fd here (the benchmark extracts the older sandbox from it)")
    from trl_env.errors import SandboxUnavailableError
    from trl_env.sandbox import Sandbox

    try:
        Sandbox().run("pass")
    except SandboxUnavailableError as e:
        pytest.skip(f"no sandbox here: {e}")
    text = run_quick("bench_sandbox.py", tmp_path)
    assert "| pass | 37d30fd (--against) | 2 |" in text and "| sum loop 10**5 | current (" in text, text
    data = json.loads((tmp_path / "bench_sandbox.json").read_text())
    assert data["against"] == "37d30fd" and len(data["results"]) == 4
    assert all(len(r["wall_ms"]) == 2 and min(r["wall_ms"]) > 0 for r in data["results"]), data
