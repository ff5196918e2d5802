"""Level 2: GRPO against an OpenEnv environment server (echo the word), on a CPU, through OpenEnvAdapter.

Starts openenv_echo_server.py as its own process (OpenEnv's FastAPI app under uvicorn on 127.0.0.1, no
Docker), then trains with every episode in its own WebSocket session of that server; or, with
--base-url, uses a server that is already running (on this host or another). Reward: 1/3 per word
repeated exactly (partial credit for near misses), three words per episode.

Hardware: a CPU (2 idle cores: ~15 s a step with SmolLM2-135M-Instruct, so ~8 min for the 30 steps); needs
          `pip install 'trl-env[openenv]'`. 12 steps here: mean reward 0.106 (first 3) -> 0.186 (last 3).
Run:      python experiment/examples/openenv_echo.py                 # starts the server, trains SmolLM2
          python experiment/examples/openenv_echo.py --model tiny --steps 2   # smoke run
          python experiment/examples/openenv_echo.py --base-url http://HOST:8000  # a running server
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

from trl_env import ChatMLProcessor
from trl_env.adapters import OpenEnvAdapter

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openenv_echo_server.py")
MAX_TURNS = 3  # the env's episode length (WORDS_PER_EPISODE)
BATCH = 8  # episodes per step = sessions the server must hold at once
SYSTEM_PROMPT = "You are a parrot. Reply with the word you were given and nothing else."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    *, max_sessions: int = 2 * BATCH, log: str | None = None, output: str = os.devnull, script: str = SERVER
):
    """Start ``script`` (openenv_echo_server.py) on a free port of 127.0.0.1; returns (base_url, process) at once."""
    port = free_port()
    cmd = [sys.executable, script, "--port", str(port), "--max-sessions", str(max_sessions)]
    with open(output, "ab") as out:
        proc = subprocess.Popen(cmd + (["--log", log] if log else []), stdout=out, stderr=subprocess.STDOUT)
    return f"http://127.0.0.1:{port}", proc


def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    """Poll GET /health until the server answers; raise if it exits first or takes longer than timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"OpenEnv server (pid {proc.pid}) exited with code {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"OpenEnv server {base_url} (pid {proc.pid}) not ready after {timeout_s} s")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server by its PID: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    parser = example_parser(__doc__, name="openenv_echo", steps=30)
    parser.add_argument("--base-url", default=None, help="use this running OpenEnv server instead of starting one")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    base_url, proc = args.base_url, None
    if base_url is None:
        base_url, proc = start_server(output=os.path.join(args.out, "server.log"))
    try:
        if proc is not None:
            wait_ready(base_url, proc)
        return train(
            "openenv_echo",
            args,
            lambda: OpenEnvAdapter(base_url, connect_timeout_s=10, message_timeout_s=30),
            ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
            seed_format="{i}",  # each prompt: the env's reset seed
            batch=BATCH,
            max_completion_length=128,
            max_turns=MAX_TURNS,
            max_new_tokens=8,
            parse_truncated_turns=True,  # a rambling turn still counts as an answer
            env_timeout=60,
        )
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    main()
