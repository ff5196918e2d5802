"""Envs built from something else: other libraries' envs (OpenEnv, TextArena, TextWorld, reasoning-gym, verifiers).

Also ``ToolEnv`` (``tool_env.py``): an env built from plain Python tool functions (exported by ``trl_env`` too).
Each adapter imports its library when first used, so ``import trl_env.adapters`` needs none of them.
"""

from trl_env.adapters.openenv import OpenEnvAdapter
from trl_env.adapters.reasoning_gym import ReasoningGymEnv
from trl_env.adapters.textarena import TextArenaEnv
from trl_env.adapters.textarena_seats import TextArenaGame
from trl_env.adapters.textworld import TextWorldEnv
from trl_env.adapters.tool_env import ToolEnv
from trl_env.adapters.verifiers import VerifiersProgram

__all__ = [
    "OpenEnvAdapter",
    "ReasoningGymEnv",
    "TextArenaEnv",
    "TextArenaGame",
    "TextWorldEnv",
    "ToolEnv",
    "VerifiersProgram",
]
