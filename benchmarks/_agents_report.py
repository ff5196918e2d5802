"""``bench_agents``' report: the markdown tables of its runs (wall, ratios, requests, CPU; latency per call)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import _common as C


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def report(results: dict, paths: list[str], sizes: list[int], reps: int, args: argparse.Namespace, notes: str, server: dict,
           total: float) -> str:  # fmt: skip
    """The markdown tables: one row per (N, path) with its ratio to the env path, then the latency per call."""
    lines = [
        "## bench_agents" + (" --scripted (no server)" if args.scripted else "") + (" (quick)" if args.quick else ""),
        "",
        f"Machine: {notes}. Server: {server}. {reps} timed repetitions per (path, N) after a warm-up, in rounds "
        f"(each round every (path, N) once, shuffled); total {total:.0f} s. Workload: N concurrent episodes x {args.turns} turns x exactly "
        f"{args.tokens} sampled tokens, history='deployed', env_workers={args.env_workers}, coalesce_s={args.coalesce_s}, one "
        "VLLMServerGenerator. env-sdk: the env path plus, in each step, the openai SDK's work of the agent's call "
        "(`SdkEnv`: a `create` answered at once by an `httpx.MockTransport`, no gateway): what a gateway that cost "
        "nothing would give; `/ env-sdk` is the gateway's own share. "
        "agent: a fresh `openai.OpenAI` per episode from `run.openai()` (served in-process); agent-http: a fresh "
        "`openai.OpenAI(base_url=run.base_url, ...)` per episode (loopback HTTP); agent-proc: `agent` with each "
        "episode's env and program in a worker process (`isolated`, as `env_executor='process'`). Trainer CPU: "
        "this process's; worker CPU: agent-proc's worker processes', from each episode's reset to its program's "
        "return (their forks not counted). Machine busy CPU: every process on every core during the run (the server's, "
        "this process's, its workers', any other load), idle core-s: the cores' idle time (`psutil.cpu_times`). Engine steps: the "
        "server's (`vllm:iteration_tokens_total` count).",
        "",
        "| N | path | wall s, median (min-max) | / env (target <= 1.15) | / env per round, median (min-max) | / env-sdk | completion requests per turn | prompts per "
        "request | trainer CPU s | trainer CPU ms per call | worker CPU ms per call | machine busy CPU s | idle core-s | engine steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        env_wall = statistics.median(r["wall"] for r in results[("env", n)])
        sdk_wall = statistics.median(r["wall"] for r in results[("env-sdk", n)]) if ("env-sdk", n) in results else None
        for path in (p for p in paths if (p, n) in results):
            runs = results[(path, n)]
            wall = statistics.median(r["wall"] for r in runs)
            ratio = wall / env_wall
            vs_sdk = f"{wall / sdk_wall:.2f}" if sdk_wall and path.startswith("agent") else ""
            rounds = [r["wall"] / e["wall"] for r, e in zip(runs, results[("env", n)], strict=False)]
            per_turn = [r["requests"] / (n * args.turns) for r in runs]
            per_req = statistics.median(r["prompts"] / r["requests"] for r in runs)
            lines.append(
                f"| {n} | {path} | {C.fmt_range([r['wall'] for r in runs])} | "
                f"{'' if path == 'env' else f'**{ratio:.2f}**'} | "
                f"{'' if path == 'env' else C.fmt_range(rounds)} | {vs_sdk} | "
                f"{C.fmt_range(per_turn, 3)} | {per_req:.1f} | "
                f"{statistics.median(r['cpu'] for r in runs):.1f} | "
                f"{statistics.median(r['cpu'] for r in runs) / (n * args.turns) * 1e3:.2f} | "
                f"{statistics.median(r['workers_cpu'] for r in runs) / (n * args.turns) * 1e3:.2f} | "
                f"{statistics.median(r['busy'] for r in runs):.1f} | {statistics.median(r['idle'] for r in runs):.1f} | "
                f"{statistics.median(r['steps'] for r in runs):.0f} |"
            )
    lines += [
        "",
        "Requests per turn: the generator's `POST /v1/completions` requests / (N x turns); 1/N would be one batched "
        "request per turn level. Gateway added latency per call (ms, every call of every timed run): the agent's "
        "client time around `create` minus the time the engine held the turn (from `AgentEnv.reset`/`step` "
        "returning the call to the next `step` receiving the sampled reply).",
        "",
        "| N | path | calls | added p50 | added p99 | client call p50 | client call p99 | engine turn p50 | "
        "engine turn p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        for path in (p for p in paths if p.startswith("agent") and (p, n) in results):
            runs = results[(path, n)]
            vals = {key: [x * 1e3 for r in runs for x in r[key]] for key in ("added", "client", "engine")}
            cells = [f"{percentile(vals[k], q):.1f}" for k in ("added", "client", "engine") for q in (50, 99)]
            lines.append(f"| {n} | {path} | {len(vals['added'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
