"""Scheduling vs the raw-generation limit, against a REAL vLLM server (CPU build, tiny model by default).

The same multi-turn workload (N episodes x 4 turns x exactly 32 sampled tokens) runs these ways:

* ``continuous``: trl-env's ``batch_rollout`` with ``VLLMServerGenerator`` as shipped (each episode's next turn
  goes as soon as its env has stepped; turns that get ready together, within ``coalesce_s``, go as one batched
  request);
* ``per-request``: the same with ``coalesce_s=0`` and ``max_batch=1``: one HTTP request per turn (trl-env before
  coalescing);
* ``lockstep``: the same engine and HTTP client behind a wrapper with ``continuous = False``: turn k of
  every episode is sent together, all are awaited, then every env steps (on the same 16 env threads);
* ``TRL loop``: a loop shaped like TRL 1.16's env loop: per turn, ONE batched request carrying every live
  episode's prompt through TRL's own ``VLLMClient.generate``, then the envs stepped serially, their text
  tokenised and appended;
* ``sequential``: one episode at a time (``batch_rollout`` on one seed, in a loop), as trl-env 0.1.20 did;
  it runs on a subset of the seeds and is extrapolated linearly to N (said so in the table);
* ``raw per-request``: the exact token-id requests recorded from a ``continuous`` run, replayed with plain
  ``requests`` threads, all N requests of turn k in flight at once, turn k+1 after all of turn k: no env,
  no library;
* ``raw batched``: the same requests, turn k of every episode as ONE batched request, then turn k+1;
* the **raw limit** is the faster of the two replays in each repetition (no variant re-runs it);
* ``raw chains`` (a diagnostic): the same requests, replayed per episode with no barrier (each episode's next
  request goes out when its previous one returns), no env, no library.

Every turn samples exactly ``--tokens`` tokens: ``extra_body={"ignore_eos": True, "stop_token_ids": []}``
overrides the end-of-turn stop, so the work per variant is identical (``parse_truncated_turns=True`` lets a
turn cut by the length limit go to the env). The server runs without prefix caching so that the replay
(which cannot reuse the KV of tokens it did not sample) does the same prefill work as the rollouts.

Repetitions are interleaved (all variants of one repetition, in a shuffled order, then the next) after a
warm-up; tables give medians with (min-max) and ratios as medians of per-repetition ratios.

    python benchmarks/bench_scheduling.py            # full run (~25 min on the 2-core box)
    python benchmarks/bench_scheduling.py --quick    # smoke test (starts its own server unless --base-url)
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import _common as C
import requests

from trl_env import Budgets, ChatMLProcessor, Ending, GenerationRequest, VLLMServerGenerator, batch_rollout

VARIANTS = ("continuous", "per-request", "lockstep", "TRL loop", "sequential", "raw per-request", "raw batched",
            "raw chains")  # fmt: skip
LIMIT = "raw limit"  # the faster replay of each repetition, computed, not run
REPLAYS = ("raw per-request", "raw batched")
ENVS = {"cheap": None, "50-150 ms": (50.0, 150.0)}


class Lockstep:
    """The same HTTP client, scheduled in waves: the engine sends turn k of every live episode together."""

    continuous = False

    def __init__(self, inner: VLLMServerGenerator) -> None:
        self.inner = inner

    def submit(self, requests_: Sequence[GenerationRequest]) -> list[Future]:
        return self.inner.submit(requests_)


class Recorder:
    """Wraps a generator and keeps every request (a list append per turn: negligible)."""

    def __init__(self, inner) -> None:
        self.inner, self.continuous, self.requests = inner, inner.continuous, []

    def submit(self, requests_: Sequence[GenerationRequest]) -> list[Future]:
        self.requests += requests_
        return self.inner.submit(requests_)


def chains(requests_: list[GenerationRequest], rollouts) -> list[list[GenerationRequest]]:
    """Group recorded requests by episode, in turn order (each episode's prompt starts its requests)."""
    starts = {tuple(r.prompt_ids): i for i, r in enumerate(rollouts)}
    lengths = sorted({len(r.prompt_ids) for r in rollouts})
    per_episode: dict[int, list[GenerationRequest]] = defaultdict(list)
    for req in requests_:
        episode = next(starts[k] for n in lengths if (k := tuple(req.prompt_ids[:n])) in starts)
        per_episode[episode].append(req)
    return [sorted(reqs, key=lambda r: len(r.prompt_ids)) for _, reqs in sorted(per_episode.items())]


def levels(chains_: list[list[GenerationRequest]]) -> list[list[GenerationRequest]]:
    """Dependency levels: level k = the k-th turn of every episode."""
    return [[c[k] for c in chains_ if len(c) > k] for k in range(max(map(len, chains_)))]


class RawReplay:
    """Plain ``requests`` threads: every request of a level in flight at once, levels one after another."""

    def __init__(self, base_url: str, model: str, body: dict, concurrency: int, trust_env: bool = True) -> None:
        self.url, self.model, self.body = f"{base_url}/v1/completions", model, body
        self.session = requests.Session()
        self.session.trust_env = trust_env  # requests' default (True) re-reads proxy settings on every request
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=concurrency)
        self.session.mount("http://", adapter)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="raw")

    def _one(self, req: GenerationRequest) -> int:
        body = {"model": self.model, "prompt": req.prompt_ids, "max_tokens": req.max_tokens, **self.body}
        response = self.session.post(self.url, json=body, timeout=600)
        response.raise_for_status()
        return len(response.json()["choices"][0]["logprobs"]["token_logprobs"])

    def run(self, chains_: list[list[GenerationRequest]]) -> int:
        """Level by level: turn k of every episode at once, then turn k+1 (the raw-generation limit)."""
        tokens = 0
        for level in levels(chains_):
            tokens += sum(self.pool.map(self._one, level))
        return tokens

    def _batch(self, level: list[GenerationRequest]) -> int:
        groups: dict[int, list[GenerationRequest]] = defaultdict(list)
        for req in level:
            groups[req.max_tokens].append(req)
        tokens = 0
        for max_tokens, reqs in groups.items():
            body = {"model": self.model, "prompt": [r.prompt_ids for r in reqs], "max_tokens": max_tokens, **self.body}
            response = self.session.post(self.url, json=body, timeout=600)
            response.raise_for_status()
            tokens += sum(len(c["logprobs"]["token_logprobs"]) for c in response.json()["choices"])
        return tokens

    def run_batched(self, chains_: list[list[GenerationRequest]]) -> int:
        """Level by level, each level as one batched request (one per distinct ``max_tokens``)."""
        return sum(self._batch(level) for level in levels(chains_))

    def run_chains(self, chains_: list[list[GenerationRequest]]) -> int:
        """No barrier: each episode's next request goes out as soon as its previous one returns."""
        return sum(self.pool.map(lambda chain: sum(self._one(r) for r in chain), chains_))

    def close(self) -> None:
        self.pool.shutdown()
        self.session.close()


