"""Per-turn CPU cost of the library (tokenising env deltas, decoding turns, bookkeeping, scheduling) vs context length.

The generator is a stand-in that returns the same 16 ids at once (an already-resolved future), so the
process's CPU time is the library's own work (plus the env's, which is trivial here: it returns a short
constant string). Per-turn cost = (CPU of a run with T+M turns - CPU of a run with T turns) / (episodes x M),
which cancels everything paid once per episode (building the env, its first prompt and first turn, building
the Rollout). The history comes from one long first model turn (``--history turn``, the default: its one-time
cost is a decode) or a long env prompt (``--history prompt``: a one-time encode of up to 8k tokens, whose
run-to-run jitter on a loaded box is larger than the per-turn signal), sized so that the M measured turns run,
on average, at the context length in the table. The stand-in's own cost (measured alone) is subtracted.

Two clocks: process CPU time (every thread: the scheduler and the env workers) and the scheduler thread's CPU
time (``batch_rollout`` runs its loop in the calling thread). A second table varies the number of concurrent
episodes at a fixed context, to show what grows with the batch rather than the history. ``--profile`` adds a
cProfile of the 512 and 8k runs, and micro-timings of the per-turn list concatenation and of the JSON encoding
of a prompt (what the HTTP backend adds per turn, outside the library).

    python benchmarks/bench_turn_cost.py            # ~3 min
    python benchmarks/bench_turn_cost.py --quick    # smoke test, ~10 s
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import pstats
import queue
import random
import statistics
import sys
import threading
import time
import timeit
from collections.abc import Sequence
from concurrent.futures import Future, wait

import _common as C

from trl_env import Budgets, ChatMLProcessor, Ending, FinishReason, Generation, GenerationRequest, batch_rollout
from trl_env.backends.base import resolved

TURN_IDS = 16  # sampled ids per turn (the last one is the end-of-turn id)


class InstantGenerator:
    """Returns the same ids for every request, already resolved: costs a few microseconds per request.

    With ``first`` set, an episode's first request (a prompt of at most ``short`` ids) gets that long turn
    instead: the history then comes from a long model turn rather than a long env prompt.
    """

    continuous = True

    def __init__(self, ids: list[int]) -> None:
        self.generation = Generation(list(ids), [-1.0] * len(ids), FinishReason.STOP)
        self.first: Generation | None = None
        self.short = 0

    def pick(self, request: GenerationRequest) -> Generation:
        if self.first is not None and len(request.prompt_ids) <= self.short:
            return self.first
        return self.generation

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        return [resolved(self.pick(r)) for r in requests]


class ThreadedGenerator(InstantGenerator):
    """Like ``InstantGenerator``, but a background thread resolves each future (as an HTTP backend's pool does),
    so the engine really waits on pending futures; its own cost is measured and subtracted.
    """

    continuous = True

    def __init__(self, ids: list[int]) -> None:
        super().__init__(ids)
        self.queue: queue.SimpleQueue[tuple[Future[Generation], Generation] | None] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while (item := self.queue.get()) is not None:
            item[0].set_result(item[1])

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        futures: list[Future[Generation]] = [Future() for _ in requests]
        for f, r in zip(futures, requests):
            self.queue.put((f, self.pick(r)))
        return futures

    def cost(self, n: int = 10000) -> float:
        """Process CPU seconds per request: submit n, wait for all."""
        req = GenerationRequest([1], TURN_IDS, ())
        p0 = time.process_time()
        futures = [f for _ in range(n) for f in self.submit([req])]
        wait(futures)
        return (time.process_time() - p0) / n


class LongPromptEnv:
    """First observation: a given long text; then a short constant delta per step, forever (budgets end it)."""

    def __init__(self, prompt: str) -> None:
        self.prompt, self.reward, self.alive = prompt, 0.0, True

    def reset(self, seed: str) -> tuple[LongPromptEnv, str]:
        return self, self.prompt

    def step(self, action: str) -> tuple[LongPromptEnv, str]:
        self.reward += 1.0
        return self, "Noted: higher. Try again."


class Factory:
    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.__qualname__ = "LongPromptEnv"

    def __call__(self) -> LongPromptEnv:
        return LongPromptEnv(self.prompt)


def text_of_tokens(tokenizer, n_tokens: int) -> str:
    """A text of about ``n_tokens`` tokens (words and numbers)."""
    rng = random.Random(n_tokens)
    words = "the number is higher lower guess again between one two three and my answer".split()
    parts: list[str] = []
    while True:
        parts += [rng.choice(words) if rng.random() < 0.8 else str(rng.randint(0, 999)) for _ in range(n_tokens)]
        ids = tokenizer.encode(" ".join(parts), add_special_tokens=False)
        if len(ids) >= n_tokens:
            return tokenizer.decode(ids[:n_tokens])


def run(tokenizer, processor, gen, prompt: str, episodes: int, turns: int, collect: bool = True):
    """CPU seconds (process, this thread) of one ``batch_rollout``; and its rollouts."""
    budgets = Budgets(max_turns=turns, max_new_tokens=10**6, max_completion_tokens=10**7)
    if collect:
        gc.collect()
    p0, t0 = time.process_time(), time.thread_time()
    rollouts = batch_rollout([str(i) for i in range(episodes)], Factory(prompt), processor, tokenizer, gen,
                             budgets=budgets)  # fmt: skip
    p1, t1 = time.process_time(), time.thread_time()
    assert all(r.ending is Ending.MAX_TURNS and len(r.turns) == turns for r in rollouts), rollouts[0]
    return p1 - p0, t1 - t0, rollouts


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--contexts", default=None, help="mean contexts of the measured turns (default 512..8192)")
    parser.add_argument("--episodes", type=int, default=None, help="concurrent episodes per run (default 32)")
    parser.add_argument("--turns", type=int, default=None, help="measured turns per episode (default 8)")
    parser.add_argument("--profile", action="store_true", help="cProfile at the smallest and largest context")
    parser.add_argument("--history", choices=["turn", "prompt"], default="turn",
                        help="where the long context comes from: one long first model turn (default; its one-time "
                             "cost is a decode, small next to the per-turn signal) or a long env prompt (a one-time "
                             "encode of up to 8k tokens that swamps the difference on a noisy box)")  # fmt: skip
    args = parser.parse_args(argv)
    contexts = [int(x) for x in (args.contexts or ("512,8192" if args.quick else "512,1024,2048,4096,8192")).split(",")]
    episodes = args.episodes or (4 if args.quick else 32)
    measured = args.turns or (2 if args.quick else 16)
    reps = args.reps or (1 if args.quick else 15)
    batch_sizes = [4, 8] if args.quick else [16, 64, 256, 1000]
    base_turns = 2  # the shorter run; the longer has base_turns + measured
    out = C.out_dir(args)
    rng = random.Random(args.seed)
    notes = C.machine_notes()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(C.tiny_model_dir())  # the tiny test tokenizer (byte-level BPE)
    processor = ChatMLProcessor()
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn_ids = tokenizer.encode(" my guess is 42 then 57 and 63 between 10 and 90 ok", add_special_tokens=False)
    turn_ids = (turn_ids * 4)[: TURN_IDS - 1] + [stop]
    gen = InstantGenerator(turn_ids)
    threaded = ThreadedGenerator(turn_ids)
    delta_tokens = len(tokenizer.encode(processor.append_user_input("Noted: higher. Try again."),
                                        add_special_tokens=False))  # fmt: skip
    per_turn = TURN_IDS + delta_tokens
    header = len(tokenizer.encode(processor.init_system_input(""), add_special_tokens=False))

    short_prompt = "Let's play."
    short_len = len(tokenizer.encode(processor.init_system_input(short_prompt), add_special_tokens=False))

    def setup(context: int) -> tuple[str, Generation | None]:
        """The env's first prompt and the first model turn for runs whose measured turns average ``context``."""
        # mean context over the measured turns (turns base_turns+1 .. base_turns+measured) = `context`
        history = context - per_turn * (base_turns + (measured - 1) / 2)
        if args.history == "prompt":
            return text_of_tokens(tokenizer, max(8, int(history - header))), None
        n = max(TURN_IDS, int(history - short_len - delta_tokens + per_turn))
        ids = (turn_ids[:-1] * (n // (len(turn_ids) - 1) + 1))[: n - 1] + [stop]
        return short_prompt, Generation(ids, [-1.0] * len(ids), FinishReason.STOP)

    prompts = {c: setup(c) for c in contexts}

    # the stand-in's own cost per request
    req = GenerationRequest([1] * 512, TURN_IDS, (stop,))
    standin_s = min(timeit.repeat(lambda: gen.submit([req]), number=2000, repeat=5)) / 2000
    threaded_s = statistics.median(threaded.cost(1000 if args.quick else 10000) for _ in range(5))

    def per_turn_cost(setup_: tuple, n: int, g=gen, own=standin_s) -> tuple[float, float, float]:
        prompt, g.first = setup_
        g.short = short_len
        pa, ta, short = run(tokenizer, processor, g, prompt, n, base_turns)
        pb, tb, long = run(tokenizer, processor, g, prompt, n, base_turns + measured)
        turns = n * measured
        ctx = statistics.mean(len(r.prompt_ids) + sum(t.num_model_tokens + t.num_env_tokens for t in r.turns[:k])
                              for r in long for k in range(base_turns, base_turns + measured))  # fmt: skip
        return (pb - pa) / turns - own, (tb - ta) / turns - own, ctx

    t_start = time.perf_counter()
    for c in contexts:  # warm-up
        per_turn_cost(prompts[c], episodes)
    by_ctx: dict[int, list[tuple[float, float, float]]] = {c: [] for c in contexts}
    by_n: dict[int, list[tuple[float, float, float]]] = {n: [] for n in batch_sizes}
    for _ in range(reps):
        jobs = [("ctx", c) for c in contexts] + [("n", n) for n in batch_sizes]
        rng.shuffle(jobs)
        for kind, x in jobs:
            if kind == "ctx":
                by_ctx[x].append(per_turn_cost(prompts[x], episodes))
            else:
                by_n[x].append(per_turn_cost(prompts[contexts[0]], x, threaded, threaded_s))
    total = time.perf_counter() - t_start

    # ---- report
    lines = [f"## bench_turn_cost ({'quick' if args.quick else 'full'})", ""]
    lines.append(f"Machine: {notes}. {reps} repetitions (interleaved, shuffled) after a warm-up; total {total:.0f} s. "
                 f"Per turn: {TURN_IDS} sampled ids + {delta_tokens} env-text ids; {episodes} concurrent episodes; "
                 f"per-turn cost = difference of runs with {base_turns} and {base_turns + measured} turns; history from "
                 f"{'one long first model turn' if args.history == 'turn' else 'a long env prompt'}. "
                 f"Stand-in cost subtracted: {standin_s * 1e6:.1f} us per request.")  # fmt: skip
    lines.append("")
    rows, summary = [], {}
    base = statistics.median(x[0] for x in by_ctx[contexts[0]])
    base_t = statistics.median(x[1] for x in by_ctx[contexts[0]])
    for c in contexts:
        proc = [x[0] * 1e6 for x in by_ctx[c]]
        thr = [x[1] * 1e6 for x in by_ctx[c]]
        ctx = statistics.mean(x[2] for x in by_ctx[c])
        rows.append([c, f"{ctx:.0f}", C.fmt_range(proc, 0), f"{statistics.median(proc) / 1e6 / base:.2f}",
                     C.fmt_range(thr, 0), f"{statistics.median(thr) / 1e6 / base_t:.2f}"])  # fmt: skip
        summary[c] = dict(process_us=C.summary(proc), thread_us=C.summary(thr), mean_context=ctx)
    lines.append(C.markdown_table(
        ["context", "mean measured context", "process CPU us/turn, median (min-max)", f"ratio to {contexts[0]}",
         "scheduler-thread CPU us/turn", f"ratio to {contexts[0]}"], rows))  # fmt: skip
    ratio = statistics.median(x[0] for x in by_ctx[contexts[-1]]) / base
    lines.append("")
    lines.append(f"**Ratio {contexts[-1]} / {contexts[0]} (process CPU): {ratio:.2f}** (target <= 1.5).")
    lines.append("")
    rows_n = []
    base_n = statistics.median(x[0] for x in by_n[batch_sizes[0]])
    for n in batch_sizes:
        proc = [x[0] * 1e6 for x in by_n[n]]
        rows_n.append([n, C.fmt_range(proc, 0), f"{statistics.median(proc) / 1e6 / base_n:.2f}"])
        summary[f"episodes={n}"] = dict(process_us=C.summary(proc))
    lines.append(
        f"Per-turn cost vs concurrent episodes (context {contexts[0]}; here a background thread resolves "
        f"each request, as an HTTP pool does, so the engine waits on pending futures; that thread's "
        f"{threaded_s * 1e6:.1f} us per request is subtracted):"
    )
    lines.append("")
    lines.append(C.markdown_table(["episodes", "process CPU us/turn, median (min-max)",
                                   f"ratio to {batch_sizes[0]}"], rows_n))  # fmt: skip
    lines.append("")

    # micro-timings: what is O(context) per turn
    micro = []
    for c in contexts:
        a, b = list(range(c // 2)), list(range(c - c // 2))
        k = 20 if args.quick else 200
        concat = min(timeit.repeat(lambda a=a, b=b: a + b, number=10 * k, repeat=5)) / (10 * k)
        body = {"model": "m", "prompt": a + b, "max_tokens": 32}
        dumps = min(timeit.repeat(lambda body=body: json.dumps(body), number=k, repeat=5)) / k
        micro.append([c, f"{concat * 1e6:.1f}", f"{dumps * 1e6:.0f}"])
        summary[f"micro_{c}"] = dict(concat_us=concat * 1e6, json_dumps_us=dumps * 1e6)
    lines.append("Micro-timings of the O(context) work per turn (best of 5):")
    lines.append("")
    lines.append(C.markdown_table(["context", "`prompt_ids + completion_ids` us (library, rollout.py `_request`)",
                                   "`json.dumps` of the request us (HTTP backend, not library)"], micro))  # fmt: skip
    lines.append("")

    if args.profile:
        for c in (contexts[0], contexts[-1]):
            prof = cProfile.Profile()
            gc.collect()
            prof.enable()
            gen.first, gen.short = prompts[c][1], short_len
            run(tokenizer, processor, gen, prompts[c][0], episodes, base_turns + measured, collect=False)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
            lines += [f"cProfile, context {c}, {episodes} episodes x {base_turns + measured} turns (by tottime):",
                      "", "```", *[x for x in buf.getvalue().splitlines() if x.strip()][:30], "```", ""]  # fmt: skip

    text = "\n".join(lines)
    print(text)
    C.save_json(out / "bench_turn_cost.json", dict(args=vars(args), machine=notes, summary=summary, ratio=ratio,
                                                   raw=dict(by_ctx=by_ctx, by_n=by_n)))  # fmt: skip
    (out / "bench_turn_cost.md").write_text(text + "\n")

    plt = C.plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, label in ((0, "process CPU"), (1, "scheduler thread CPU")):
        med = [statistics.median(x[i] for x in by_ctx[c]) * 1e6 for c in contexts]
        lo = [min(x[i] for x in by_ctx[c]) * 1e6 for c in contexts]
        hi = [max(x[i] for x in by_ctx[c]) * 1e6 for c in contexts]
        ax.errorbar(contexts, med, yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]],
                    marker="o", capsize=3, label=label)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("library CPU per turn (us), median, min-max")
    ax.set_title(f"per-turn cost vs context ({episodes} episodes)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    med = [statistics.median(x[0] for x in by_n[n]) * 1e6 for n in batch_sizes]
    ax2.plot(batch_sizes, med, marker="o")
    ax2.set_xscale("log")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("concurrent episodes")
    ax2.set_ylabel("process CPU per turn (us), median")
    ax2.set_title(f"per-turn cost vs concurrent episodes (context {contexts[0]})")
    ax2.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "bench_turn_cost.png", dpi=110)
    print(f"\nwrote {out / 'bench_turn_cost.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
