"""Soak: many consecutive ``batch_rollout`` calls whose envs and agent programs fail every way (issue 46 item 2).

A trainer calls ``batch_rollout`` thousands of times; whatever its episodes do, the process must come back to its
baseline after each call. Each path below runs ``--batches`` consecutive calls of ``--episodes`` episodes, the
episodes' behaviours taken in turn from the path's list, with ``env_timeout=--env-timeout``:

* ``env-thread``: an ``Env`` on the engine's threads that raises, hangs (past ``env_timeout``, then returns) or exits
  (``SystemExit``) in ``reset``, ``step`` or ``close``; one episode per batch hangs in ``reset`` forever (the one thing
  documented to stay: its thread);
* ``env-process``: the same env in worker processes (``isolated(..., pool_size=4)``, as ``env_executor="process"``
  builds), where a hang is forever and an exit is ``os._exit``;
* ``agent-thread``: agent programs (``agent_env_factory``, ``run.openai()``) that raise or return before or after
  their first call, are slow before their first call or between two calls (past ``env_timeout``), or exit;
* ``agent-process``: the same programs in worker processes (``isolated(agent_env_factory(...))``), with an
  ``os._exit`` and a program that never calls;
* ``selfplay``: games of two policy seats (``play_seats``) whose rules raise or hang in some games.

After every call the script waits ``--settle`` seconds (the finite hangs end) and samples the process: threads, open
fds, child processes, RSS (MiB) and the live keys of the process's gateway. Growth is the last batch minus the batch
after ``--warmup`` batches (worker pools fill and imports happen during the warm-up). The goal: nothing grows but
``env-thread``'s threads, by one per forever-hung call after the warm-up (the "expected" column); in worker processes
the pool's idle workers (up to ``POOL_SIZE``, one fd each) come and go with which workers a call killed.

A scripted generator (replies "0" at once) and the tiny ChatML tokenizer of ``trl_env.testing``: no model, no server.

    python benchmarks/bench_soak.py                     # ~4 min: 12 batches of 16 per path
    python benchmarks/bench_soak.py --quick             # a short run (tests/test_soak.py runs one in process)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psutil

POOL_SIZE = 4
"""``isolated(..., pool_size=POOL_SIZE)`` for the worker-process paths."""
HANG_S = 1.5
"""How long a finite hang lasts: past ``env_timeout`` (the call is abandoned), then it returns."""

ENV_KINDS = (
    "ok",
    "raise_reset",
    "hang_reset",
    "exit_reset",
    "raise_step",
    "hang_step",
    "exit_step",
    "raise_close",
    "hang_close",
    "exit_close",
    "ok",
)
AGENT_KINDS = (
    "ok",
    "raise_before",
    "raise_after",
    "return_before",
    "slow_first",
    "hang_between",
    "exit_after",
    "ok",
)
AGENT_PROCESS_KINDS = (*AGENT_KINDS, "exit_before", "never")
GAME_KINDS = ("ok", "raise", "hang", "ok")


class SoakEnv:
    """An env whose behaviour is its seed's first word: ``<how>_<where>`` (``raise``/``hang``/``exit``/``forever`` in
    ``reset``/``step``/``close``), or ``ok`` (two turns). ``hang`` is finite (``HANG_S``) on threads and forever in a
    worker process; ``exit`` is ``SystemExit`` on threads and ``os._exit`` in a worker process."""

    def __init__(self) -> None:
        self.reward, self.alive, self.turn, self.kind = 0.0, True, 0, "ok"

    def _act(self, where: str) -> None:
        how, _, at = self.kind.partition("_")
        if at != where:
            return
        in_worker = os.environ.get("TRL_ENV_SOAK_WORKER") == str(os.getpid())
        if how == "raise":
            raise RuntimeError(f"soak: {self.kind}")
        if how == "forever" or (how == "hang" and in_worker):
            threading.Event().wait()
        if how == "hang":
            time.sleep(HANG_S)
        if how == "exit":
            if in_worker:
                os._exit(3)
            raise SystemExit(3)

    def reset(self, seed: str) -> tuple[SoakEnv, str]:
        self.kind = str(seed).split()[0]
        self._act("reset")
        return self, f"Episode {seed}: say a number."

    def step(self, action: str) -> tuple[SoakEnv, str]:
        self._act("step")
        self.turn += 1
        self.reward += 1.0
        self.alive = self.turn < 2
        return self, "Again."

    def close(self) -> None:
        self._act("close")


def worker_env() -> SoakEnv:
    """``SoakEnv`` built in a worker process: marks the process so its hangs are forever and its exits real."""
    os.environ["TRL_ENV_SOAK_WORKER"] = str(os.getpid())
    return SoakEnv()


def soak_program(run: Any) -> float:
    """An agent program whose behaviour is its seed's first word (``AGENT_PROCESS_KINDS``)."""
    kind = run.seed.split()[0]
    in_worker = os.environ.get("TRL_ENV_SOAK_WORKER") == str(os.getpid())

    def call() -> str:
        client = run.openai(max_retries=0)  # the client's default read timeout (600 s): a lost call waits that long
        reply = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": run.task}])
        return str(reply.choices[0].message.content)

    if kind == "raise_before":
        raise RuntimeError("soak: raise_before")
    if kind == "return_before":
        return 0.0
    if kind == "exit_before":
        os._exit(3)
    if kind == "never":
        threading.Event().wait()
    if kind == "slow_first":
        time.sleep(HANG_S)
    call()
    if kind == "raise_after":
        raise RuntimeError("soak: raise_after")
    if kind == "exit_after":
        if in_worker:
            os._exit(3)
        raise SystemExit(3)
    if kind == "hang_between":
        time.sleep(HANG_S)
        call()
    return 1.0


