"""The process that plays verifiers episodes for ``trl_env.adapters.verifiers`` (run as a script, not imported).

It runs under the interpreter that has verifiers 0.4 installed (often a venv of its own: verifiers pins ``mcp`` 2 and
``openai`` 2, which OpenEnv's ``fastmcp`` 3 and trl-env's other extras do not accept) and imports nothing of trl-env.

Protocol: JSON lines. argv[1] is the run's JSON: ``{"env": <verifiers EnvConfig as a dict>, "sampling": {...}}``;
an ``env`` holding ``"seat"`` names the env's one seat whatever the env calls it. The worker answers
``{"ready": true, "tasks": N}`` once verifiers built the environment (or ``{"fatal": message}``; ``N``: how many
tasks the taskset holds, ``null`` for an unbounded one or one of more than ``MAX_TASK_SCAN``), then reads requests
``{"id", "seed", "base_url", "api_key", "model"}`` from stdin and answers each, in any order, with
``{"id", "reward", "episode"}`` or ``{"id", "error", "episode"}`` (``episode``: verifiers' own record of it, as JSON).
Episodes run concurrently, each in a verifiers ``Env`` of its own (``load_environment``, ``serving``, ``run_slot``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import secrets
import sys
import traceback
from typing import Any

import verifiers.v1 as vf  # type: ignore[import-not-found,unused-ignore]  # the worker's interpreter has it

KEY_VAR_PREFIX = "TRL_ENV_VERIFIERS_API_KEY_"
"""verifiers reads an endpoint's key from the environment variable its config names: one variable per episode, its
name holding ``API_KEY`` so verifiers' subprocess runtime keeps it out of harness processes."""
MAX_TASK_SCAN = 100_000


def env_config(data: dict[str, Any]) -> Any:
    """The ``EnvConfig`` verifiers resolves for ``data``; a ``"seat"`` entry goes to the one seat of the env."""
    data = dict(data)
    if "seat" in data:
        taskset_id = data.get("taskset", {}).get("id", "")
        fields = vf.env_config_type(taskset_id).model_fields
        seats = [name for name, field in fields.items() if field.annotation is vf.AgentConfig]
        if len(seats) != 1:
            raise ValueError(f"taskset {taskset_id!r} plays {len(seats)} seats {seats}: name each seat's config")
        data[seats[0]] = data.pop("seat")
    return vf.resolve_env_config(data)


def find_task(taskset: Any, seed: str) -> Any:
    """The task ``seed`` names: its position in the taskset (decimal), else a task's name or id."""
    if seed.isdigit():
        task = next(itertools.islice(iter(taskset), int(seed), None), None)
        if task is None:
            raise LookupError(f"seed {seed!r}: the taskset has no task {seed}")
        return task
    for task in itertools.islice(iter(taskset), MAX_TASK_SCAN):
        if seed in (task.data.name, task.data.id):
            return task
    raise LookupError(f"seed {seed!r} names no task (seeds are task positions, names or ids)")


def count_tasks(taskset: Any) -> int | None:
    """How many tasks ``taskset`` holds; None when it is unbounded or holds more than ``MAX_TASK_SCAN``."""
    if not taskset.bounded:
        return None
    n = sum(1 for _ in itertools.islice(iter(taskset), MAX_TASK_SCAN + 1))
    return n if n <= MAX_TASK_SCAN else None


def reward_of(episode: Any) -> float:
    """The episode's reward: its trainable seats' ``Trace.reward`` (their mean); raises on any recorded error."""
    errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
    if errors or not episode.ok:
        told = "; ".join(f"{error.type}: {error.message}" for error in errors) or "not ok, no error recorded"
        raise RuntimeError(f"verifiers episode of task {episode.task.data.name or episode.task.key} failed: {told}")
    rewards = [trace.reward for trace in episode.traces if trace.agent.trainable]
    if not rewards:
        raise RuntimeError("verifiers episode has no trainable seat's trace to take a reward from")
    reward = float(sum(rewards) / len(rewards))
    if not math.isfinite(reward):
        raise RuntimeError(f"verifiers episode's reward is {reward}")
    return reward


class Worker:
    """One environment's episodes, played concurrently on this process's event loop."""

    def __init__(self, run: dict[str, Any], out: Any) -> None:
        self.config = env_config(run["env"])
        self.sampling = vf.Sampling(**run.get("sampling", {}))
        self.taskset = vf.load_environment(self.config).taskset  # builds the taskset and every harness now
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        """Write one protocol line."""
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    async def play(self, request: dict[str, Any]) -> None:
        """Play the episode ``request`` asks for, in a verifiers ``Env`` of its own, and answer it."""
        key_var = KEY_VAR_PREFIX + secrets.token_hex(8)
        episode = None
        try:
            task = find_task(self.taskset, str(request["seed"]).strip())
            os.environ[key_var] = request["api_key"]
            client = vf.EvalClientConfig(base_url=request["base_url"], api_key_var=key_var)
            context = vf.ModelContext(model=request["model"], client=client, sampling=self.sampling)
            env = vf.load_environment(self.config)
            async with env.serving():
                (slot,) = env.slots(task, 1)
                episode = await env.run_slot(slot, context)
            answer: dict[str, Any] = {"reward": reward_of(episode)}
        except Exception as e:  # noqa: BLE001  # every failure is this episode's answer, never the worker's end
            answer = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        finally:
            os.environ.pop(key_var, None)
        record = json.loads(episode.model_dump_json()) if episode is not None else None
        self.send({"id": request["id"], **answer, "episode": record})

    async def serve(self) -> None:
        """Start an episode per request line until stdin ends, then let the running ones finish."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        running: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            task = asyncio.create_task(self.play(json.loads(line)))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)


def main() -> None:
    """Build the environment argv[1] describes, say ready, and serve requests."""
    out = os.fdopen(os.dup(1), "w")  # the protocol's channel; anything else printing to stdout goes to stderr
    os.dup2(2, 1)
    try:
        worker = Worker(json.loads(sys.argv[1]), out)
    except Exception as e:  # noqa: BLE001  # told to the parent, which raises a ConfigError with it
        out.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        sys.exit(1)
    import verifiers  # type: ignore[import-not-found,unused-ignore]

    worker.send({"ready": True, "verifiers": verifiers.__version__, "tasks": count_tasks(worker.taskset)})
    asyncio.run(worker.serve())


if __name__ == "__main__":
    main()
