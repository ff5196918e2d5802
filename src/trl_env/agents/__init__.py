"""Agent programs as episodes: unmodified code on an OpenAI-compatible client, trained through trl-env's gateway."""

from trl_env.agents.env import AgentEnv, agent_env_factory
from trl_env.agents.gateway import Gateway, shared_gateway
from trl_env.agents.run import AgentProgram, AgentRun

__all__ = ["AgentEnv", "AgentProgram", "AgentRun", "Gateway", "agent_env_factory", "shared_gateway"]
