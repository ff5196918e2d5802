"""Envs built from something else: other libraries' envs (OpenEnv, TextArena, TextWorld, reasoning-gym, verifiers).

Also ``ToolEnv`` (``tool_env.py``): an env built from plain Python tool functions.
"""
