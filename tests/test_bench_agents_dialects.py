"""bench_agents --scripted's dialect paths (issue 45, cost): the same 4-turn agent program on the Responses API and on
Anthropic Messages beside the chat route, the trainer-process CPU per call of each, no server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_bench_agents_scripted_measures_each_dialect_beside_the_chat_route(tmp_path):
    pytest.importorskip("anthropic")
    paths = ["env", "agent", "agent-responses", "agent-messages"]
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_agents.py"),
            "--scripted",
            "--quick",
            "--out",
            str(tmp_path),
            "--paths",
            *paths,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
    )
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    saved = json.loads((tmp_path / "bench_agents_scripted.json").read_text())
    for path in paths:
        (run,) = saved["runs"][f"{path} 4"]
        assert run["requests"] >= 2 and run["cpu"] > 0.0, (path, run)  # every turn of every episode sampled
    for path in paths[1:]:
        assert f"| 4 | {path} | " in proc.stdout, proc.stdout  # its CPU per call, beside the chat route's
        assert len(saved["latency_ms"][f"{path} 4" if path != "agent" else "4"]) == 6
