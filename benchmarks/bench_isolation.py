"""Envs on threads against envs in worker processes (``env_executor="process"``), side by side in one run.

A CPU-bound pure-Python env (each reset and step spins for ``--work-ms`` of CPU) runs ``--episodes``
episodes of ``--turns`` turns against a stand-in generator that answers at once, so the wall time is the
env work and the engine's overhead. On threads the env code holds the GIL and runs one call at a time; in
worker processes the calls run in parallel across cores. A second pair with a trivial env shows the price
of isolation (process start, a pipe round trip per call). Prints medians of ``--reps`` interleaved runs and
the ratios.

    python benchmarks/bench_isolation.py            # 64 episodes x 4 turns x 30 ms: ~1.5 min on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trl_env import Budgets, ChatMLProcessor, batch_rollout  # noqa: E402
from trl_env.backends.base import FinishReason, Generation, resolved  # noqa: E402
from trl_env.rollout.isolation import isolated  # noqa: E402
from trl_env.testing import build_tiny_tokenizer  # noqa: E402


class SpinEnv:
    """Spins ``work_s`` seconds of CPU in each reset and step; ends after ``turns`` steps."""

    def __init__(self, work_s: float = 0.02, turns: int = 4) -> None:
        self.work_s, self.turns = work_s, turns
        self.reward, self.alive, self.k = 0.0, True, 0

    def _spin(self) -> None:
        end = time.thread_time() + self.work_s
        x = 0
        while time.thread_time() < end:
            x += 1

    def reset(self, seed):
        self._spin()
        return self, f"go {seed}"

    def step(self, action):
        self._spin()
        self.k += 1
        self.alive = self.k < self.turns
        self.reward = float(self.k)
        return self, "again"


class Instant:
    """A generator that answers every turn at once with the stop token."""

    continuous = True

    def __init__(self, stop_id: int) -> None:
        self.stop_id = stop_id

    def submit(self, requests):
        return [resolved(Generation([self.stop_id], [0.0], FinishReason.STOP)) for _ in requests]


def run(factory, tokenizer, episodes: int, turns: int) -> float:
    started = time.perf_counter()
    rollouts = batch_rollout([str(i) for i in range(episodes)], factory, ChatMLProcessor(), tokenizer,
                             Instant(tokenizer.convert_tokens_to_ids("<|im_end|>")),
                             budgets=Budgets(max_turns=turns, max_new_tokens=4, max_completion_tokens=200))  # fmt: skip
    assert all(r.error == "" for r in rollouts), [r.error for r in rollouts if r.error][:1]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--work-ms", type=float, default=30.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pool", type=int, default=16, help="idle workers kept (make_rollout_func: env_workers)")
    args = parser.parse_args()
    spin = functools.partial(SpinEnv, work_s=args.work_ms / 1000, turns=args.turns)
    quick = functools.partial(SpinEnv, work_s=0.0, turns=args.turns)
    tokenizer = build_tiny_tokenizer()
    pools = {
        "spin process": isolated(spin, pool_size=args.pool),
        "quick process": isolated(quick, pool_size=args.pool),
        "quick warm": isolated(quick, pool_size=args.episodes),  # every episode finds an idle worker
        "quick cold": isolated(quick, pool_size=0),  # every episode forks a worker, which then exits
    }
    for pool in pools.values():  # start each zygote (and the warm pool's workers) once: a trainer keeps them
        run(pool, tokenizer, args.episodes, args.turns)
    times: dict[str, list[float]] = {k: [] for k in ("spin thread", "quick thread", *pools)}
    for _ in range(args.reps):
        for name, factory in (("spin thread", spin), ("quick thread", quick), *pools.items()):
            times[name].append(run(factory, tokenizer, args.episodes, args.turns))
    med = {k: statistics.median(v) for k, v in times.items()}
    calls = args.episodes * (args.turns + 1)
    print(f"{args.episodes} episodes x {args.turns} turns, {args.work_ms:.0f} ms of CPU per env call, "
          f"{os.cpu_count()} CPUs, {args.pool} idle workers kept, medians of {args.reps}")  # fmt: skip
    print("| env | threads (s) | processes (s) | processes / threads |")
    print("| --- | --- | --- | --- |")
    for env in ("spin", "quick"):
        t, p = med[f"{env} thread"], med[f"{env} process"]
        print(f"| {env} | {t:.2f} | {p:.2f} | {p / t:.2f}x |")
    per_call = (med["quick warm"] - med["quick thread"]) / calls
    per_fork = (med["quick cold"] - med["quick warm"]) / args.episodes
    print(f"per env call in a warm worker: +{per_call * 1e6:.0f} us; per worker started (fork, exit): "
          f"+{per_fork * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
