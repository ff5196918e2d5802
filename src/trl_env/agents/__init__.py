"""Agent programs as episodes: unmodified code on an OpenAI-compatible client, trained through trl-env's gateway."""

from trl_env.agents.run import AgentProgram, AgentRun

__all__ = ["AgentProgram", "AgentRun"]
