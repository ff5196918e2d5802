"""Turn-level credit, side by side: the same model, maze, seeds and steps under every ``credit=`` estimator.

Trains the tiny model of ``trl_env.testing`` (or ``--model PATH``) on the text maze of
``experiment/examples/text_maze.py`` with ``EpisodeGRPOTrainer`` and ``make_rollout_func(..., credit=NAME)``,
once per (estimator, seed): ``episode`` (every turn gets its episode's group advantage: the baseline),
``discounted``, ``gigpo`` and ``per_turn_index`` (the biased reference), each with training seeds
0 .. reps-1. The runs go block by block (one block per seed, its estimators in a shuffled order), one at a
time on one torch thread, so load on a shared box falls on every estimator alike. Each run records the mean
env reward and the fraction of episodes that reached the goal at every step.

Writes ``credit_curves.png`` (per estimator the mean curve over seeds, a band of +-1 std over seeds, both
smoothed over ``--smooth`` steps), ``credit.json`` (every run's curves and the settings) and ``credit.md``
(the table): final reward = the mean of the last ``--last`` steps of a run, then mean +- std (and min-max)
over seeds; "all steps" is the mean over every step, and the first step whose 5-step mean goal rate reaches
50% is given per seed (both: how early it learned). A second table, ``credit_quality``, needs no training: how
well each estimator's per-turn advantages track the exact ones (dynamic programming) under a random policy.
Nothing is asserted: the tables say what the run says. ``--reps N``: training seeds 0 .. N-1 (default 3).

    python benchmarks/bench_credit.py               # 4 estimators x 3 seeds x 80 steps, ~15-20 min on 2 cores
    python benchmarks/bench_credit.py --quick       # smoke test: 2 steps per estimator, one seed
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

sys.path.insert(0, str(C.REPO_ROOT / "experiment" / "examples"))  # text_maze.py
sys.path.insert(0, str(C.REPO_ROOT / "experiment"))  # models.py, training.py

CREDITS = ("episode", "discounted", "gigpo", "per_turn_index")
COLORS = {"episode": "tab:gray", "discounted": "tab:blue", "gigpo": "tab:green", "per_turn_index": "tab:red"}


def run_one(args: Any, credit: str, seed: int) -> dict[str, Any]:
    """One training run of the maze; its per-step curves."""
    import text_maze

    layout = tuple(args.layout.split("/")) if args.layout else text_maze.LAYOUT
    return text_maze.train_maze(
        model=args.model, credit=credit, steps=args.steps, seed=seed, batch=args.batch,
        num_generations=args.generations, learning_rate=args.lr, max_new_tokens=args.tokens,
        max_turns=args.max_turns, layout=layout, progress=args.progress, quiet=True,
    )  # fmt: skip


def maze(settings: dict[str, Any]) -> Any:
    """The benchmark's maze env (for its layout facts)."""
    import text_maze

    layout = tuple(settings["layout"].split("/")) if settings.get("layout") else text_maze.LAYOUT
    return text_maze.MazeEnv(layout, settings["max_turns"], settings.get("progress", 0.0))


def best_reward(settings: dict[str, Any]) -> float:
    """The best episode reward of the benchmark's maze."""
    return float(maze(settings).best_reward())