class TrlLoop:
    """A loop shaped like TRL 1.16's env loop: per turn one batched ``VLLMClient.generate`` of every live episode,
    then each env stepped in turn (serially), its text tokenised and appended to that episode's ids."""

    def __init__(self, base_url: str, tokenizer, processor, sampling: dict, extra: dict) -> None:
        import trl.generation.vllm_client as vllm_client

        # The client's HTTP path needs no vLLM in this process (vLLM is imported only for NCCL weight sync).
        vllm_client.is_vllm_available = lambda: True
        self.client = vllm_client.VLLMClient(base_url=base_url)
        self.tokenizer, self.processor = tokenizer, processor
        self.sampling = {k: sampling[k] for k in ("temperature", "top_p", "min_p", "repetition_penalty")}
        self.kwargs = {**extra, "skip_special_tokens": False}

    def run(self, env_factory, seeds: list[str], max_turns: int, tokens: int) -> tuple[int, float]:
        """Run every episode to its end; return (sampled tokens, seconds spent in env steps)."""
        encode = self.tokenizer.encode
        envs, ids = [], []
        for seed in seeds:
            env, delta = env_factory().reset(seed)
            envs.append(env)
            ids.append(encode(self.processor.init_system_input(delta), add_special_tokens=False))
        live, sampled, env_s = list(range(len(seeds))), 0, 0.0
        for _ in range(max_turns):
            out = self.client.generate(prompts=[ids[i] for i in live], max_tokens=tokens, logprobs=0,
                                       generation_kwargs=self.kwargs, **self.sampling)  # fmt: skip
            still = []
            for i, completion in zip(live, out["completion_ids"]):
                sampled += len(completion)
                _, action = self.processor.parse_agent_output(self.tokenizer.decode(completion))
                t0 = time.perf_counter()
                envs[i], delta = envs[i].step(action)
                env_s += time.perf_counter() - t0
                ids[i] = ids[i] + completion
                if envs[i].alive:
                    ids[i] += encode(self.processor.append_user_input(delta), add_special_tokens=False)
                    still.append(i)
            live = still
            if not live:
                break
        return sampled, env_s


