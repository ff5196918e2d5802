"""Issue 47 item 4: scripts/test.sh installs once (a stamp of pyproject.toml and the install scripts) and builds
.venv-vllm only when the selected tests need a real vLLM server (or the whole suite runs, or CI requires it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location("test_plan", ROOT / "scripts" / "test_plan.py")
assert spec is not None and spec.loader is not None
plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan)


def test_vllm_is_built_only_for_tests_that_use_the_server():
    assert plan.needs_vllm([], {})  # the whole suite
    assert plan.needs_vllm(["-x", "-q"], {})  # options only: still the whole suite
    assert not plan.needs_vllm(["tests/test_errors.py", "tests/test_public_api.py"], {})
    assert not plan.needs_vllm(["tests/test_errors.py::test_x", "-k", "name"], {})
    assert plan.needs_vllm(["tests/test_errors.py", "tests/test_vllm_integration.py"], {})
    assert plan.needs_vllm(["tests/test_vllm_integration.py::test_x"], {})
    assert plan.needs_vllm(["tests"], {})  # a folder holding server tests
    assert plan.needs_vllm(["tests/test_errors.py"], {"TRL_ENV_REQUIRE_VLLM": "1"})  # CI (.ci/run) always builds it
    assert not plan.needs_vllm([], {"TRL_ENV_SKIP_VLLM": "1"})


def test_the_install_runs_again_only_when_its_inputs_change(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts" / "install.sh").write_text("echo install\n")
    assert plan.needs_install(tmp_path)  # no .venv yet
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".trl_env_install_stamp").write_text(plan.install_hash(tmp_path))
    assert not plan.needs_install(tmp_path)
    (tmp_path / "scripts" / "install.sh").write_text("echo install, changed\n")
    assert plan.needs_install(tmp_path)
    (tmp_path / ".venv" / ".trl_env_install_stamp").write_text(plan.install_hash(tmp_path))
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + "\n# changed\n")
    assert plan.needs_install(tmp_path)


def test_the_plan_prints_what_test_sh_reads():
    env = {k: v for k, v in os.environ.items() if k not in ("TRL_ENV_REQUIRE_VLLM", "TRL_ENV_SKIP_VLLM")}  # CI sets one
    done = subprocess.run(
        [sys.executable, "scripts/test_plan.py", "tests/test_errors.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.split()
    assert done.returncode == 0 and lines[1] == "vllm=no" and lines[0] in ("install=yes", "install=no")
    assert "test_plan.py" in (ROOT / "scripts" / "test.sh").read_text()
