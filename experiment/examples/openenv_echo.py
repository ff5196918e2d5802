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

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from trl_env import ChatMLProcessor, env_reward, make_rollout_func
from trl_env.openenv import OpenEnvAdapter

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openenv_echo_server.py")
MAX_TURNS = 3  # the env's episode length (WORDS_PER_EPISODE)
BATCH = 8  # episodes per step = sessions the server must hold at once
SYSTEM_PROMPT = "You are a parrot. Reply with the word you were given and nothing else."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*, max_sessions: int = 2 * BATCH, log: str | None = None, output: str = os.devnull):
    """Start openenv_echo_server.py on a free port of 127.0.0.1; returns (base_url, process) at once."""
    port = free_port()
    cmd = [sys.executable, SERVER, "--port", str(port), "--max-sessions", str(max_sessions)]
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' (offline default), 'tiny', or a path/hub id")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/openenv_echo")
    parser.add_argument("--base-url", default=None, help="use this running OpenEnv server instead of starting one")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    base_url, proc = args.base_url, None
    if base_url is None:  # start the server first: it boots while the model loads
        base_url, proc = start_server(output=os.path.join(args.out, "server.log"))
    try:
        return _train(args, base_url, proc)
    finally:
        if proc is not None:
            stop_server(proc)


def _train(args: argparse.Namespace, base_url: str, proc: subprocess.Popen | None) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    if proc is not None:
        wait_ready(base_url, proc)
    transcripts = os.path.join(args.out, f"transcripts_seed{args.seed}.jsonl")
    if os.path.exists(transcripts):
        os.remove(transcripts)

    dataset = Dataset.from_dict({"prompt": [str(i) for i in range(1000)]})  # each prompt: the env's reset seed
    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=BATCH,
        num_generations=4,
        max_completion_length=128,
        learning_rate=3e-5 if args.model != "tiny" else 1e-3,
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # float32 on CPU: exact logprobs
        seed=args.seed,
        data_seed=args.seed,
    )
    rollout_func = make_rollout_func(
        lambda: OpenEnvAdapter(base_url, connect_timeout_s=10, message_timeout_s=30),
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,  # a rambling turn still counts as an answer
        env_timeout=60,
        transcripts=transcripts,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started

    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h and "train_runtime" not in h]
    k = max(1, len(rewards) // 4)
    summary = {"first_mean": sum(rewards[:k]) / k, "last_mean": sum(rewards[-k:]) / k, "wall_s": wall}
    print(
        f"[openenv_echo] reward per step: {[round(r, 3) for r in rewards]}; first {k} steps "
        f"{summary['first_mean']:.3f} -> last {k} steps {summary['last_mean']:.3f}"
    )
    with open(os.path.join(args.out, f"rewards_seed{args.seed}.json"), "w") as f:
        json.dump({"rewards": rewards, "base_url": base_url, **summary}, f)
    return summary


if __name__ == "__main__":
    main()