def worker_program(run: Any) -> float:
    """``soak_program`` in a worker process (its exits are real ``os._exit``)."""
    os.environ["TRL_ENV_SOAK_WORKER"] = str(os.getpid())
    return soak_program(run)


class SoakGame:
    """Two seats take turns; the game's seed says whether its rules raise or hang (``HANG_S``) at the third move."""

    seats = 2

    def reset(self, seed: str) -> tuple[SoakGame, str]:
        self.kind, self.moves, self.seat, self.alive, self.rewards = str(seed).split()[0], 0, 0, True, [0.0, 0.0]
        return self, "Move."

    def step(self, action: str) -> tuple[SoakGame, str]:
        self.moves += 1
        if self.moves == 3 and self.kind == "raise":
            raise RuntimeError("soak: the rules raised")
        if self.moves == 3 and self.kind == "hang":
            time.sleep(HANG_S)
        if self.moves == 4:
            self.alive, self.rewards = False, [1.0, -1.0]
        self.seat = 1 - self.seat
        return self, "Your move."


class ZeroGenerator:
    """Answers every turn "0" and its end-of-turn token at once (a wave generator)."""

    continuous = False
    context_limit = None

    def __init__(self, tokenizer: Any) -> None:
        self.ids = list(tokenizer.encode("0<|im_end|>", add_special_tokens=False))

    def submit(self, requests: Sequence[Any]) -> list[Future[Any]]:
        from trl_env.backends.base import FinishReason, Generation, resolved

        out = []
        for request in requests:
            ids = self.ids[: request.max_tokens]
            out.append(resolved(Generation(ids, [-0.5] * len(ids), FinishReason.STOP)))
        return out


def sample(settle_s: float) -> dict[str, float]:
    """The process after ``settle_s``: threads, fds, child processes, RSS (MiB), the gateway's live keys."""
    time.sleep(settle_s)
    me = psutil.Process()
    keys = 0
    if "trl_env.agents.gateway" in sys.modules:
        from trl_env.agents.gateway import shared_gateway

        keys = shared_gateway().open_sessions()
    return {
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "children": len(me.children(recursive=True)),
        "rss_mib": round(me.memory_info().rss / 2**20, 1),
        "keys": keys,
    }


def seeds_for(kinds: Sequence[str], batch: int, episodes: int) -> list[str]:
    return [f"{kinds[i % len(kinds)]} {batch}-{i}" for i in range(episodes)]


