"""Issue 33's learning run: experiment/examples/agent_tools.py on SmolLM2-135M-Instruct, reward before and after.

Everything on the CPU, in process (transformers generation), as the example runs. Three phases (``--phases``):

1. ``before``: SmolLM2 with TRL's Qwen 2.5 template (the example's) is saved to ``--workdir``/base, and
   ``trl-env eval --env experiment/examples/agent_tools.py:env --history deployed`` plays ``--episodes`` held-out
   episodes (seeds ``eval-{i}``; training draws ``mul-{i}``) at the training temperature (``--temperature``).
2. ``train``: ``python experiment/examples/agent_tools.py --steps S --lr LR --save WORKDIR/trained``: GRPO through
   the gateway, every step's mean reward logged (``train/rewards_seed0.json``).
3. ``after``: the same ``trl-env eval`` command on the trained model.

Each phase holds ``/tmp/trl_env_heavy.lock`` only while it runs and records its wall and the load average before and
after. Weights go to ``--workdir`` (never into git); ``--out`` gets each eval's ``summary.md``, the training log and,
rebuilt after every phase, ``summary.md`` and ``results.json`` (success rates with 95% Wilson intervals, a paired
bootstrap interval of the change over the same seeds, the per-step training rewards, the commands).

Run:   python benchmarks/agent_tools_smollm2.py --out benchmarks/results/agent_tools_smollm2
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOCK = "/tmp/trl_env_heavy.lock"
EXAMPLE = "experiment/examples/agent_tools.py"


def log(msg: str) -> None:
    print(f"[agent_tools_smollm2 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def heavy(what: str, record: dict[str, Any]) -> Iterator[None]:
    """Hold the shared heavy-job lock around one phase; record its wall and the load averages around it."""
    with open(LOCK, "a") as f:
        t0 = time.monotonic()
        if os.environ.get("AGENT_TOOLS_LOCK_HELD") != "1":  # else the caller holds it (flock ... this script)
            fcntl.flock(f, fcntl.LOCK_EX)
        log(f"{what}: lock held after {time.monotonic() - t0:.0f} s wait, load {load()}")
        record.update(load_before=load(), started=time.strftime("%H:%M:%S UTC", time.gmtime()))
        t1 = time.monotonic()
        try:
            yield
        finally:
            record.update(wall_s=round(time.monotonic() - t1, 1), load_after=load())
            fcntl.flock(f, fcntl.LOCK_UN)
            log(f"{what}: done in {record['wall_s']} s, load {record['load_after']}")


def run(cmd: list[str], log_path: Path) -> None:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "2"}
    with open(log_path, "w") as f:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)


def save_base(workdir: Path) -> Path:
    """SmolLM2 with the example's tool template, as a folder ``trl-env eval --model`` loads."""
    sys.path.insert(0, str(REPO / "experiment"))
    from models import load_model_and_tokenizer  # experiment/models.py
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_env.testing.templates import trl_templates

    base = workdir / "base"
    if not (base / "config.json").exists():
        model, tokenizer = load_model_and_tokenizer("smollm2", AutoModelForCausalLM, AutoTokenizer)
        tokenizer.chat_template = trl_templates()["qwen2_5"]  # as agent_tools.train_agent sets it
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
    return base


