"""What ``scripts/test.sh`` must install before it runs pytest with the given arguments (stdlib only).

``python3 scripts/test_plan.py [PYTEST ARGS]`` prints two lines, ``install=yes|no`` and ``vllm=yes|no``:
- install: whether ``scripts/install.sh`` must run: ``.venv``'s stamp (a hash of pyproject.toml and the install
  scripts, written after a successful install) differs from the current one, or there is no ``.venv``;
- vllm: whether ``.venv-vllm`` is needed: ``TRL_ENV_REQUIRE_VLLM=1`` (CI) always; ``TRL_ENV_SKIP_VLLM=1`` never;
  otherwise when no test file is named (the whole suite) or a named test file (or a file under a named folder) uses
  the real-server fixtures of ``tests/vllm_server.py``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / ".venv" / ".trl_env_install_stamp"
SERVER_MARKS = ("vllm_server", "vllm_tiny_model")


def install_hash(root: Path = ROOT) -> str:
    """A hash of what decides the install: pyproject.toml and the install scripts (``scripts/install*.sh``)."""
    digest = hashlib.sha256()
    for path in [root / "pyproject.toml", *sorted((root / "scripts").glob("install*.sh"))]:
        name = str(path.relative_to(root))
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return digest.hexdigest()


def needs_install(root: Path = ROOT) -> bool:
    """Whether ``scripts/install.sh`` must run: no stamp, or a stamp of other inputs."""
    stamp = root / ".venv" / ".trl_env_install_stamp"
    return not stamp.exists() or stamp.read_text().strip() != install_hash(root)


def uses_server(path: Path) -> bool:
    """Whether a test file (or any test file under a folder) uses tests/vllm_server.py's fixtures."""
    files = sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
    return any(any(mark in f.read_text(errors="replace") for mark in SERVER_MARKS) for f in files if f.is_file())


def needs_vllm(args: Sequence[str], env: Mapping[str, str], root: Path = ROOT) -> bool:
    """Whether the selected tests need ``.venv-vllm`` (see the module docstring)."""
    if env.get("TRL_ENV_REQUIRE_VLLM") == "1":
        return True
    if env.get("TRL_ENV_SKIP_VLLM") == "1":
        return False
    paths = [root / a.split("::")[0] for a in args if not a.startswith("-") and (root / a.split("::")[0]).exists()]
    if not paths:
        return True  # no test file named: the whole suite
    return any(uses_server(p) for p in paths)


if __name__ == "__main__":
    argv = sys.argv[1:]
    print(f"install={'yes' if needs_install() else 'no'}")
    print(f"vllm={'yes' if needs_vllm(argv, os.environ) else 'no'}")
