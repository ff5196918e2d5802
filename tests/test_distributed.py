"""Two processes (torchrun, CPU/gloo): a failure in process 0's first row ends only its episode; whole-run metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "dist_grpo.py"


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(), reason="no torchrun"
)
def test_two_process_grpo_survives_a_reset_failure_in_process_0_row_0_and_logs_the_whole_runs_error_rate(tmp_path):
    out = tmp_path / "log.json"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(SCRIPT), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2
    steps = [h for h in result["log_history"] if "env/error_env_exception_rate" in h]
    assert len(steps) == 2  # training completed both steps
    for h in steps:
        # one failed row out of 8 (4 per process): process 0 alone would say 0.25
        assert h["env/error_env_exception_rate"] == pytest.approx(1 / 8)
        assert h["env/ending_error_rate"] == pytest.approx(1 / 8)