def path_runner(path: str, tokenizer: Any, env_timeout: float) -> tuple[Callable[[int, int], list[Any]], int]:
    """A function running batch ``b`` of ``n`` episodes of ``path``, and how many calls per batch hang forever."""
    from trl_env import Budgets
    from trl_env.render.processors import from_tokenizer
    from trl_env.rollout import batch_rollout
    from trl_env.rollout.isolation import isolated
    from trl_env.rollout.seated import play_seats
    from trl_env.seats import POLICY, Seating

    processor, generator = from_tokenizer(tokenizer), ZeroGenerator(tokenizer)
    budgets = Budgets(max_turns=4, max_new_tokens=8)
    common = {"budgets": budgets, "env_timeout": env_timeout, "env_workers": 8}
    if path == "env-thread":
        kinds = ("forever_reset", *ENV_KINDS)  # one forever-hung reset per batch (the first episode)

        def run(b: int, n: int) -> list[Any]:
            seeds = seeds_for(ENV_KINDS, b, n - 1)
            return batch_rollout([f"{kinds[0]} {b}", *seeds], SoakEnv, processor, tokenizer, generator, **common)

        return run, 1
    if path == "env-process":
        factory = isolated(worker_env, pool_size=POOL_SIZE)
        return lambda b, n: batch_rollout(
            seeds_for(ENV_KINDS, b, n), factory, processor, tokenizer, generator, **common
        ), 0
    if path in ("agent-thread", "agent-process"):
        from trl_env.agents import agent_env_factory

        agents: Any = agent_env_factory(soak_program, settle_s=1.0)
        kinds = AGENT_KINDS
        if path == "agent-process":
            agents, kinds = (
                isolated(agent_env_factory(worker_program, settle_s=1.0), pool_size=POOL_SIZE),
                AGENT_PROCESS_KINDS,
            )
        return lambda b, n: batch_rollout(
            seeds_for(kinds, b, n), agents, processor, tokenizer, generator, history="deployed", **common
        ), 0
    if path == "selfplay":
        seating = Seating(SoakGame, (POLICY, POLICY))

        def games(b: int, n: int) -> list[Any]:
            seeds = [s for g in seeds_for(GAME_KINDS, b, n // 2) for s in (g, g)]
            return play_seats(seeds, seating, processor, tokenizer, generator, **common)

        return games, 0
    raise SystemExit(f"unknown path {path!r}")


PATHS = ("env-thread", "env-process", "agent-thread", "agent-process", "selfplay")
MEASURES = ("threads", "fds", "children", "rss_mib", "keys")


def soak(
    path: str,
    tokenizer: Any,
    *,
    batches: int,
    episodes: int,
    env_timeout: float,
    settle_s: float,
    warmup: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``path`` for ``batches`` calls; its samples, endings and growth after ``warmup`` batches."""
    run, forever = path_runner(path, tokenizer, env_timeout)
    samples, endings = [sample(0.0)], []
    for b in range(batches):
        started = time.perf_counter()
        rollouts = run(b, episodes)
        wall = time.perf_counter() - started
        endings.append(sorted({f"{r.ending.value}:{r.info.get('error_kind', '')}" for r in rollouts}))
        samples.append(sample(settle_s))
        log(
            f"{path:13s} batch {b + 1:2d}/{batches}  {wall:5.1f} s  "
            + "  ".join(f"{m} {samples[-1][m]}" for m in MEASURES)
        )
    expected = {m: 0 for m in MEASURES} | {"threads": forever * (batches - warmup)}
    pool = {"children": POOL_SIZE, "fds": POOL_SIZE} if path.endswith("process") else {}
    result = {"path": path, "samples": samples, "endings": endings, "expected": expected, "pool": pool}
    for _ in range(3):  # a leak stays; a call still finishing (a loaded machine) goes: look again before saying so
        result["growth"] = {m: round(samples[-1][m] - samples[warmup][m], 1) for m in MEASURES}
        if not leaks(result):
            break
        result["final"] = sample(settle_s)
        samples[-1] = result["final"]
    return result


def table(results: Sequence[dict[str, Any]]) -> str:
    header = ["path", "batches", *(f"{m} per batch" for m in MEASURES), "growth after warm-up", "expected"]
    rows = []
    for r in results:
        per_batch = [" ".join(str(s[m]) for s in r["samples"][1:]) for m in MEASURES]
        growth = ", ".join(f"{m} {r['growth'][m]:+g}" for m in MEASURES)
        expected = ", ".join(f"{m} {v:+g}" for m, v in r["expected"].items() if v) or "nothing"
        if r.get("pool"):
            expected += f" (children, fds: up to {POOL_SIZE} idle workers kept by the pool, one fd each)"
        rows.append([r["path"], len(r["samples"]) - 1, *per_batch, growth, expected])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def leaks(result: dict[str, Any]) -> dict[str, float]:
    """What grew beyond what is expected (RSS allowed 32 MiB: allocator noise, not a leak per batch).

    In worker processes the pool keeps up to ``POOL_SIZE`` idle workers: how many are left after a call depends on
    which of its workers were killed, so children and fds may differ by that many between two calls.
    """
    out = {}
    for m in MEASURES:
        allowed = result["expected"][m] + (32 if m == "rss_mib" else 0) + result.get("pool", {}).get(m, 0)
        if result["growth"][m] > allowed:
            out[m] = result["growth"][m]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--env-timeout", type=float, default=0.5)
    parser.add_argument("--settle", type=float, default=HANG_S + 0.5, help="seconds to wait before each sample")
    parser.add_argument("--quick", action="store_true", help="4 batches of 8 per path")
    parser.add_argument("--out", default=None, help="write the table (.md) and samples (.json) under this folder")
    parser.add_argument("--name", default="bench_soak", help="file name stem under --out")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.episodes, args.warmup = 4, 8, 1
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl_env.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    results = [
        soak(
            p,
            tokenizer,
            batches=args.batches,
            episodes=args.episodes,
            env_timeout=args.env_timeout,
            settle_s=args.settle,
            warmup=args.warmup,
        )
        for p in args.paths
    ]
    text = table(results)
    print(text)
    bad = {r["path"]: leaks(r) for r in results if leaks(r)}
    print("leaks:", json.dumps(bad) if bad else "none")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.name}.md").write_text(text + "\n\nleaks: " + (json.dumps(bad) if bad else "none") + "\n")
        settings = {k: getattr(args, k) for k in ("batches", "episodes", "warmup", "env_timeout", "settle")}
        (out / f"{args.name}.json").write_text(json.dumps({"settings": settings, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
