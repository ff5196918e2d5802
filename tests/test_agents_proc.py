"""Agent programs in worker processes (``env_executor="process"`` / ``isolated``): the factory, unpickled where the
workers are forked from, brings the openai SDK and the gateway's stack with it, so each worker does not import them."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from agents_support import one_call_program

from trl_env.agents import agent_env_factory

_LAZY = (
    "openai",
    "openai.resources.chat.completions",
    "openai.lib._parsing",
    "uvicorn",
    "starlette",
    "httpx",
    "trl_env.agents.local",
)


def test_an_unpickled_factory_has_imported_the_sdk_and_the_gateway_stack(tmp_path):
    # isolation_child.zygote unpickles the factory once and forks every worker from there: what the unpickling
    # imports, each worker has (~1 s of CPU per worker otherwise: bench_agents --paths agent-proc)
    path = tmp_path / "factory.pkl"
    path.write_bytes(pickle.dumps(agent_env_factory(one_call_program)))
    script = (
        "import pickle, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"before = [m for m in {_LAZY!r} if m in sys.modules]\n"
        f"pickle.loads(open({str(path)!r}, 'rb').read())\n"
        f"print(before, [m for m in {_LAZY!r} if m not in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr
