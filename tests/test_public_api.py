"""The public API is what the docs import: every name of ``trl_env.__all__`` imports and has its API page entry, every
import in the docs' and examples' code resolves from a public module, and every error is a ``TrlEnvError``."""

import ast
import builtins
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trl_env
from trl_env.errors import TrlEnvError

ROOT = Path(__file__).parent.parent
PUBLIC_MODULES = ("trl_env", "trl_env.adapters", "trl_env.sandbox", "trl_env.testing")
"""Where users import from: the API, other libraries' envs, the sandbox, and test support (with its submodules)."""


def code_blocks(page: Path) -> list[str]:
    """The ```python blocks of a Markdown page."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def trl_env_imports(code: str) -> list[tuple[str, str]]:
    """(module, name) for each ``from trl_env... import name`` in ``code`` (``import trl_env.x`` as (module, ""))."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a block marked "not run" may elide code (`...` arguments): read its import lines alone
        lines = re.findall(r"^(?:from trl_env[\w.]* import \([^)]*\)|(?:from|import) trl_env.*)$", code, re.M)
        tree = ast.parse("\n".join(line.split("#")[0].rstrip() for line in lines))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trl_env":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "trl_env"]
    return found


def docs_imports() -> list[tuple[str, str, str]]:
    """(where, module, name) for every trl_env import in the README's and docs' code blocks and in the examples."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, code in enumerate(code_blocks(page)):
            out += [(f"{page.relative_to(ROOT)} block {i}", m, n) for m, n in trl_env_imports(code)]
    for script in sorted((ROOT / "experiment").rglob("*.py")):
        out += [(str(script.relative_to(ROOT)), m, n) for m, n in trl_env_imports(script.read_text())]
    return out


@pytest.mark.parametrize("name", trl_env.__all__)
def test_every_public_name_imports(name):
    assert getattr(importlib.import_module("trl_env"), name) is not None
    namespace: dict = {}
    exec(f"from trl_env import {name}", namespace)
    assert namespace[name] is getattr(trl_env, name)


def test_every_public_name_has_an_api_page_entry():
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: trl_env\.(\w+)\s*$", pages, re.M))
    missing = sorted(set(trl_env.__all__) - documented)
    assert not missing, f"names of trl_env.__all__ with no '::: trl_env.NAME' entry in docs/api/: {missing}"


def test_the_docs_and_examples_import_only_public_names_that_exist():
    imports = docs_imports()
    assert len(imports) > 50  # the walk found the docs' imports
    deep = [(where, m) for where, m, _ in imports if m not in PUBLIC_MODULES and not m.startswith("trl_env.testing.")]
    assert not deep, f"imports from a module that is not public ({PUBLIC_MODULES}): {deep}"
    unresolved = []
    for where, module, name in imports:
        try:
            imported = importlib.import_module(module)
            if name and name != "*":
                getattr(imported, name)
        except (ImportError, AttributeError) as e:
            unresolved.append((where, module, name, repr(e)))
    assert not unresolved, unresolved


def test_every_public_module_lists_names_that_exist():
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)] == [], module_name


def test_the_processor_registry_is_read_only_from_outside():
    names = trl_env.processor_names()
    assert "chatml" in names and "qwen3" in names
    assert not hasattr(trl_env, "PROCESSORS")
    with pytest.raises(AttributeError):
        names.append("mine")  # a tuple: a caller cannot register into the library's registry by accident
    assert trl_env.get_processor("chatml").__class__ is trl_env.ChatMLProcessor


def builtin_exception(name: str) -> bool:
    return isinstance(getattr(builtins, name, None), type) and issubclass(getattr(builtins, name), BaseException)


def test_every_error_the_package_defines_is_a_trl_env_error():
    """A class deriving from a builtin exception, anywhere in src/trl_env, derives from TrlEnvError too."""
    errors = importlib.import_module("trl_env.errors")
    ours = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, TrlEnvError)}
    outside = []
    for path in sorted((ROOT / "src" / "trl_env").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases
            }
            if node.name != "TrlEnvError" and any(map(builtin_exception, bases)) and not bases & ours:
                outside.append(f"{path.relative_to(ROOT)}: {node.name}{sorted(bases)}")
    assert not outside, f"errors outside the TrlEnvError tree: {outside}"


def test_wire_errors_are_trl_env_errors_and_pickle():
    import pickle

    from trl_env.agents.wire import WireError

    error = WireError(409, "this episode has ended", code="episode_ended")
    assert isinstance(error, TrlEnvError)
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.status, clone.message, clone.code, str(clone)) == (
        409,
        "this episode has ended",
        "episode_ended",
        str(error),
    )


def test_import_is_light():
    """``import trl_env`` (and what an env worker process imports) loads neither torch, transformers nor trl.

    Each isolated env's worker process imports ``trl_env.rollout.isolation``; a torch import there costs seconds of CPU
    and hundreds of MB per worker. Only the lazy names (``TransformersGenerator``, ``EpisodeGRPOTrainer``,
    ``LoraSnapshots``) need them, and they load them when first used.
    """
    code = (
        "import sys, trl_env, trl_env.adapters, trl_env.rollout.isolation, trl_env.train.grpo\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert trl_env.TransformersGenerator.__name__ == 'TransformersGenerator'\n"
        "assert trl_env.EpisodeGRPOTrainer.__name__ == 'EpisodeGRPOTrainer'\n"
        "assert 'torch' in sys.modules and 'trl' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
