"""Where the client's CPU goes per turn: a cProfile of EVERY thread of a ``batch_rollout`` over HTTP.

Runs the bench_scheduling workload (N episodes x 4 turns x 32 tokens, cheap env) with ``VLLMServerGenerator``
against the local stand-in server (``stub_server.py``: instant answers, its own process) or a real server
(``--base-url``), profiling the scheduler thread, the env worker threads and the HTTP request threads
(``threading.Thread.run`` is wrapped before any of them starts), then groups the time by area: trl_env's
own code, the tokenizer, the HTTP stack (requests/urllib3/http.client/socket), JSON, thread hand-offs
(locks, queues, futures), other. Also times the same requests replayed with plain ``requests`` (one request per
turn, and one batched request per turn level), for the floor of the HTTP client alone. ``--context`` pads each episode's first prompt to that many tokens
(to show what grows with context on the HTTP side). The first two rows compare trl-env as shipped (ready turns
coalesced into batched requests) with one request per turn (trl-env before coalescing).

    python benchmarks/profile_client.py                  # stand-in server, N=64, ~1 min
    python benchmarks/profile_client.py --context 8192   # long prompts
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict

import _common as C
from stub_server import stub_server

AREAS = (
    ("trl_env", ("/trl_env/",)),
    ("tokenizer", ("tokenizers", "transformers/")),
    ("JSON", ("json/", "_json", "json.encoder", "json.decoder", "complexjson")),
    (
        "requests' per-request environment scan (proxies)",
        ("getproxies", "proxy_bypass", "<frozen os>", "_collections_abc", "get_environ_proxies"),
    ),
    (
        "HTTP stack",
        ("requests/", "urllib3/", "http/client", "socket", "ssl", "email/", "idna", "charset_normalizer", "urllib/"),
    ),
    ("threads, locks, queues, futures", ("threading.py", "queue", "_thread", "concurrent/futures", "lock")),
)


def area_of(func: tuple[str, int, str]) -> str:
    filename, _, name = func
    key = f"{filename}:{name}"
    for area, needles in AREAS:
        if any(n in key for n in needles):
            return area
    return "other"


class AllThreads:
    """cProfile every thread started while active (and the calling thread); merge the stats."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self._run = threading.Thread.run

    def __enter__(self) -> AllThreads:
        outer = self

        def run(thread: threading.Thread) -> None:
            prof = cProfile.Profile(time.thread_time)  # CPU time of this thread, not time spent blocked
            with outer.lock:
                outer.profiles.append(prof)
                outer.threads.append(thread)
            prof.enable()
            try:
                outer._run(thread)
            finally:
                prof.disable()

        threading.Thread.run = run  # type: ignore[method-assign]
        self.main = cProfile.Profile(time.thread_time)
        self.main.enable()
        return self

    def __exit__(self, *exc) -> None:
        self.main.disable()
        threading.Thread.run = self._run  # type: ignore[method-assign]

    def stats(self) -> pstats.Stats:
        """Merged stats of the threads that have ended (a profile must be read in its own thread's clock)."""
        for t in self.threads:  # the pools were closed: their threads exit within moments
            t.join(timeout=10)
        stats = pstats.Stats(self.main)
        for p, t in zip(self.profiles, self.threads):
            if t.is_alive():
                print(f"(skipped the profile of {t.name}: still running)", file=sys.stderr)
                continue
            try:
                stats.add(p)
            except TypeError:  # a profile that recorded nothing
                pass
        return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=None, help="a real server; default: the local stand-in")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--context", type=int, default=0, help="pad each first prompt to about this many tokens")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)

    import requests
    from bench_scheduling import RawReplay, Recorder, chains
    from transformers import AutoTokenizer

    from trl_env import Budgets, ChatMLProcessor, VLLMServerGenerator, batch_rollout

    tokenizer = AutoTokenizer.from_pretrained(C.tiny_model_dir())
    pad = ""
    if args.context:
        from bench_turn_cost import text_of_tokens

        pad = text_of_tokens(tokenizer, args.context)

    class PaddedFactory(C.EnvFactory):
        def __call__(self):
            env = super().__call__()
            reset = env.reset
            env.reset = lambda seed: (env, pad + reset(seed)[1])
            return env

    extra = {"ignore_eos": True, "stop_token_ids": []}
    budgets = Budgets(max_turns=4, max_new_tokens=32, max_completion_tokens=4096)
    seeds = [str(i) for i in range(args.episodes)]

    def library(url: str, seeds_: list[str], batched: bool = True, rec=None):
        gen = VLLMServerGenerator(url, temperature=1.0, extra_body=extra, max_batch=256 if batched else 1)
        g = rec(gen) if rec else gen
        out = batch_rollout(seeds_, PaddedFactory(4), ChatMLProcessor(), tokenizer, g, budgets=budgets,
                            parse_truncated_turns=True, coalesce_s="auto" if batched else 0.0)  # fmt: skip
        gen.close()
        return out, g, gen

    def go(url: str) -> None:
        rollouts, rec, gen = library(url, seeds, True, Recorder)  # warm-up, and the requests to replay
        turns = sum(len(r.turns) for r in rollouts)
        chain = chains(rec.requests, rollouts)
        body = {
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            **gen.sampling,
            **extra,
        }
        raw = RawReplay(url, gen.model, body, args.episodes, trust_env=False)
        raw.run(chain)  # warm-up
        configs = {
            "trl-env as is (ready turns coalesced, one batched request each)": lambda: library(url, seeds, True),
            "trl-env one request per turn (coalesce_s=0, max_batch=1: before)": lambda: library(url, seeds, False),
            "plain requests replay, one request per turn": lambda: raw.run(chain),
            "plain requests replay, one batched request per turn level": lambda: raw.run_batched(chain),
        }
        measured: dict[str, list[tuple[float, float]]] = defaultdict(list)
        order = list(configs)
        for rep in range(args.reps):
            for name in order if rep % 2 == 0 else order[::-1]:
                cpu0, t0 = time.process_time(), time.perf_counter()
                configs[name]()
                measured[name].append((time.process_time() - cpu0, time.perf_counter() - t0))
        raw.close()

        where = f"real server {url}" if args.base_url else "stand-in server (instant answers, its own process)"
        print(f"## profile_client: {args.episodes} episodes x 4 turns x 32 tokens, first prompt ~"
              f"{len(rollouts[0].prompt_ids)} tokens, {where}\n")  # fmt: skip
        print(f"Client process CPU per turn (all threads), median of {args.reps} interleaved repetitions "
              "(min-max), and wall time:\n")  # fmt: skip
        rows = [[name, C.fmt_range([c / turns * 1e6 for c, _ in m], 0), C.fmt_range([w for _, w in m], 2)]
                for name, m in measured.items()]  # fmt: skip
        print(C.markdown_table(["client", "CPU us per turn", "wall s"], rows))

        first, second = (statistics.median(c for c, _ in measured[k]) for k in list(configs)[:2])
        print(f"\nClient CPU per turn, trl-env as is / one request per turn (before): **{first / second:.2f}**")

        with AllThreads() as prof:
            library(url, seeds, True)
        stats = prof.stats()
        by_area: dict[str, float] = defaultdict(float)
        for func, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            by_area[area_of(func)] += tottime
        total = sum(by_area.values())
        print("\nProfiled run of trl-env as is (cProfile on every thread with that thread's CPU clock; tottime "
              "by area; the profiler inflates small calls):\n")  # fmt: skip
        rows = [[a, f"{t / turns * 1e6:.0f}", f"{100 * t / total:.0f}%"]
                for a, t in sorted(by_area.items(), key=lambda x: -x[1])]  # fmt: skip
        print(C.markdown_table(["area", "us per turn (profiled)", "share"], rows))
        print(f"\nTop {args.top} functions by cumulative time:\n\n```")
        stats.sort_stats("cumtime").print_stats(args.top)
        print("```")

    if args.base_url:
        go(args.base_url.rstrip("/"))
    else:
        with stub_server(0.0) as url:
            requests.get(f"{url}/health", timeout=5)
            go(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
