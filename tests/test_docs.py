"""The docs site builds in strict mode (a broken link, nav entry or API reference fails) and its API reference covers
the public API: every name in `trl_env.__all__` and each integration's public names."""

import importlib
import inspect
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import trl_env

pytestmark = pytest.mark.slow  # runs every python block of the docs

ROOT = Path(__file__).parent.parent
INTEGRATIONS = ["train.grpo", "train.options", "train.episode_trainer", "train.metrics", "train.async_grpo"]
INTEGRATIONS += [
    "adapters.openenv",
    "adapters.textarena",
    "adapters.reasoning_gym",
    "adapters.textworld",
    "adapters.verifiers",
]


def public_names(module_name: str) -> list[str]:
    """`__all__` where the module has one, else the public classes and functions it defines itself."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == module_name
    ]


def inventory(site: Path) -> set[str]:
    """The identifiers the API reference rendered (mkdocstrings writes a Sphinx inventory, objects.inv)."""
    header_and_body = (site / "objects.inv").read_bytes().split(b"\n", 4)
    return {line.split()[0] for line in zlib.decompress(header_and_body[4]).decode().splitlines() if line}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]' (scripts/install.sh installs it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_docs_build_strict_and_cover_the_public_api(site):
    rendered = inventory(site)
    missing = [f"trl_env.{name}" for name in trl_env.__all__ if f"trl_env.{name}" not in rendered]
    for short in INTEGRATIONS:
        module = f"trl_env.{short}"
        missing += [f"{module}.{name}" for name in public_names(module) if f"{module}.{name}" not in rendered]
    assert not missing, f"not in the API reference (docs/api/): {missing}"


def test_readme_links_every_page():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    pages = {f"docs/{p.relative_to(ROOT / 'docs')}" for p in (ROOT / "docs").rglob("*.md")}
    assert not pages - linked, f"pages the README does not link to: {sorted(pages - linked)}"
    assert not linked - pages, f"README links to pages that do not exist: {sorted(linked - pages)}"


# Every ```python block in the README and docs/ runs here, unless the line right above its fence is a marker:
#   <!-- not run: REASON -->            (needs a GPU, a server, a model download, ...)
#   <!-- run by tests/FILE.py: ... -->  (executed by another test, e.g. the quick start by tests/test_readme.py)
# Pages being rewritten by another change carry their marks here until their own markers land.
MARKER = re.compile(r"^<!-- (not run: .+|run by tests/[\w/]+\.py.*) -->$")


def python_blocks() -> list[tuple[str, int, str | None, str]]:
    """(page, index of the block on the page, its marker or None, code) for each ```python block."""
    blocks = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines, name, index = page.read_text().splitlines(), str(page.relative_to(ROOT)), 0
        for i, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            above = lines[i - 1].strip() if i else ""
            marker = m.group(1) if (m := MARKER.match(above)) else None
            blocks.append((name, index, marker, "\n".join(lines[i + 1 : end]) + "\n"))
            index += 1
    return blocks


def test_every_marker_says_why():
    for page, index, marker, _ in python_blocks():
        if marker and marker.startswith("run by "):
            assert (ROOT / marker.split()[2].rstrip(":")).exists(), (page, index, marker)


def test_the_quick_start_copies_equal_the_readme():
    quick = {code for page, _, _, code in python_blocks() if "class Countdown(Env)" in code}
    assert len(quick) == 1, "getting-started.md's quick start differs from the README's (test_readme.py runs that)"


@pytest.mark.parametrize(
    "page,index,code",
    [pytest.param(p, i, c, id=f"{p}:{i}") for p, i, marker, c in python_blocks() if marker is None],
)
def test_snippet_runs(page, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}  # nothing given: a block runs as a reader pastes it
    exec(compile(code, f"{page} (python block {index})", "exec"), namespace)


def test_the_main_jobs_time_and_disk_are_stated_in_one_place():
    """One duration and one disk figure for `bash scripts/train.sh`, in getting-started's "What to expect"; the README
    and the example point there (they quoted ~15 min, about 7 minutes, 452 s and about 5 GB)."""
    guide = (ROOT / "docs" / "getting-started.md").read_text()
    section = guide[guide.index("## What to expect") :].split("\n## ")[0]
    assert "452 s" in section and "3.6 GB" in section and "tests/test_reproducible.py" in section
    example = (ROOT / "experiment" / "examples" / "guess_number.py").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "getting-started.md#what-to-expect" in readme and '"What to expect"' in example
    stale = re.compile(r"~15 min|about 7 minutes|about 5 GB")
    assert not [
        p
        for p, text in [("README.md", readme), ("getting-started.md", guide), ("guess_number.py", example)]
        if stale.search(text)
    ]