def credit_quality(
    settings: dict[str, Any], credits: list[str], groups: int = 400, seed: int = 0
) -> list[dict[str, Any]]:
    """How well each estimator's per-turn advantages track the exact ones, on the maze, under a fixed random policy.

    The policy: each of N, E, S, W with probability 0.2, an invalid reply 0.2, whatever the cell. Its exact
    advantage of a turn, ``Q(cell, turns left, move) - V(cell, turns left)``, comes from dynamic programming over
    (cell, turns left); ``groups`` groups of ``generations`` simulated episodes then go through each estimator
    (``trl_env.credit``, the trainer's defaults, anchors = cells as the env names them). Per estimator: the
    correlation of its advantages with the exact ones over all turns, and how often their signs agree (turns with
    a nonzero exact advantage). No model and no training: seconds, and the same numbers every run.
    """
    import functools

    import text_maze

    from trl_env.credit import EpisodeCredit, get_estimator

    policy = {"N": 0.2, "E": 0.2, "S": 0.2, "W": 0.2, "?": 0.2}
    template = maze(settings)

    def after(cell: tuple[int, int], turns: int, move: str) -> tuple[float, tuple[int, int], bool]:
        env = text_maze.MazeEnv(template.layout, template.max_turns, template.progress)
        env.cell, env.turns = cell, turns
        env.step(move)
        return env.reward, env.cell, env.alive

    @functools.cache
    def value(cell: tuple[int, int], turns: int) -> float:
        return sum(p * q_value(cell, turns, m) for m, p in policy.items())

    @functools.cache
    def q_value(cell: tuple[int, int], turns: int, move: str) -> float:
        reward, nxt, alive = after(cell, turns, move)
        return reward + (value(nxt, turns + 1) if alive else 0.0)

    rng = random.Random(seed)
    moves, weights = list(policy), list(policy.values())
    estimators = {c: get_estimator(c) for c in credits}
    got: dict[str, list[float]] = {c: [] for c in credits}
    exact: list[float] = []
    wins = episodes = 0
    for _ in range(groups):
        group = []
        for _ in range(settings["generations"]):
            env = text_maze.MazeEnv(template.layout, template.max_turns, template.progress)
            env.reset("quality")
            rewards, anchors = [], []
            while env.alive:
                move = rng.choices(moves, weights)[0]
                exact.append(q_value(env.cell, env.turns, move) - value(env.cell, env.turns))
                anchors.append(env.name(env.cell))
                before = env.reward
                env.step(move)
                rewards.append(env.reward - before)
            wins, episodes = wins + (env.cell == env.goal), episodes + 1
            group.append(EpisodeCredit(turn_rewards=rewards, anchors=anchors))
        for credit, estimator in estimators.items():
            got[credit] += [x for advantages in estimator(group) for x in advantages]
    nonzero = [i for i, x in enumerate(exact) if abs(x) > 1e-12]
    return [dict(
        credit=c, correlation=statistics.correlation(got[c], exact),
        sign_agreement=sum((got[c][i] > 0) == (exact[i] > 0) for i in nonzero) / len(nonzero),
        turns=len(exact), groups=groups, goal_rate=wins / episodes,
    ) for c in credits]  # fmt: skip


REACH, SMOOTH_REACH = 0.5, 5
"""The learning-speed column: the first step whose goal rate, averaged over the last 5 steps, reaches 50%."""


def reached(success: list[float], level: float, window: int) -> int | None:
    """The first step (1-based) whose trailing ``window``-step mean of ``success`` is at least ``level``."""
    return next((i + 1 for i, x in enumerate(smooth(success, window)) if x >= level), None)


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


def summarise(runs: list[dict[str, Any]], credits: list[str], last: int) -> list[dict[str, Any]]:
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
        reach = [reached(r["success"], REACH, SMOOTH_REACH) for r in mine]
        rows.append(dict(
            credit=credit, seeds=[r["seed"] for r in mine], final=final, final_mean_std=mean_std(final),
            success=success, success_mean_std=mean_std(success), overall=overall, overall_mean_std=mean_std(overall),
            first=first, first_mean_std=mean_std(first), reach=reach, wall_s=[r["wall_s"] for r in mine],
        ))  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]], last: int, steps: int) -> str:
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
              "final, min to max over seeds", "final vs episode", f"goal reached, last {last} steps",
              "reward, all steps", f"step the goal rate reaches {REACH:.0%}, per seed", "wall s / run"]  # fmt: skip
    return C.markdown_table(header, body)


def plot(runs: list[dict[str, Any]], credits: list[str], window: int, path: Path, title: str) -> None:
    """Mean curve per estimator with a +-1 std band over seeds: reward (left) and goal reached (right)."""
    plt = C.plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "rewards", "mean env reward per step"), (axes[1], "success", "goal reached")):
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


