"""Recovery of a failed batched request: halves re-sent one after the other (before) vs at once (now), in one run.

``VLLMServerGenerator`` splits a batch the server failed as a whole and sends the halves again, down to the prompt
the server cannot serve. Before issue 32 (item 7) the halves went one after the other, depth first, on the batch's
request thread, so every healthy half that came after the poisoned one waited for its whole subtree; now both
halves are sent at once. ``SequentialRecovery`` below is the former ``_complete``, verbatim, so both run side by
side against the same stand-in server (benchmarks/stub_server.py: ``--delay-ms`` per request, HTTP 500 for any
request that holds the poisoned prompt). Two placements of the poisoned prompt: first (every healthy half waited
before) and last (the healthy halves came first). A third case: a server that cannot answer more than
``--slow-over`` prompts within the client's timeout; before, the batch's read timeout failed all its prompts.

    python benchmarks/bench_recovery.py            # ~1 min: 64 prompts, 50 ms per request, 7 interleaved reps
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from concurrent.futures import Future, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, fmt_range, markdown_table, out_dir, plt, save_json  # noqa: E402
from stub_server import stub_server  # noqa: E402

from trl_env import GenerationRequest, ServerError  # noqa: E402
from trl_env.backends.base import Generation  # noqa: E402
from trl_env.backends.vllm_server import VLLMServerGenerator, _halves  # noqa: E402

POISON = 7777


class SequentialRecovery(VLLMServerGenerator):
    """The recovery before issue 32: ``_complete`` as it was at commit 240275f (halves sent in turn)."""

    def _complete(self, members, resend=None, *, again=True, split_timeout=True):
        results = self._sample(members, retries=self.retries if resend is None else min(self.retries, 1))
        if isinstance(results, ServerError):
            resend = [4 * len(members).bit_length() + 1] if resend is None else resend
            unusable = results.status_code == 200
            parts = _halves(members) if len(members) > 1 else [members] if again and unusable else []
            if parts and not results.unreachable and resend[0] >= len(parts):
                resend[0] -= len(parts)
                for part in parts:
                    self._complete(part, resend, again=len(part) > 1 or part is not members)
                return
            results = [results] * len(members)
        for (_, future), result in zip(members, results, strict=True):
            if isinstance(result, Generation):
                future.set_result(result)
            else:
                future.set_exception(result)


VARIANTS = {"before (one half after the other)": SequentialRecovery, "now (halves at once)": VLLMServerGenerator}


def one_run(cls, url: str, prompts: int, poisoned: int | None, *, timeout: float) -> dict[str, float]:
    """Submit one batch of ``prompts``; when each prompt settled (s from submit), and how many failed."""
    gen = cls(url, retries=1, backoff=0.01, timeout=timeout, max_batch=prompts)
    requests = [GenerationRequest([1, 2, POISON if i == poisoned else 100 + i], 4, (2,)) for i in range(prompts)]
    settled: list[float] = [0.0] * prompts
    start = time.perf_counter()

    def record(i: int):
        return lambda _: settled.__setitem__(i, time.perf_counter() - start)

    futures: list[Future] = gen.submit(requests)
    for i, f in enumerate(futures):
        f.add_done_callback(record(i))
    wait(futures, timeout=120)
    gen.close()
    healthy = [i for i in range(prompts) if i != poisoned]
    failed = [i for i in healthy if futures[i].exception() is not None]
    return {
        "healthy_done_s": max(settled[i] for i in healthy),
        "healthy_median_s": statistics.median(settled[i] for i in healthy),
        "poisoned_done_s": settled[poisoned] if poisoned is not None else float("nan"),
        "healthy_failed": len(failed),
    }


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--delay-ms", type=float, default=50.0, help="the stand-in's time per request")
    parser.add_argument("--slow-over", type=int, default=None, help="timeout case: more prompts than this time out")
    parser.add_argument("--timeout", type=float, default=0.5, help="client timeout in the timeout case (s)")
    args = parser.parse_args()
    prompts = 16 if args.quick else args.prompts
    reps = 1 if args.quick else args.reps or 7
    slow_over = args.slow_over or prompts // 2
    cases = {"poisoned first": 0, "poisoned last": prompts - 1}
    rng = random.Random(args.seed)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(c, v): [] for c in [*cases, "timeout"] for v in VARIANTS}
    with (
        stub_server(args.delay_ms, poison_id=POISON) as url,
        stub_server(args.delay_ms, slow_over=slow_over, slow_ms=4000 * args.timeout) as slow_url,
    ):
        for rep in range(reps + 1):  # the first round warms up (connections, imports) and is dropped
            order = [*cases, "timeout"]
            rng.shuffle(order)
            for case in order:
                variants = list(VARIANTS)
                rng.shuffle(variants)
                for variant in variants:
                    if case == "timeout":
                        result = one_run(VARIANTS[variant], slow_url, prompts, None, timeout=args.timeout)
                    else:
                        result = one_run(VARIANTS[variant], url, prompts, cases[case], timeout=60.0)
                    if rep:
                        runs[case, variant].append(result)
    rows, data = [], []
    for (case, variant), results in runs.items():
        done = [r["healthy_done_s"] for r in results]
        med = [r["healthy_median_s"] for r in results]
        poisoned = [r["poisoned_done_s"] for r in results]
        failed = statistics.median(r["healthy_failed"] for r in results)
        rows.append([case, prompts, variant, fmt_range(done), fmt_range(med),
                     "-" if case == "timeout" else fmt_range(poisoned), f"{failed:.0f}"])  # fmt: skip
        data.append({"case": case, "prompts": prompts, "variant": variant, "runs": results})
    print(f"{reps} interleaved repetitions after a warm-up; stand-in server {args.delay_ms:.0f} ms per request; "
          f"client retries=1, backoff=0.01; timeout case: client timeout {args.timeout} s, a request of more than "
          f"{slow_over} prompts takes {4 * args.timeout:.1f} s more. Seconds from submit, median (min-max).\n")  # fmt: skip
    print(markdown_table(["case", "prompts", "recovery", "last healthy prompt settled (s)",
                          "median healthy prompt (s)", "poisoned prompt failed (s)", "healthy prompts lost"],
                         rows))  # fmt: skip
    out = out_dir(args)
    save_json(out / "bench_recovery.json", {"args": vars(args), "results": data})
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 3.5))
    labels = [f"{case}\n{variant.split(' (')[0]}" for case, variant in runs]
    values = [statistics.median(r["healthy_done_s"] for r in results) for results in runs.values()]
    ax.bar(range(len(values)), values, color=["#bbb", "#2a7"] * (len(values) // 2))
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("last healthy prompt settled (s)")
    ax.set_title("Recovery of a failed batch: halves in turn (before) vs at once (now)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "bench_recovery.png", dpi=120)


if __name__ == "__main__":
    main()