def eval_command(model: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return ["trl-env", "eval", "--env", f"{EXAMPLE}:env", "--history", "deployed", "--processor", "auto",
            "--model", str(model), "--n", str(args.episodes), "--seed-format", "eval-{i}", "--max-turns", "4",
            "--max-new-tokens", "40", "--temperature", str(args.temperature), "--out", str(out)]  # fmt: skip


def train_budget(args: argparse.Namespace) -> float:
    """``--budget-s``, cut to end training by ``--train-until`` (HH:MM UTC, today) when that comes first."""
    if not args.train_until:
        return float(args.budget_s)
    hour, minute = map(int, args.train_until.split(":"))
    now = time.gmtime()
    left = (hour * 60 + minute) * 60 - (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)
    return float(min(args.budget_s, left))


def train_command(args: argparse.Namespace, budget_s: float) -> list[str]:
    return [sys.executable, EXAMPLE, "--steps", str(args.steps), "--lr", str(args.lr), "--batch", str(args.batch),
            "--generations", str(args.generations), "--temperature", str(args.temperature),
            "--budget-s", str(round(budget_s)), "--out", str(args.workdir / "train"),
            "--save", str(args.workdir / "trained")]  # fmt: skip


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of ``k`` successes in ``n``."""
    p = k / n
    center, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (center - half) / (1 + z * z / n), (center + half) / (1 + z * z / n)


def rewards_of(eval_dir: Path) -> dict[str, float]:
    lines = [json.loads(line) for line in (eval_dir / "transcripts.jsonl").read_text().splitlines()]
    return {line["seed"]: float(line["reward"]) for line in lines}


def paired_bootstrap(before: dict[str, float], after: dict[str, float], reps: int = 10000) -> tuple[float, float]:
    """95% interval of mean(after - before) over the shared seeds, resampling seeds."""
    diffs = [after[s] - before[s] for s in before if s in after]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(reps))
    return means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def write_summary(out: Path, state: dict[str, Any]) -> None:
    lines = ["# agent_tools on SmolLM2-135M-Instruct: reward before and after GRPO (CPU)", ""]
    evals = {}
    for phase in ("before", "after"):
        transcripts = out / phase / "transcripts.jsonl"  # may be left out of git (size): then results.json's
        if transcripts.exists() or state[phase].get("per_seed"):
            r = rewards_of(out / phase) if transcripts.exists() else state[phase]["per_seed"]
            k, n = int(sum(r.values())), len(r)
            lo, hi = wilson(k, n)
            evals[phase] = r
            state[phase].update(successes=k, episodes=n, rate=round(k / n, 4), wilson95=[round(lo, 3), round(hi, 3)],
                                per_seed=r)  # fmt: skip
            lines.append(f"- {phase}: {k}/{n} = {k / n:.3f} (95% Wilson {lo:.3f}-{hi:.3f}); "
                         f"wall {state[phase].get('wall_s')} s, load {state[phase].get('load_before')} -> "
                         f"{state[phase].get('load_after')}")  # fmt: skip
    if len(evals) == 2:
        lo, hi = paired_bootstrap(evals["before"], evals["after"])
        state["change"] = {"rate": round(state["after"]["rate"] - state["before"]["rate"], 4),
                           "paired_bootstrap95": [round(lo, 3), round(hi, 3)]}  # fmt: skip
        lines.append(f"- change: {state['change']['rate']:+.3f} (paired bootstrap over the same seeds, 95%: "
                     f"{lo:+.3f} to {hi:+.3f})")  # fmt: skip
    rewards_file = out / "train" / "rewards_seed0.json"
    if rewards_file.exists():
        rewards = json.loads(rewards_file.read_text())["rewards"]
        q = max(1, len(rewards) // 4)
        state["train"].update(rewards=rewards, first_quarter=statistics.fmean(rewards[:q]),
                              last_quarter=statistics.fmean(rewards[-q:]))  # fmt: skip
        lines.append(f"- training, {len(rewards)} steps of {state['args']['batch']} episodes: per-step mean reward "
                     f"{[round(x, 3) for x in rewards]}; first quarter {state['train']['first_quarter']:.3f}, last "
                     f"quarter {state['train']['last_quarter']:.3f}; wall {state['train'].get('wall_s')} s, load "
                     f"{state['train'].get('load_before')} -> {state['train'].get('load_after')}")  # fmt: skip
    lines += ["", "Commands (the driver runs them, each under `flock /tmp/trl_env_heavy.lock`):", "", "```sh"]
    lines += [state[p]["command"] for p in ("before", "train", "after") if state[p].get("command")] + ["```", ""]
    (out / "summary.md").write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps(state, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="before,train,after")
    parser.add_argument("--episodes", type=int, default=64, help="held-out eval episodes (seeds eval-0 ...)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=900, help="training stops after the step past this")
    parser.add_argument("--train-until", default=None, help="HH:MM UTC: training stops after the step past it")
    parser.add_argument("--temperature", type=float, default=1.0, help="of training and both evals alike")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/agent_tools_smollm2"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "agent_tools_smollm2")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    state = json.loads(results.read_text()) if results.exists() else {}
    state["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    for phase in ("before", "train", "after"):
        state.setdefault(phase, {})
    for phase in filter(None, args.phases.split(",")):  # --phases "": rebuild summary.md and results.json only
        record: dict[str, Any] = {}
        if phase == "train":
            with heavy(phase, record):
                cmd = train_command(args, train_budget(args))
                run(cmd, args.out / "train.log")
            (args.out / "train").mkdir(exist_ok=True)
            reward_log = args.workdir / "train" / "rewards_seed0.json"
            (args.out / "train" / "rewards_seed0.json").write_text(reward_log.read_text())
        else:
            model = save_base(args.workdir) if phase == "before" else args.workdir / "trained"
            cmd = eval_command(model, args.out / phase, args)
            with heavy(phase, record):
                run(cmd, args.out / f"{phase}.log")
        state[phase] = {"command": shlex.join(cmd), **record}
        write_summary(args.out, state)
        log(f"{phase} done; {args.out / 'summary.md'}")
    write_summary(args.out, state)
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