def report(data: dict[str, Any], out: Path) -> str:
    """Table, PNG and markdown from a run's data (also used by ``--replot``)."""
    s = data["settings"]
    credits = [c for c in s["credits"] if any(r["credit"] == c for r in data["runs"])]
    rows = summarise(data["runs"], credits, s["last"])
    text = table(rows, s["last"], s["steps"])
    title = (f"text maze, {s['model']} model: {s['steps']} steps x {s['batch']} episodes "
             f"({s['generations']} per group), lr {s['lr']}"
             + (f", progress reward {s['progress']}" if s.get("progress") else ", sparse reward")
             + ", band = ±1 std over seeds")  # fmt: skip
    plot(data["runs"], credits, s["smooth"], out / "credit_curves.png", title)
    if "quality" not in data:  # older saves: computed here (deterministic, seconds)
        data["quality"] = credit_quality(s, credits, groups=s.get("quality_groups", 400))
    quality = C.markdown_table(
        ["credit", "correlation with the exact advantage", "sign agrees"],
        [[f"`{q['credit']}`", f"{q['correlation']:.3f}", f"{q['sign_agreement']:.1%}"] for q in data["quality"]],
    )
    q0 = data["quality"][0]
    lines = [
        "# Turn-level credit on the text maze (`benchmarks/bench_credit.py`)",
        "",
        f"{data['machine']}. Total wall time {data['total_s'] / 60:.1f} min for {len(data['runs'])} runs.",
        "",
        f"Settings: {json.dumps(s)}",
        "",
        text,
        "",
        "Final reward: per run, the mean env reward of its last steps; then mean ± std (ddof=1) over seeds. "
        f"The best possible episode reward is {best_reward(s):.2f} (the goal by the shortest path).",
        "",
        f"Credit quality without training ({q0['groups']} groups of {s['generations']} episodes, {q0['turns']} turns, "
        f"a random policy: each move 0.2, an invalid reply 0.2; goal reached in {q0['goal_rate']:.1%} of episodes): "
        "each estimator's per-turn advantages against the exact ones, Q(cell, turns left, move) - V(cell, turns "
        "left) by dynamic programming (`credit_quality`).",
        "",
        quality,
    ]
    (out / "credit.md").write_text("\n".join(lines) + "\n")
    return text + "\n\n" + quality


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.set_defaults(reps=None)
    parser.add_argument("--credits", default=",".join(CREDITS), help="comma-separated credit= names")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 80; --quick 2)")
    parser.add_argument("--model", default="tiny", help="'tiny' (default), 'smollm2' or a model folder")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16, help="episodes per step")
    parser.add_argument("--generations", type=int, default=8, help="episodes per GRPO group")
    parser.add_argument("--tokens", type=int, default=3, help="max new tokens per turn")
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--layout", default=None, help="maze rows joined by '/', e.g. '.S.#/.#.G/.###'")
    parser.add_argument("--progress", type=float, default=0.0, help="reward per move closer to the goal (default 0)")
    parser.add_argument("--last", type=int, default=None, help="final reward = mean of the last K steps (default 10)")
    parser.add_argument("--smooth", type=int, default=5, help="moving-average window of the plot")
    parser.add_argument("--replot", default=None, metavar="JSON", help="redraw the table and plot from a saved run")
    args = parser.parse_args(argv)
    out = C.out_dir(args)
    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        print(report(data, out))
        C.save_json(out / "credit.json", data)  # with the credit-quality table, where it was missing
        return 0
    reps = args.reps or (1 if args.quick else 3)
    args.steps = args.steps or (2 if args.quick else 80)
    args.last = args.last or (1 if args.quick else 10)
    if args.quick:
        args.batch, args.generations = 8, 4
    credits = [c.strip() for c in args.credits.split(",") if c.strip()]
    settings = dict(
        credits=credits, seeds=list(range(reps)), steps=args.steps, model=args.model, lr=args.lr, batch=args.batch,
        generations=args.generations, tokens=args.tokens, max_turns=args.max_turns, layout=args.layout,
        progress=args.progress, last=args.last, smooth=args.smooth, order_seed=args.seed,
        quality_groups=50 if args.quick else 400,
    )  # fmt: skip
    data: dict[str, Any] = dict(settings=settings, machine=C.machine_notes(), runs=[], total_s=0.0)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    for seed in range(reps):
        order = list(credits)
        rng.shuffle(order)
        for credit in order:
            t0 = time.perf_counter()
            result = run_one(args, credit, seed)
            data["runs"].append(result)
            data["total_s"] = time.perf_counter() - started
            final = statistics.fmean(result["rewards"][-args.last :]) if result["rewards"] else math.nan
            print(f"[credit] seed {seed} {credit:>14}: final reward {final:+.3f} "
                  f"({time.perf_counter() - t0:.0f} s, {data['total_s'] / 60:.1f} min so far)", file=sys.stderr)  # fmt: skip
            C.save_json(out / "credit.json", data)  # after every run: a cut run keeps what it has
    text = report(data, out)
    C.save_json(out / "credit.json", data)
    print(text)
    print(f"\n{len(data['runs'])} runs in {data['total_s'] / 60:.1f} min; wrote {out / 'credit_curves.png'}, "
          f"{out / 'credit.json'}, {out / 'credit.md'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
