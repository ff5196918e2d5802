"""Kept import path: ``from trl_env.openenv import OpenEnvAdapter`` (the code lives in trl_env.adapters.openenv)."""

from trl_env.adapters.openenv import OpenEnvAdapter

__all__ = ["OpenEnvAdapter"]