def reset_prefix_cache(base_url: str) -> None:
    """Start every run with an empty prefix cache (a no-op when the server has it off or is not in dev mode)."""
    try:
        requests.post(f"{base_url}/reset_prefix_cache", timeout=30)
    except requests.RequestException:
        pass


def engine_steps(base_url: str) -> float | None:
    """The server's engine steps so far (``vllm:iteration_tokens_total`` histogram count), if it exports it."""
    try:
        text = requests.get(f"{base_url}/metrics", timeout=10).text
    except requests.RequestException:
        return None
    counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:iteration_tokens_total_count")]  # fmt: skip
    return sum(counts) if counts else None


def check(rollouts, n: int, turns: int, tokens: int) -> int:
    """Every episode ran all its turns with exactly ``tokens`` sampled per turn; return the sampled tokens."""
    bad = [r for r in rollouts if r.ending not in (Ending.ENV_DONE, Ending.MAX_TURNS) or len(r.turns) != turns]
    if bad or len(rollouts) != n:
        raise RuntimeError(f"{len(bad)} bad episodes, e.g. {bad[0].ending} {bad[0].error[:500]}")
    counts = {t.num_model_tokens for r in rollouts for t in r.turns}
    if counts != {tokens}:
        raise RuntimeError(f"turn lengths {sorted(counts)}, expected exactly {tokens}")
    return n * turns * tokens


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=None, help="episode counts, comma-separated (default 64,256)")
    parser.add_argument("--slow-sizes", default=None,
                        help="episode counts for the 50-150 ms env (default 64: the TRL loop steps envs serially)")  # fmt: skip
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="sampled tokens per turn (exactly)")
    parser.add_argument("--seq-subset", type=int, default=None, help="episodes actually run one at a time")
    parser.add_argument("--envs", default=",".join(ENVS), help=f"which envs, of {list(ENVS)}")
    parser.add_argument("--env-workers", type=int, default=16, help="batch_rollout's env_workers (its default: 16)")
    parser.add_argument("--replot", nargs="+", default=None, metavar="JSON",
                        help="redraw the table and plot from saved runs (several: their repetitions pooled)")  # fmt: skip
    C.add_server_options(parser)
    args = parser.parse_args(argv)
    if args.quick:  # a smoke test: the smallest workload that still runs every code path
        args.turns, args.tokens = min(args.turns, 2), min(args.tokens, 8)
    sizes = [int(x) for x in (args.sizes or ("4" if args.quick else "64,256")).split(",")]
    slow_sizes = [int(x) for x in (args.slow_sizes or ("4" if args.quick else "64")).split(",")]
    reps = args.reps or (1 if args.quick else 3)
    subset = args.seq_subset or (1 if args.quick else 16)
    envs = [e for e in ENVS if e in args.envs.split(",")]
    env_sizes = {e: sizes if ENVS[e] is None else slow_sizes for e in envs}
    out = C.out_dir(args)
    rng = random.Random(args.seed)
    notes = C.machine_notes()

    if args.replot is None:
        from transformers import AutoTokenizer

        with C.vllm_server(args.base_url, extra_args=["--no-enable-prefix-caching"], omp=args.server_omp) as (
            base_url,
            model_dir,
        ):
            server = C.server_config(base_url)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            processor = ChatMLProcessor()
            extra = {"ignore_eos": True, "stop_token_ids": []}  # every turn exactly --tokens long
            gen = VLLMServerGenerator(base_url, temperature=1.0, extra_body=extra)
            per_request = VLLMServerGenerator(base_url, temperature=1.0, extra_body=extra, max_batch=1)
            trl_loop = TrlLoop(base_url, tokenizer, processor, gen.sampling, extra)
            raw_body = {
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": False,
                **gen.sampling,
                **extra,
            }
            budgets = Budgets(max_turns=args.turns, max_new_tokens=args.tokens, max_completion_tokens=4096)
            raws = {n: RawReplay(base_url, gen.model, raw_body, n) for n in {*sizes, *slow_sizes}}
            recorded: dict[tuple[str, int], list[list[GenerationRequest]]] = {}

            def rollout(env: str, seeds: list[str], generator, **kwargs) -> list:
                return batch_rollout(
                    seeds, C.EnvFactory(args.turns, ENVS[env]), processor, tokenizer, generator,
                    budgets=budgets, parse_truncated_turns=True, env_workers=args.env_workers, **kwargs,
                )  # fmt: skip

            def run(variant: str, env: str, n: int) -> dict:
                seeds = [str(i) for i in range(n)]
                reset_prefix_cache(base_url)
                steps0 = engine_steps(base_url)
                out = _run(variant, env, n, seeds)
                steps1 = engine_steps(base_url)
                out["steps"] = steps1 - steps0 if steps0 is not None and steps1 is not None else None
                return out

            def _run(variant: str, env: str, n: int, seeds: list[str]) -> dict:
                cpu0, t0 = time.process_time(), time.perf_counter()
                if variant == "sequential":  # one episode at a time; n is the subset actually run
                    outs = [rollout(env, [s], gen) for s in seeds]
                    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    tokens = sum(check(o, 1, args.turns, args.tokens) for o in outs)
                elif variant.startswith("raw"):
                    replay = {"raw per-request": raws[n].run, "raw batched": raws[n].run_batched,
                              "raw chains": raws[n].run_chains}[variant]  # fmt: skip
                    tokens = replay(recorded[(env, n)])
                    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    if tokens != n * args.turns * args.tokens:
                        raise RuntimeError(f"raw replay sampled {tokens} tokens")
                elif variant == "TRL loop":
                    tokens, env_s = trl_loop.run(C.EnvFactory(args.turns, ENVS[env]), seeds, args.turns, args.tokens)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    if tokens != n * args.turns * args.tokens:
                        raise RuntimeError(f"the TRL loop sampled {tokens} tokens")
                    return dict(wall=wall, tokens=tokens, cpu=cpu, env_s=env_s)
                else:
                    if variant == "per-request":
                        rollouts = rollout(env, seeds, per_request, coalesce_s=0.0)
                    else:
                        generator = Recorder(gen) if variant == "continuous" else Lockstep(gen)
                        rollouts = rollout(env, seeds, generator)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    tokens = check(rollouts, n, args.turns, args.tokens)
                    if variant == "continuous":  # the next replay of (env, n) sends exactly these requests
                        recorded[(env, n)] = chains(generator.requests, rollouts)
                    env_s = sum(t.env_s for r in rollouts for t in r.turns)
                    return dict(wall=wall, tokens=tokens, cpu=cpu, env_s=env_s)
                return dict(wall=wall, tokens=tokens, cpu=cpu)

            # Warm-up: every variant once at the smallest size, and a continuous run per size (the first recording).
            t_start = time.perf_counter()
            for env in envs:
                for n in env_sizes[env]:
                    run("continuous", env, n)
                if not args.quick:
                    for variant in ("per-request", "lockstep", "TRL loop", *REPLAYS):
                        run(variant, env, env_sizes[env][0])
                    run("sequential", env, 1)
            print(f"[warm-up] {time.perf_counter() - t_start:.0f} s", file=sys.stderr)

            # Timed: blocks of (env, N) in shuffled order; in each block every variant once, in shuffled order,
            # back to back, so that the ratios compare runs made under the same background load.
            results: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
            for rep in range(reps):
                blocks = [(env, n) for env in envs for n in env_sizes[env]]
                rng.shuffle(blocks)
                for env, n in blocks:
                    variants = list(VARIANTS)
                    rng.shuffle(variants)  # a replay uses the latest recording of (env, N): from the warm-up at worst
                    for variant in variants:
                        if variant == "sequential":
                            k = min(subset, n)
                            r = run("sequential", env, k)
                            r = dict(wall=r["wall"] / k * n, tokens=r["tokens"] / k * n, cpu=r["cpu"] / k * n,
                                     steps=r["steps"] / k * n if r["steps"] is not None else None,
                                     measured_s=r["wall"], measured_episodes=k)  # fmt: skip
                        else:
                            r = run(variant, env, n)
                        results[(env, n, variant)].append(r)
                        print(f"[rep {rep}] {env:>9} N={n:<4} {variant:<11} {r['wall']:7.2f} s", file=sys.stderr)
            total = time.perf_counter() - t_start
            gen.close()
            per_request.close()
            for raw in raws.values():
                raw.close()
    else:  # redraw the table and plot from a saved run
        runs = [json.loads(Path(p).read_text()) for p in args.replot]
        saved = runs[0]
        server = saved["server"]
        notes = " / ".join(r["machine"] for r in runs) + (f" ({len(runs)} runs pooled)" if len(runs) > 1 else "")
        total = sum(r.get("total_s", 1000.0) for r in runs)  # run 2 predates the field: it took 1000 s
        results = defaultdict(list)
        for run_ in runs:
            for key, value in run_["raw"].items():
                env, n, variant = key.split("|")
                results[(env, int(n), variant)] += value
        kept = {"sizes", "seq_subset", "envs", "turns", "tokens", "env_workers", "reps"}
        for k, v in saved["args"].items():
            if k in kept:
                setattr(args, k, v)
        envs = [e for e in ENVS if any(k[0] == e for k in results)]
        env_sizes = {e: sorted({n for (e2, n, _) in results if e2 == e}) for e in envs}
        reps = max(len(v) for v in results.values())
        args.replot = [str(Path(p)) for p in args.replot]
        subset = args.seq_subset or 16

    # ---- report
    for env in envs:  # the raw limit: the faster replay of each repetition (saved runs before it have it as such)
        for n in env_sizes[env]:
            if (env, n, LIMIT) not in results:
                pairs = zip(*(results[(env, n, v)] for v in REPLAYS), strict=True)
                results[(env, n, LIMIT)] = [min(pair, key=lambda r: r["wall"]) for pair in pairs]
    shown = [v for v in (*VARIANTS, LIMIT) if any(results.get((e, n, v)) for e in envs for n in env_sizes[e])]
    others = [v for v in ("per-request", "lockstep", "TRL loop", "sequential") if v in shown]
    lines = [f"## bench_scheduling ({'quick' if args.quick else 'full'})", ""]
    lines.append(f"Machine: {notes}. Server: {server}. {reps} timed repetitions after a warm-up, interleaved in "
                 f"shuffled order; total {total:.0f} s. Workload: N episodes x {args.turns} turns x exactly "
                 f"{args.tokens} sampled tokens. Sequential: min({subset}, N) episodes run one at a time per "
                 "block, wall time extrapolated linearly to N (marked * where extrapolated).")  # fmt: skip
    lines.append("")
    summary = {}
    for env in envs:
        lines.append(f"### env: {env}")
        lines.append("")
        rows = []
        sizes = env_sizes[env]
        for n in sizes:
            limit = [r["wall"] for r in results[(env, n, LIMIT)]]
            for v in shown:
                walls = [r["wall"] for r in results[(env, n, v)]]
                toks = [r["tokens"] / r["wall"] for r in results[(env, n, v)]]
                ratios = [w / lim for w, lim in zip(walls, limit)]
                cpu = [r["cpu"] for r in results[(env, n, v)]]
                steps = [r["steps"] for r in results[(env, n, v)] if r.get("steps") is not None]
                star = "*" if v == "sequential" and subset < n else ""
                rows.append([n, v, C.fmt_range(walls) + star, f"{statistics.median(toks):.0f}",
                             C.fmt_range(ratios), f"{statistics.median(cpu):.2f}",
                             f"{statistics.median(steps):.0f}" if steps else "-"])  # fmt: skip
                summary[f"{env}|{n}|{v}"] = dict(
                    wall=C.summary(walls),
                    tokens_per_s=statistics.median(toks),
                    ratio_to_limit=C.summary(ratios),
                    client_cpu_s=statistics.median(cpu),
                    engine_steps=statistics.median(steps) if steps else None,
                )
            cont = [r["wall"] for r in results[(env, n, "continuous")]]
            for other in others:
                speedup = [o["wall"] / c for o, c in zip(results[(env, n, other)], cont)]
                summary[f"{env}|{n}|speedup_vs_{other}"] = C.summary(speedup)
        lines.append(C.markdown_table(
            ["N", "variant", "wall s, median (min-max)", "tokens/s", "wall / raw limit", "client CPU s",
             "engine steps"], rows))  # fmt: skip
        lines.append("")
        if ENVS[env] is not None:
            bounds = ", ".join(
                f"N={n}: {statistics.median(r['env_s'] for r in results[(env, n, 'continuous')]) / args.env_workers:.2f} s"
                for n in sizes
            )
            lines.append(f"Env-thread bound (total env step time / env_workers={args.env_workers}; no schedule with "
                         f"that many env threads can be faster): {bounds}.")  # fmt: skip
            lines.append("")
        speed_rows = [[n, C.fmt_range([o["wall"] / c["wall"] for o, c in zip(results[(env, n, other)],
                                                                              results[(env, n, "continuous")])])
                       + ("*" if other == "sequential" and subset < n else ""), other]
                      for n in sizes for other in others]  # fmt: skip
        lines.append(C.markdown_table(["N", "continuous speed-up, median (min-max)", "over"], speed_rows))
        lines.append("")
    text = "\n".join(lines)
    print(text)
    C.save_json(out / "bench_scheduling.json", dict(args=vars(args), server=server, machine=notes, summary=summary,
                                                    total_s=total,
                                                    raw={"|".join(map(str, k)): v for k, v in results.items()}))  # fmt: skip
    (out / "bench_scheduling.md").write_text(text + "\n")

    plt = C.plt()
    fig, axes = plt.subplots(2, len(envs), figsize=(6 * len(envs), 8), squeeze=False)
    for ax, ax2, env in zip(axes[0], axes[1], envs):
        sizes = env_sizes[env]
        for i, (v, marker) in enumerate(zip(shown, "osD^v<>ph")):
            color = f"C{i}"
            med = [statistics.median(r["wall"] for r in results[(env, n, v)]) for n in sizes]
            ax.plot(sizes, med, marker=marker, color=color,
                    label=v + (" (extrapolated)" if v == "sequential" else ""))  # fmt: skip
            if v != "sequential":
                ratio = [
                    statistics.median(
                        r["wall"] / lim["wall"] for r, lim in zip(results[(env, n, v)], results[(env, n, LIMIT)])
                    )
                    for n in sizes
                ]
                ax2.plot(sizes, ratio, marker=marker, color=color, label=v)  # fmt: skip
        for a in (ax, ax2):
            a.set_xscale("log", base=2)
            a.set_xticks(sizes, [str(n) for n in sizes])
            a.set_xlabel(f"episodes ({args.turns} turns x {args.tokens} tokens each)")
            a.grid(True, which="both", alpha=0.3)
        ax.set_yscale("log")
        ax.set_ylabel("wall time, s (median)")
        ax.set_title(f"env: {env}")
        ax.legend()
        if ENVS[env] is None:
            ax2.axhline(1.10, color="gray", linestyle="--", label="target 1.10")
        ax2.set_ylabel("wall / raw limit (median of paired ratios)")
        ax2.set_title(f"env: {env}, ratio to the raw-generation limit")
        ax2.legend(fontsize=8)
    fig.suptitle("trl-env scheduling vs per-request, lockstep, TRL's loop, sequential and the raw-generation limit "
                 "(vLLM CPU, tiny model)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / "bench_scheduling.png", dpi=110)
    print(f"\nwrote {out / 'bench_scheduling.png'}, {out / 'bench_scheduling.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
