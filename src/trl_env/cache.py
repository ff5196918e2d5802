"""The one cache root of trl-env: ``$TRL_ENV_CACHE``, else ``~/.cache/trl_env``; each user keeps a folder below it.

Stand-in tokenizers (``tokenizers/``), converted models and TextWorld's generated games (``textworld/``) live there.
Before 0.3 TextWorld kept its games under ``~/.cache/trl-env/textworld``: a folder there is still read.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "cache_root"]

LEGACY_ROOT = Path("~/.cache/trl-env")
"""The second root TextWorld used before there was one (``-`` for ``_``); read where it exists, never created."""


def cache_root() -> Path:
    """``$TRL_ENV_CACHE``, else ``~/.cache/trl_env`` (expanded, not created)."""
    return Path(os.environ.get("TRL_ENV_CACHE") or Path.home() / ".cache" / "trl_env").expanduser()


def cache_dir(name: str, *, env_var: str | None = None) -> Path:
    """The folder ``name`` below the cache root, or ``$env_var`` when set (not created).

    When ``$TRL_ENV_CACHE`` is unset and only the legacy ``~/.cache/trl-env/<name>`` exists, that one: what an
    earlier version cached is still found.
    """
    if env_var and os.environ.get(env_var):
        return Path(os.environ[env_var]).expanduser()
    new = cache_root() / name
    legacy = LEGACY_ROOT.expanduser() / name
    if not os.environ.get("TRL_ENV_CACHE") and not new.exists() and legacy.is_dir():
        return legacy
    return new
