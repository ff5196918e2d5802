"""Kept import path: ``from trl_env.openenv import OpenEnvAdapter`` (the code lives in trl_env.integrations.openenv)."""

from trl_env.integrations.openenv import OpenEnvAdapter

__all__ = ["OpenEnvAdapter"]
