"""Level 3: a verifiers 0.4 environment trained offline: verifiers' bundled OpenEnv taskset on the echo server.

verifiers (``VerifiersProgram``, docs/verifiers.md) plays each episode as ``vf-eval`` would: its ``null`` chat
harness calls the episode's gateway, its OpenEnv taskset steps the repo's echo server (openenv_echo_server.py, started
here on 127.0.0.1) with each reply, and the reward is what verifiers' rubric recorded (the server's per-word rewards,
summed). Eight tasks: the taskset's ``resets``, one OpenEnv ``reset(seed=i)`` each.

Needs verifiers in a venv of its own (``.venv-verifiers``, made by scripts/install.sh; or ``--python``). The first
episode's harness is a PEP 723 script that ``uv`` resolves once from the package index into its cache.

Hardware: a CPU (2 cores). Run:
    python experiment/examples/verifiers_echo.py --model tiny --steps 2    # smoke run, about a minute
    python experiment/examples/verifiers_echo.py                           # SmolLM2-135M-Instruct, offline
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples/

import openenv_echo  # noqa: E402  # the echo server's start/stop helpers
from agent_tools import train_agent  # noqa: E402  # the agent examples' training run

from trl_env.adapters import VerifiersProgram  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = 8
MAX_TURNS = 3  # the echo server's words per episode


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Start the echo server and verifiers, train, stop both."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv-verifiers", "bin", "python"))
    known, rest = parser.parse_known_args(argv)
    base_url, server = openenv_echo.start_server(max_sessions=16)
    try:
        openenv_echo.wait_ready(base_url, server)
        taskset = {"id": "openenv", "base_url": base_url, "resets": [{"seed": i} for i in range(TASKS)]}
        program = VerifiersProgram.from_taskset(taskset, harness="null", max_turns=MAX_TURNS, python=known.python)
        try:
            return train_agent(
                program,
                __doc__ or "",
                name="verifiers_echo",
                max_turns=MAX_TURNS,
                max_completion_length=128,
                argv=rest,
                seeds=list(program.dataset()["prompt"]),  # "0".."7": a seed names its task by position
                env_timeout=300,
                parse_truncated_turns=True,  # a reply cut by the token budget is still the echo server's action
            )
        finally:
            program.close()
    finally:
        openenv_echo.stop_server(server)


if __name__ == "__main__":
    main()
