"""The package layout's rules, checked on the source: arrows only downward, no private imports, `# fmt: skip` on tables.

Layers of ``src/trl_env``, bottom to top (a module may import its own layer and the ones below it):

    errors, env  ->  backends  ->  seats  ->  render  ->  rollout  ->  agents, adapters, sandbox  ->  train  ->  tools

(``seats`` sits above ``backends``: a ``Frozen`` seat is played by a ``Generator``; the engine side of a game,
``rollout/match.py``, is in ``rollout``.)

``trl_env/__init__.py`` (the public API) and the kept import paths at the root (``trl_env/openenv.py``) sit above
everything; ``testing`` is test support: no library module imports it. Every import counts, also one inside a
function or under ``TYPE_CHECKING``: a lazy import is still an arrow.

``ALLOWED_*`` list today's exceptions in code others are reshaping; each entry is a debt: shrink them, never grow them.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trl_env"

LAYERS = {
    "errors": 0, "env": 0, "cache": 0,
    "backends": 1,
    "seats": 2,
    "render": 3,
    "rollout": 4,
    "agents": 5, "adapters": 5, "sandbox": 5,
    "train": 6,
    "tools": 7,
    "testing": 8,
    "openenv": 9, "__init__": 9,
}  # fmt: skip
"""Each top-level module or package of trl_env -> its layer (the table above). A new one must be placed here."""

ALLOWED_PRIVATE: set[tuple[str, str]] = set()
"""(importing module, imported module.name) pairs still allowed to import a private name: shrink this list."""

ALLOWED_UPWARD = {
    # tools/cli.py (being edited by another change): `trl-env check` builds the stand-in tokenizers and tiny model
    ("trl_env.tools.cli", "trl_env.testing.models"),
    ("trl_env.tools.cli", "trl_env.testing.templates"),
    ("trl_env.tools.cli", "trl_env.testing.tokenizers"),
    # train/grpo.py: the training path runs the CLI's additivity check (issue 43: training code -> CLI)
    ("trl_env.train.grpo", "trl_env.tools.additivity"),
}
"""(importing module, imported module) pairs still allowed to point upward or into testing: shrink this list."""


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module, dotted (``trl_env.rollout.engine``)."""
    target: str
    """The imported module, dotted (a ``from M import N`` of a submodule N is M.N)."""
    name: str | None
    """The imported name, for ``from M import name`` of a name that is not a module."""
    line: int


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


