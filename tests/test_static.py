"""The library's code stays lint-clean, type-checks (mypy, non-strict) and has no import cycles."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ruff over the repository and mypy over src (about a minute of CPU)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "trl_env"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean():
    done = run("ruff", "check", "src", "tests", "experiment", "benchmarks")
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.skipif(shutil.which("mypy") is None and run("mypy", "--version").returncode, reason="mypy missing")
def test_mypy_is_clean_on_src():
    done = run("mypy", "src")
    assert done.returncode == 0, done.stdout[-3000:]


def module_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]  # module level only
        graph[name] = {
            alias.name if isinstance(n, ast.Import) else (n.module or "")
            for n in top
            for alias in n.names
            if (alias.name if isinstance(n, ast.Import) else (n.module or "")).startswith("trl_env")
        }
    return graph


def test_no_import_cycles_at_module_level():
    graph = module_imports()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
