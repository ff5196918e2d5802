"""Turn-level credit, side by side: the same model, task, seeds and steps under every ``credit=`` estimator.

Trains the tiny model of ``trl_env.testing`` (or ``--model PATH``) with ``EpisodeGRPOTrainer`` and
``make_rollout_func(..., credit=...)`` on one task (``--task``): ``maze`` (default, the text maze of
``experiment/examples/text_maze.py``) or a task of ``trl_env.testing.credit_tasks``: ``rounds`` (8 independent
rounds, each paid on its turn), ``loop`` (a 12-turn ring walk with recurring states), ``early`` (turn 0 decides,
paid at the end). Once per (estimator, seed): ``episode`` (the baseline), ``discounted`` (gamma 1),
``discounted_g0.9``, ``gigpo``, ``per_turn_index`` (the biased reference), and on request ``discounted_g0``
(``credit_runs.VARIANTS``), each with training seeds 0 .. reps-1. The runs are ordered block by block (one block
per seed, its estimators shuffled) and run one at a time on one torch thread, or ``--jobs N`` at once in worker
processes, so load falls on every estimator alike. Each run records the mean env reward and the fraction of
episodes that succeeded (the maze: reached the goal; the others: reached the fixed level) at every step.

Writes ``credit_curves.png`` / ``credit.json`` / ``credit.md`` for the maze and ``credit_{task}_curves.png`` /
``.json`` / ``.md`` for the others: per estimator the mean curve over seeds with a band of +-1 std; final
reward = the mean of the last ``--last`` steps of a run, then mean +- std (and min-max) over seeds; "all steps"
is the mean over every step; the speed column is the first step whose 5-step mean reward reaches a fixed level
(halfway from the uniform random policy's expected return to the best one), per seed. A second table needs no
training: how well each estimator's per-turn advantages track the exact ones (dynamic programming) under a random
policy (``credit_tasks.credit_quality``), with the GiGPO anchor statistics. Nothing is asserted: the tables say
what the run says. ``--reps N``: training seeds 0 .. N-1 (default 3).

    python benchmarks/bench_credit.py               # the maze: 5 estimators x 3 seeds x 80 steps, ~25 min on 2 cores
    python benchmarks/bench_credit.py --task rounds --steps 100 --jobs 8   # docs/credit.md has every command
    python benchmarks/bench_credit.py --quick --task loop   # smoke test: 2 steps per estimator, one seed
    python benchmarks/bench_credit.py --replot benchmarks/results/credit.json   # redraw table and plot
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as C
import credit_runs as CR

sys.path.insert(0, str(C.REPO_ROOT / "experiment" / "examples"))  # text_maze.py
sys.path.insert(0, str(C.REPO_ROOT / "experiment"))  # models.py, training.py

CREDITS = CR.VARIANTS
COLORS = CR.COLORS


def run_one(settings: dict[str, Any], credit: str, seed: int) -> dict[str, Any]:
    """One training run (``credit_runs.run_one``); in a worker process with ``--jobs`` above 1."""
    return CR.run_one(settings, credit, seed)


SMOOTH_REACH = 5
"""The learning-speed column: the first step whose env reward, averaged over the last 5 steps, reaches the task's
fixed level (halfway from the uniform random policy's expected return to the best return)."""


def reached(values: list[float], level: float, window: int) -> int | None:
    """The first step (1-based) whose trailing ``window``-step mean of ``values`` is at least ``level``."""
    return next((i + 1 for i, x in enumerate(smooth(values, window)) if x >= level), None)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` steps (shorter at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(runs: list[dict[str, Any]], credits: list[str], last: int, level: float) -> list[dict[str, Any]]:
    """Per estimator: final reward / success (mean of the last ``last`` steps) and all-steps reward, over seeds."""
    rows = []
    for credit in credits:
        mine = sorted((r for r in runs if r["credit"] == credit), key=lambda r: r["seed"])
        if not mine:
            continue
        final = [statistics.fmean(r["rewards"][-last:]) for r in mine]
        success = [statistics.fmean(r["success"][-last:]) for r in mine]
        overall = [statistics.fmean(r["rewards"]) for r in mine]
        first = [statistics.fmean(r["rewards"][:last]) for r in mine]
        reach = [reached(r["rewards"], level, SMOOTH_REACH) for r in mine]
        rows.append(dict(
            credit=credit, seeds=[r["seed"] for r in mine], final=final, final_mean_std=mean_std(final),
            success=success, success_mean_std=mean_std(success), overall=overall, overall_mean_std=mean_std(overall),
            first=first, first_mean_std=mean_std(first), reach=reach, wall_s=[r["wall_s"] for r in mine],
        ))  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]], last: int, steps: int, level: float, success: str) -> str:
    """The markdown table of ``summarise``'s rows."""
    base = next((r for r in rows if r["credit"] == "episode"), None)
    body = []
    for r in rows:
        (fm, fs), (sm, ss), (om, os_), (im, is_) = (r["final_mean_std"], r["success_mean_std"],
                                                    r["overall_mean_std"], r["first_mean_std"])  # fmt: skip
        diff = "" if base is None or r is base else f"{fm - base['final_mean_std'][0]:+.2f}"
        body.append([
            f"`{r['credit']}`", len(r["seeds"]), f"{im:.2f} ± {is_:.2f}", f"**{fm:.2f} ± {fs:.2f}**",
            f"{min(r['final']):.2f} to {max(r['final']):.2f}", diff or "(baseline)", f"{sm:.2f} ± {ss:.2f}",
            f"{om:.2f} ± {os_:.2f}", " / ".join("-" if x is None else str(x) for x in r["reach"]),
            f"{statistics.fmean(r['wall_s']):.0f}",
        ])  # fmt: skip
    header = ["credit", "seeds", f"reward, first {last} steps", f"final reward (last {last} of {steps} steps)",
              "final, min to max over seeds", "final vs episode", f"{success}, last {last} steps",
              "reward, all steps", f"step the reward reaches {level:.2f}, per seed", "wall s / run"]  # fmt: skip
    return C.markdown_table(header, body)


def plot(runs: list[dict[str, Any]], credits: list[str], window: int, path: Path, title: str, success: str) -> None:
    """Mean curve per estimator with a +-1 std band over seeds: reward (left) and success (right)."""
    plt = C.plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "rewards", "mean env reward per step"), (axes[1], "success", success)):
        for credit in credits:
            curves = [smooth(r[key], window) for r in runs if r["credit"] == credit]
            if not curves:
                continue
            n = min(map(len, curves))
            steps = list(range(1, n + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
            std = [statistics.stdev(c[i] for c in curves) if len(curves) > 1 else 0.0 for i in range(n)]
            color = COLORS.get(credit)
            ax.plot(steps, mean, color=color, label=f"{credit} ({len(curves)} seeds)")
            ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=color, alpha=0.15)  # fmt: skip
        ax.set(xlabel="training step", ylabel=f"{label} (moving average, {window} steps)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


TASK_TEXT = {
    "maze": ("text maze", "goal reached", "the goal by the shortest path"),
    "rounds": ("8 independent rounds, +1 each for the round's letter", "episodes at the level", "every round right"),
    "loop": ("a ring of 6 nodes walked 12 turns, +1 per visit of the goal", "episodes at the level", "R, R, ..."),
    "early": ("turn 0 decides, paid at turn 10; 9 turns that do not matter", "episodes won", "A on turn 0"),
}


def stem(settings: dict[str, Any]) -> str:
    """``credit`` for the maze (the results it always had), ``credit_{task}`` for the others."""
    task = settings.get("task", "maze")
    return "credit" if task == "maze" else f"credit_{task}"


def report(data: dict[str, Any], out: Path) -> str:
    """Table, PNG and markdown from a run's data (also used by ``--replot``)."""
    s = data["settings"]
    s.setdefault("task", "maze")
    what, success, best_how = TASK_TEXT[s["task"]]
    low, best, level = CR.target(s)
    credits = [c for c in s["credits"] if any(r["credit"] == c for r in data["runs"])]
    rows = summarise(data["runs"], credits, s["last"], level)
    text = table(rows, s["last"], s["steps"], level, success)
    title = (f"{what}, {s['model']} model: {s['steps']} steps x {s['batch']} episodes "
             f"({s['generations']} per group), lr {s['lr']}"
             + (f", progress reward {s['progress']}" if s.get("progress") else "")
             + ", band = ±1 std over seeds")  # fmt: skip
    plot(data["runs"], credits, s["smooth"], out / f"{stem(s)}_curves.png", title, success)
    if "quality" not in data or "anchor_groups" not in data["quality"][0]:  # older saves: computed here (seconds)
        data["quality"] = CR.quality(s, groups=s.get("quality_groups", 400))
    quality = C.markdown_table(
        ["credit", "correlation with the exact advantage", "sign agrees", "anchor_groups", "anchored_turn_frac"],
        [[f"`{q['credit']}`", f"{q['correlation']:.3f}", f"{q['sign_agreement']:.1%}", f"{q['anchor_groups']:.2f}",
          f"{q['anchored_turn_frac']:.2f}"] for q in data["quality"]],
    )  # fmt: skip
    q0 = data["quality"][0]
    lines = [
        f"# Turn-level credit: {what} (`benchmarks/bench_credit.py --task {s['task']}`)",
        "",
        f"{data['machine']}. Total wall time {data['total_s'] / 60:.1f} min for {len(data['runs'])} runs.",
        "",
        f"Settings: {json.dumps(s)}",
        "",
        text,
        "",
        "Final reward: per run, the mean env reward of its last steps; then mean ± std (ddof=1) over seeds. "
        f"The best possible episode reward is {best:.2f} ({best_how}); a uniformly random reply earns {low:.2f} "
        f"on average; the fixed level of the speed column is halfway, {level:.2f} (5-step moving average).",
        "",
        f"Credit quality without training ({q0['groups']} groups of {s['generations']} episodes, {q0['turns']} turns, "
        "a uniformly random policy over the moves and an invalid reply): each estimator's per-turn advantages "
        "against the exact ones, Q(state, turn, move) - V(state, turn) by dynamic programming "
        "(`trl_env.testing.credit_tasks.credit_quality`); sign agreement over the turns whose exact advantage is "
        "not 0; the anchor columns are `credit_metrics`'s (the same for every estimator).",
        "",
        quality,
    ]
    (out / f"{stem(s)}.md").write_text("\n".join(lines) + "\n")
    return text + "\n\n" + quality


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.set_defaults(reps=None)
    parser.add_argument("--task", default="maze", choices=CR.TASK_NAMES, help="maze (default), rounds, loop, early")
    parser.add_argument("--credits", default=",".join(CR.DEFAULT_VARIANTS), help=f"comma-separated labels of {CREDITS}")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 80; --quick 2)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one process and torch thread each")
    parser.add_argument("--model", default="tiny", help="'tiny' (default), 'smollm2' or a model folder")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16, help="episodes per step")
    parser.add_argument("--generations", type=int, default=8, help="episodes per GRPO group")
    parser.add_argument("--tokens", type=int, default=3, help="max new tokens per turn")
    parser.add_argument("--max-turns", type=int, default=6, help="the maze's turn limit (the tasks fix their own)")
    parser.add_argument("--layout", default=None, help="maze rows joined by '/', e.g. '.S.#/.#.G/.###'")
    parser.add_argument("--progress", type=float, default=0.0, help="maze: reward per move closer to the goal")
    parser.add_argument("--last", type=int, default=None, help="final reward = mean of the last K steps (default 10)")
    parser.add_argument("--smooth", type=int, default=5, help="moving-average window of the plot")
    parser.add_argument("--replot", default=None, metavar="JSON", help="redraw the table and plot from a saved run")
    args = parser.parse_args(argv)
    out = C.out_dir(args)
    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        print(report(data, out))
        C.save_json(out / f"{stem(data['settings'])}.json", data)  # with the credit-quality table, where missing
        return 0
    reps = args.reps or (1 if args.quick else 3)
    args.steps = args.steps or (2 if args.quick else 80)
    args.last = args.last or (1 if args.quick else 10)
    if args.quick:
        args.batch, args.generations = 8, 4
    credits = [c.strip() for c in args.credits.split(",") if c.strip()]
    unknown = sorted(set(credits) - set(CREDITS))
    if unknown:
        parser.error(f"--credits {','.join(unknown)}: expected labels of {CREDITS}")
    settings = dict(
        task=args.task, credits=credits, seeds=list(range(reps)), steps=args.steps, model=args.model, lr=args.lr,
        batch=args.batch, generations=args.generations, tokens=args.tokens, max_turns=args.max_turns,
        layout=args.layout, progress=args.progress, last=args.last, smooth=args.smooth, order_seed=args.seed,
        quality_groups=50 if args.quick else 400, jobs=args.jobs,
    )  # fmt: skip
    data: dict[str, Any] = dict(settings=settings, machine=C.machine_notes(), runs=[], total_s=0.0)
    rng = random.Random(args.seed)
    order = []  # block by block: one block per seed, its estimators shuffled
    for seed in range(reps):
        block = list(credits)
        rng.shuffle(block)
        order += [(credit, seed) for credit in block]
    started = time.perf_counter()

    def done(result: dict[str, Any]) -> None:
        data["runs"].append(result)
        data["total_s"] = time.perf_counter() - started
        final = statistics.fmean(result["rewards"][-args.last :]) if result["rewards"] else math.nan
        print(f"[credit] {args.task} seed {result['seed']} {result['credit']:>15}: final reward {final:+.3f} "
              f"({result['wall_s']:.0f} s, {data['total_s'] / 60:.1f} min so far)", file=sys.stderr)  # fmt: skip
        C.save_json(out / f"{stem(settings)}.json", data)  # after every run: a cut run keeps what it has

    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, max_tasks_per_child=1) as pool:
            futures = [pool.submit(run_one, settings, credit, seed) for credit, seed in order]
            for future in futures:  # in the interleaved order, whatever finishes first
                done(future.result())
    else:
        for credit, seed in order:
            done(run_one(settings, credit, seed))
    text = report(data, out)
    C.save_json(out / f"{stem(settings)}.json", data)
    print(text)
    print(f"\n{len(data['runs'])} runs in {data['total_s'] / 60:.1f} min; wrote {out / (stem(settings) + '_curves.png')}, "
          f"{out / (stem(settings) + '.json')}, {out / (stem(settings) + '.md')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