def is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> list[Import]:
    importer = module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [Import(importer, a.name, None, node.lineno) for a in node.names if a.name.startswith("trl_env")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("trl_env"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if is_module(sub):
                    out.append(Import(importer, sub, None, node.lineno))
                else:
                    out.append(Import(importer, node.module or "", a.name, node.lineno))
    return out


def all_imports() -> list[Import]:
    return [i for path in sorted(SRC.rglob("*.py")) for i in imports_of(path)]


def layer(dotted: str) -> int:
    parts = dotted.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYERS, f"{dotted}: place trl_env.{top} in a layer (LAYERS in tests/test_layout.py)"
    return LAYERS[top]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports() -> set[tuple[str, str, int]]:
    found = set()
    for i in all_imports():
        private_part = any(is_private(p) for p in i.target.split("."))
        if i.name is not None and is_private(i.name) and i.target != i.importer:
            found.add((i.importer, f"{i.target}.{i.name}", i.line))
        elif private_part:
            found.add((i.importer, i.target, i.line))
    return found


def upward_imports() -> set[tuple[str, str, int]]:
    found = set()
    for i in all_imports():
        into_testing = i.target.split(".")[1:2] == ["testing"] and not i.importer.startswith("trl_env.testing")
        if layer(i.importer) < layer(i.target) or into_testing:
            found.add((i.importer, i.target, i.line))
    return found


def test_no_module_imports_another_modules_private_names():
    found = sorted(f"{a} imports {b} (line {n})" for a, b, n in private_imports() if (a, b) not in ALLOWED_PRIVATE)
    assert not found, "make the name public (a real API) or keep the code in one module:\n" + "\n".join(found)


def test_imports_point_only_downward_and_no_library_module_imports_testing():
    found = sorted(f"{a} imports {b} (line {n})" for a, b, n in upward_imports() if (a, b) not in ALLOWED_UPWARD)
    assert not found, f"an arrow up the layers (see {__name__}'s docstring):\n" + "\n".join(found)


def test_the_allow_lists_hold_only_live_exceptions():
    live_private = {(a, b) for a, b, _ in private_imports()}
    live_upward = {(a, b) for a, b, _ in upward_imports()}
    stale = sorted((ALLOWED_PRIVATE - live_private) | (ALLOWED_UPWARD - live_upward))
    assert not stale, f"fixed: remove from the allow-list in tests/test_layout.py: {stale}"


LITERAL_CALLS = {"frozenset", "tuple", "set", "dict", "list"}


def is_literal_data(node: ast.expr) -> bool:
    """Constants and displays of them (nested), a name or attribute as a value, and frozenset/tuple/... of those."""
    if isinstance(node, (ast.Constant, ast.Name, ast.Attribute)):
        return True
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(is_literal_data(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is None or is_literal_data(k) for k in node.keys) and all(is_literal_data(v) for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LITERAL_CALLS:
        return not node.keywords and all(is_literal_data(a) for a in node.args)
    return False


def fmt_skips_off_tables(source: str) -> list[int]:
    """Lines whose ``# fmt: skip`` does not close an assignment of literal data (a table), the one place it may be.

    The rule: the marker sits on the last line of a simple statement ``NAME = <literal data>`` (or annotated), where
    literal data is constants, names and displays of them, nested (``is_literal_data``). Anywhere else (a call, a
    return, a compound statement's header, an expression) the formatter lays the code out.
    """
    marked = [
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and "fmt: skip" in tok.string
    ]
    tables = set()
    for node in ast.walk(ast.parse(source)):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is not None and is_literal_data(value):
            tables.add(node.end_lineno)
    return [line for line in marked if line not in tables]


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("X = (\n    1, 2,\n    3,\n)  # fmt: skip\n", []),
        ('X = {"a": 1,   "b": (2, -3)}  # fmt: skip\n', []),
        ('X = frozenset({"a",   "b"})  # fmt: skip\n', []),
        ("x = f(1,\n      2)  # fmt: skip\n", [2]),
        ("def f():\n    return dict(a=1,\n                b=2)  # fmt: skip\n", [3]),
        ("for x in [1,\n          2]:  # fmt: skip\n    pass\n", [2]),
        ("raise ValueError('a'\n                 'b')  # fmt: skip\n", [2]),
    ],
)
def test_the_fmt_skip_rule_allows_tables_only(source, bad):
    assert fmt_skips_off_tables(source) == bad


ALLOWED_FMT_SKIP: dict[str, int] = {}
"""Files that may still hold markers off tables, and how many (none left)."""


def fmt_skip_counts() -> dict[str, int]:
    counts = {}
    for path in sorted(SRC.rglob("*.py")):
        bad = fmt_skips_off_tables(path.read_text())
        if bad:
            counts[str(path.relative_to(SRC))] = len(bad)
    return counts


def test_fmt_skip_only_on_tables():
    over = {f: n for f, n in fmt_skip_counts().items() if n > ALLOWED_FMT_SKIP.get(f, 0)}
    assert not over, f"`# fmt: skip` off a literal table (rule: fmt_skips_off_tables): remove it, `ruff format`: {over}"


def test_the_fmt_skip_allowance_shrinks_with_the_code():
    counts = fmt_skip_counts()
    stale = {f: (n, counts.get(f, 0)) for f, n in ALLOWED_FMT_SKIP.items() if counts.get(f, 0) < n}
    assert not stale, f"fewer markers now (allowed, found): lower ALLOWED_FMT_SKIP in tests/test_layout.py: {stale}"


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py, helpers in modules not named ``test_*`` (helpers.py, *_support.py)."""
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{path.relative_to(tests)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[-1].startswith("test_")
            ]
    assert not found, "move what is shared to conftest.py or a support module:\n" + "\n".join(found)
