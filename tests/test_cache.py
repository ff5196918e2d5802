"""One cache root: every cache folder of the package is below ``trl_env.cache.cache_root()``; the old one is read."""

from __future__ import annotations

import ast
from pathlib import Path

from trl_env.cache import cache_dir, cache_root

SRC = Path(__file__).resolve().parents[1] / "src" / "trl_env"


def test_no_module_but_trl_env_cache_names_a_cache_folder():
    named = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "cache.py" or path.parent != SRC
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == ".cache"  # Path.home() / ".cache" / ...
    ]
    assert not named, f"use trl_env.cache.cache_dir(name): {named}"


def test_every_cache_folder_is_below_one_root(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TRL_ENV_CACHE", raising=False)
    monkeypatch.delenv("TRL_ENV_TEXTWORLD_CACHE", raising=False)
    assert cache_root() == tmp_path / ".cache" / "trl_env"
    assert cache_dir("textworld", env_var="TRL_ENV_TEXTWORLD_CACHE") == tmp_path / ".cache" / "trl_env" / "textworld"
    monkeypatch.setenv("TRL_ENV_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir("tokenizers") == tmp_path / "elsewhere" / "tokenizers"
    monkeypatch.setenv("TRL_ENV_TEXTWORLD_CACHE", str(tmp_path / "games"))
    assert cache_dir("textworld", env_var="TRL_ENV_TEXTWORLD_CACHE") == tmp_path / "games"


def test_a_folder_under_the_old_root_is_still_read_until_the_new_one_exists(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TRL_ENV_CACHE", raising=False)
    old = tmp_path / ".cache" / "trl-env" / "textworld"
    old.mkdir(parents=True)
    assert cache_dir("textworld") == old
    (tmp_path / ".cache" / "trl_env" / "textworld").mkdir(parents=True)
    assert cache_dir("textworld") == tmp_path / ".cache" / "trl_env" / "textworld"
