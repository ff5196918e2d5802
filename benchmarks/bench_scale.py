"""Scale: 1,000 concurrent episodes on one client (one ``VLLMServerGenerator``, one ``batch_rollout`` call).

Measures wall time, tokens/s, the client's CPU per turn (all its threads), its peak RSS (sampled every 20 ms; also the increase over the
RSS just before the run), its peak open file descriptors and sockets, the distinct sockets it opened during
the run (connection churn), its peak thread count, the sockets still open after ``generator.close()``, and
the episodes that did not finish cleanly (must be 0); for trl-env as shipped (ready turns coalesced into batched
requests) and with one request per turn (``coalesce_s=0, max_batch=1``: before coalescing).

Servers: the REAL vLLM CPU server (tiny model, one OpenMP thread; 1,000 episodes x 4 turns x 32 tokens take
about a minute on 2 cores) and a local stand-in HTTP server (``stub_server.py``, in its own process, answering
each request after a fixed delay) that isolates the client from the server's speed and can go to 5,000.

    python benchmarks/bench_scale.py               # real server (if .venv-vllm) + stand-in, ~5 min
    python benchmarks/bench_scale.py --quick       # stand-in only, 50 episodes, ~10 s
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import _common as C
import psutil
from stub_server import stub_server

from trl_env import Budgets, ChatMLProcessor, Ending, VLLMServerGenerator, batch_rollout


class Sampler(threading.Thread):
    """Samples this process's RSS, fds, sockets and threads every ``period`` seconds; keeps the peaks."""

    def __init__(self, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.period, self.stop = period, threading.Event()
        self.proc = psutil.Process()
        self.rss = self.fds = self.sockets = self.threads = 0
        self.socket_inodes: set[str] = set()

    def sample(self) -> None:
        self.rss = max(self.rss, self.proc.memory_info().rss)
        fds = os.listdir("/proc/self/fd")
        self.fds = max(self.fds, len(fds))
        socks = 0
        for fd in fds:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:"):
                socks += 1
                self.socket_inodes.add(target)
        self.sockets = max(self.sockets, socks)
        self.threads = max(self.threads, self.proc.num_threads())

    def run(self) -> None:
        while not self.stop.wait(self.period):
            self.sample()


def open_sockets() -> int:
    """Sockets this process holds now."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


MODES = {"coalesced": {}, "per-request": {"coalesce_s": 0.0, "max_batch": 1}}
"""trl-env as shipped (ready turns coalesced into batched requests), and one request per turn (before coalescing)."""


def one_run(base_url: str, tokenizer, n: int, mode: str, turns: int, tokens: int, max_in_flight: int = 256) -> dict:
    processor = ChatMLProcessor()
    budgets = Budgets(max_turns=turns, max_new_tokens=tokens, max_completion_tokens=4096)
    gc.collect()
    sockets_before = open_sockets()
    rss_before = psutil.Process().memory_info().rss
    sampler = Sampler()
    sampler.sample()
    sampler.start()
    t0, cpu0 = time.perf_counter(), time.process_time()
    options = MODES[mode]
    gen = VLLMServerGenerator(base_url, temperature=1.0, max_in_flight=max_in_flight,
                              max_batch=options.get("max_batch", 256),
                              extra_body={"ignore_eos": True, "stop_token_ids": []})  # fmt: skip
    rollouts = batch_rollout([str(i) for i in range(n)], C.EnvFactory(turns), processor, tokenizer, gen,
                             budgets=budgets, parse_truncated_turns=True,
                             **{k: v for k, v in options.items() if k == "coalesce_s"})  # fmt: skip
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sampler.stop.set()
    sampler.join()
    sampler.sample()
    sockets_end = open_sockets()
    gen.close()
    time.sleep(0.2)
    sockets_closed = open_sockets()
    del gen
    gc.collect()
    sockets_gc = open_sockets()
    bad = [r for r in rollouts if r.ending not in (Ending.ENV_DONE, Ending.MAX_TURNS) or len(r.turns) != turns]
    model_tokens = sum(t.num_model_tokens for r in rollouts for t in r.turns)
    errors = sorted({r.error.splitlines()[0][:120] for r in bad if r.error})
    turns_done = sum(len(r.turns) for r in rollouts)
    return dict(
        episodes=n, mode=mode, max_in_flight=max_in_flight, wall=wall, cpu_us_per_turn=cpu / max(1, turns_done) * 1e6, tokens=model_tokens, tokens_per_s=model_tokens / wall,
        turns_per_s=turns_done / wall,
        rss_before_mb=rss_before / 2**20, peak_rss_mb=sampler.rss / 2**20,
        peak_rss_increase_mb=(sampler.rss - rss_before) / 2**20,
        peak_fds=sampler.fds, peak_sockets=sampler.sockets, sockets_opened=len(sampler.socket_inodes),
        sockets_before=sockets_before, sockets_at_end=sockets_end, sockets_after_close=sockets_closed,
        sockets_after_gc=sockets_gc, peak_threads=sampler.threads, bad_episodes=len(bad), errors=errors[:3],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    C.add_server_options(parser)
    parser.add_argument("--server", choices=["both", "vllm", "stub"], default=None,
                        help="which server(s); default: both (stub only with --quick or without .venv-vllm)")  # fmt: skip
    parser.add_argument("--stub-delay-ms", type=float, default=20.0, help="the stand-in's answer time")
    parser.add_argument("--replot", default=None, metavar="JSON", help="redraw the table and plot from a saved run")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args(argv)
    which = args.server or ("stub" if args.quick or not (args.base_url or C.vllm_available()) else "both")
    reps = args.reps or (1 if args.quick else 2)
    out = C.out_dir(args)
    notes = C.machine_notes()

    from transformers import AutoTokenizer

    # (episodes, mode), max_in_flight at the library's default (256)
    configs_real = (
        [(100, "coalesced"), (1000, "coalesced"), (1000, "per-request")] if not args.quick else [(20, "coalesced")]
    )
    configs_stub = [(100, "coalesced"), (1000, "coalesced"), (1000, "per-request"), (5000, "coalesced"),
                    (5000, "per-request")] if not args.quick else [(50, "coalesced"), (50, "per-request")]  # fmt: skip
    results: list[dict] = []
    if args.replot is None:
        t_start = time.perf_counter()
        if which in ("both", "stub"):
            tokenizer = AutoTokenizer.from_pretrained(C.tiny_model_dir())
            with stub_server(args.stub_delay_ms) as url:
                if not args.quick:
                    one_run(url, tokenizer, 20, "coalesced", args.turns, args.tokens)  # warm-up
                for _ in range(reps):
                    for n, mode in configs_stub:
                        r = one_run(url, tokenizer, n, mode, args.turns, args.tokens)
                        results.append(dict(server=f"stand-in ({args.stub_delay_ms:g} ms/request)", **r))
                        print(f"[stub] N={n} {mode} {r['wall']:.1f} s bad={r['bad_episodes']}", file=sys.stderr)
        if which in ("both", "vllm"):
            with C.vllm_server(args.base_url, extra_args=["--no-enable-prefix-caching"], omp=args.server_omp) as (
                url,
                model_dir,
            ):
                server = C.server_config(url)
                tokenizer = AutoTokenizer.from_pretrained(model_dir)
                if not args.quick:
                    one_run(url, tokenizer, 20, "coalesced", args.turns, args.tokens)  # warm-up
                for _ in range(reps):
                    for n, mode in configs_real:
                        r = one_run(url, tokenizer, n, mode, args.turns, args.tokens)
                        results.append(dict(server=f"vLLM CPU, tiny model (max_num_seqs {server.get('max_num_seqs')})",
                                            **r))  # fmt: skip
                        print(f"[vllm] N={n} {mode} {r['wall']:.1f} s bad={r['bad_episodes']}", file=sys.stderr)
        total = time.perf_counter() - t_start
    else:  # redraw the table and plot from a saved run
        saved = json.loads(Path(args.replot).read_text())
        results, notes, total = saved["results"], saved["machine"], saved.get("total_s", float("nan"))
        reps = max(1, len(results) // max(1, len({(r["server"], r["episodes"], r.get("mode")) for r in results})))

    # ---- report: one row per (server, N, mode), medians over repetitions (max for peaks)
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(
            (r["server"], r["episodes"], r.get("mode", f"max_in_flight {r['max_in_flight']}")), []
        ).append(r)
    rows = []
    for (server, n, mode), rs in groups.items():
        rows.append([
            server, n, mode, C.fmt_range([r["wall"] for r in rs], 1),
            f"{statistics.median(r['tokens_per_s'] for r in rs):.0f}",
            f"{statistics.median(r.get('cpu_us_per_turn', float('nan')) for r in rs):.0f}",
            f"{max(r['peak_rss_mb'] for r in rs):.0f} (+{max(r['peak_rss_increase_mb'] for r in rs):.0f})",
            max(r["peak_fds"] for r in rs), max(r["peak_sockets"] for r in rs),
            max(r["sockets_opened"] for r in rs), max(r["peak_threads"] for r in rs),
            f"{max(r['sockets_after_close'] for r in rs)} / {max(r['sockets_after_gc'] for r in rs)}",
            sum(r["bad_episodes"] for r in rs),
        ])  # fmt: skip
    lines = [f"## bench_scale ({'quick' if args.quick else 'full'})", ""]
    lines.append(f"Machine: {notes}. {args.turns} turns x exactly {args.tokens} tokens per episode, cheap env; "
                 f"{reps} repetition(s) per row (wall: median (min-max); peaks: the max); total {total:.0f} s.")  # fmt: skip
    lines.append("")
    lines.append(C.markdown_table(
        ["server", "episodes", "requests", "wall s", "tokens/s", "client CPU us/turn", "peak RSS MB (+ over start)",
         "peak fds",
         "peak sockets", "sockets opened", "peak threads", "sockets after close() / after gc", "failed episodes"],
        rows))  # fmt: skip
    text = "\n".join(lines)
    print(text)
    C.save_json(out / "bench_scale.json", dict(args=vars(args), machine=notes, results=results, total_s=total))
    (out / "bench_scale.md").write_text(text + "\n")

    plt = C.plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    labels = [f"{'vLLM' if s.startswith('vLLM') else 'stand-in'}\nN={n}\n{m}" for (s, n, m) in groups]
    x = range(len(groups))
    ax1.bar(x, [max(r["peak_rss_increase_mb"] for r in rs) for rs in groups.values()])
    ax1.set_xticks(list(x), labels, fontsize=7)
    ax1.set_ylabel("peak RSS increase during the run (MB)")
    ax1.set_title("client memory")
    w = 0.4
    ax2.bar([i - w / 2 for i in x], [max(r["peak_sockets"] for r in rs) for rs in groups.values()], w,
            label="peak open sockets")  # fmt: skip
    ax2.bar([i + w / 2 for i in x], [max(r["peak_threads"] for r in rs) for rs in groups.values()], w,
            label="peak threads")  # fmt: skip
    ax2.set_xticks(list(x), labels, fontsize=7)
    ax2.set_title("client sockets and threads (bounded by max_in_flight=256)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_scale.png", dpi=110)
    print(f"\nwrote {out / 'bench_scale.png'}", file=sys.stderr)
    bad = sum(r["bad_episodes"] for r in results)
    if bad:
        print(f"FAILED: {bad} episodes did not finish cleanly: {results[-1]['errors']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
