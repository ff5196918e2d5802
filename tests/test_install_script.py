"""scripts/install.sh shows what it does while pip runs (issue 47: "the install prints nothing for minutes"): a
header per step with the seconds since the start, pip's own progress (one line per package fetched or built), and
nothing for what is already installed. Run against stand-in ``python`` and ``pip`` that log their arguments."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent

PIP = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$LOG"
echo "Requirement already satisfied: numpy in ./site-packages"
echo "Collecting fresh-package==1.0"
echo "  Downloading fresh_package-1.0-py3-none-any.whl (12 kB)"
echo "DEPRECATION: something is ignored"
echo "Building wheel for jericho (pyproject.toml): started"
"""
PYTHON = """#!/usr/bin/env bash
case "$*" in *" -m venv "*|"-m venv "*) exit 0;; esac
exec python3 -c 'import sys; sys.exit(0)'
"""


def fake_venv(path: Path) -> None:
    (path / "bin").mkdir(parents=True)
    for name, text in [("pip", PIP), ("python", PYTHON)]:
        (path / "bin" / name).write_text(text)
        (path / "bin" / name).chmod(0o755)
    (path / "bin" / "activate").write_text(f'export PATH="{path / "bin"}:$PATH"\n')


def test_install_shows_step_headers_with_seconds_and_pips_progress(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    fake_venv(tmp_path / ".venv")
    fake_venv(tmp_path / ".venv-verifiers")
    log = tmp_path / "pip.log"
    done = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LOG": str(log), "HOME": str(tmp_path)},
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    headers = re.findall(r"^\[install\] (\d+) s: (.+)$", out, re.M)
    assert [h for _, h in headers][:2] == [
        "trl-env, test tools and the docs builder",
        "env libraries (textarena, reasoning-gym, textworld)",
    ], out
    assert "[install]   Collecting fresh-package==1.0" in out  # pip's progress, one line per package
    assert "[install]   Building wheel for jericho" in out
    assert "already satisfied" not in out and "is ignored" not in out and "Downloading" not in out
    long_steps = [line for line in log.read_text().splitlines() if " -e " in line]
    assert len(long_steps) == 2 and not any(" -q" in line for line in long_steps), long_steps  # progress not silenced
