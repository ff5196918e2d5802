"""A short soak (benchmarks/bench_soak.py): consecutive batch_rollout calls whose envs and agent programs raise, hang
and exit come back to baseline: no thread, fd, child process or gateway key grows after the warm-up, but the one
thread of each forever-hung call on threads (issue 46)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_soak  # noqa: E402


@pytest.mark.parametrize("path", ["env-thread", "env-process", "agent-thread", "agent-process"])
def test_a_short_soak_comes_back_to_baseline(tokenizer, path):
    if path.startswith("agent"):
        pytest.importorskip("openai")
    result = bench_soak.soak(
        path,
        tokenizer,
        batches=4,
        episodes=len(bench_soak.AGENT_PROCESS_KINDS) + 1,
        env_timeout=0.5,
        settle_s=bench_soak.HANG_S + 1.0,
        warmup=1,
        log=lambda line: None,
    )
    assert not bench_soak.leaks(result), bench_soak.table([result])
