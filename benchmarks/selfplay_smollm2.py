"""Issue 34's acceptance run: win rate of SmolLM2 against ``random_move``, before and after self-play training.

Everything on the CPU, every turn sampled by the REAL vLLM CPU server of ``.venv-vllm``. Three phases (``--phases``):

1. ``before``: a server serves the model; ``trl-env eval --base-url`` plays ``--games`` games per seat against
   ``trl_env.adapters.textarena_seats:random_move`` (seat 0: ``policy,random_move``; seat 1:
   ``random_move,policy``), both seats at once, the same eval seeds ``eval-{i}`` every time.
2. ``train``, per seed: self-play training of a LoRA adapter (``EpisodeGRPOTrainer``, both seats played by the policy,
   ``credit="per_role"``, the game and prompt of ``experiment/examples/selfplay_tictactoe.py``), each step's turns
   sampled by the same server with that step's adapter (``lora_sync``: the CPU policy sync of docs/vllm-cpu.md).
   Rewards are TextArena's (win 1, draw 0, loss -1; a second invalid move loses), nothing else.
3. ``after``, per seed: the adapter merged into the model (the last synced adapter if training was cut), a fresh
   server serves it, and the same two ``trl-env eval`` commands play again.

Each heavy piece (one eval of both seats, one training run) holds ``/tmp/trl_env_heavy.lock`` only while it runs
(``SELFPLAY_NO_LOCK=1`` when the caller holds it). Model weights go to ``--workdir``, never into git. ``--out`` gets
each eval's ``summary.md`` and transcripts, each seed's per-step metrics (``train_seed{N}.json``) and, rebuilt from
those files after every phase, ``summary.md`` and ``results.json``.

Run:   python benchmarks/selfplay_smollm2.py --seeds 0,1 --steps 8 --games 200 \\
           --out benchmarks/results/selfplay_smollm2/run
Measured (docs/selfplay.md): --phases train,after --seeds 0,1 --steps 20 --train-budget-s 420 --batch 8 --lr 1e-3
           --games 100 (the before phase: --phases before --games 200)
Quick: python benchmarks/selfplay_smollm2.py --quick --out /tmp/sp_quick   # tiny model, 1 step, 4 games a seat
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "experiment" / "examples"))

LOCK = "/tmp/trl_env_heavy.lock"
RANDOM_MOVE = "trl_env.adapters.textarena_seats:random_move"
SEATS = {0: f"policy,{RANDOM_MOVE}", 1: f"{RANDOM_MOVE},policy"}
RATES = ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")
#: The server: one unpinned OpenMP pool (pinned threads spin when another job holds a core) of ``--server-threads``
#: threads, a KV cache for 400 concurrent games of SmolLM2 (30 layers x 3 KV heads x 64 x fp32: 46 KB a token).
SERVER_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "4"}
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def log(msg: str) -> None:
    print(f"[selfplay_smollm2 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def heavy(what: str) -> Iterator[None]:
    """Hold the shared heavy-job lock (``flock /tmp/trl_env_heavy.lock``) around one bounded piece."""
    if os.environ.get("SELFPLAY_NO_LOCK") == "1":  # the caller holds it
        log(f"{what}: load average {load()}")
        yield
        log(f"{what}: done, load average {load()}")
        return
    with open(LOCK, "a") as f:
        t0 = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        log(f"{what}: lock held after {time.monotonic() - t0:.0f} s wait, load average {load()}")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            log(f"{what}: lock released, load average {load()}")


def load() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (2 cores: above 2 means something else ran beside)."""
    return [round(x, 2) for x in os.getloadavg()]


@contextlib.contextmanager
def server(model_dir: str, *, lora_rank: int | None, log_path: Path, threads: int) -> Iterator[str]:
    t0 = time.monotonic()
    env = {**SERVER_ENV, "OMP_NUM_THREADS": str(threads)}
    with C._vllm.start_vllm_server(
        model_dir, lora=lora_rank is not None, max_lora_rank=lora_rank or 8, env=env, timeout=900,
        log_path=log_path,
    ) as (url, _pid):  # fmt: skip
        log(f"server for {model_dir} healthy after {time.monotonic() - t0:.0f} s at {url}")
        yield url


# ------------------------------------------------------------------------------------------------ eval


def eval_command(url: str, args: argparse.Namespace, game: Any, out: Path, seat: int) -> list[str]:
    """The ``trl-env eval`` command: the served model in ``seat`` against ``random_move``, ``args.games`` games."""
    return [
        str(Path(sys.executable).parent / "trl-env"), "eval",
        "--env", "trl_env.adapters.textarena_seats:TextArenaGame", "--env-kwargs", json.dumps({"game": game.GAME}),
        "--seats", SEATS[seat], "--base-url", url, "--n", str(args.games), "--seed-format", "eval-{i}",
        "--system-prompt", game.SYSTEM_PROMPT, "--max-turns", str(game.MAX_TURNS), "--max-new-tokens", "8",
        "--parse-truncated-turns", "--out", str(out),
    ]  # fmt: skip


def evaluate(url: str, args: argparse.Namespace, game: Any, out: Path, name: str) -> None:
    """Both seats' evals at once (one server batches both); ``{name}_seat{s}/``. The caller holds the lock."""
    cmds = {seat: eval_command(url, args, game, out / f"{name}_seat{seat}", seat) for seat in (0, 1)}
    t0, load_start = time.monotonic(), load()
    procs = {seat: subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for seat, cmd in cmds.items()}
    for seat, proc in procs.items():
        if proc.wait() != 0:
            raise RuntimeError(f"eval {name} seat {seat} exited with {proc.returncode}: {cmds[seat]}")
        meta = {"command": cmds[seat], "wall_s": time.monotonic() - t0, "load_start": load_start, "load_end": load()}
        (out / f"{name}_seat{seat}" / "command.json").write_text(json.dumps(meta, indent=1))
        log(f"{name} seat {seat}: {seat_row(out / f'{name}_seat{seat}' / 'summary.md', seat)}")


def seat_row(summary_md: Path, seat: int) -> dict[str, float]:
    """The policy seat's row of ``trl-env eval``'s per-seat table."""
    lines = [ln for ln in summary_md.read_text().splitlines() if ln.startswith("| ")]
    header = next(ln for ln in lines if ln.startswith("| seat |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if cells[0] == str(seat) and len(cells) == len(names):
            return {n: float(v) for n, v in zip(names, cells, strict=True) if re.fullmatch(r"-?[\d.]+", v)}
    raise RuntimeError(f"no row for seat {seat} in {summary_md}")


# ----------------------------------------------------------------------------------------------- train


def train(url: str, args: argparse.Namespace, game: Any, seed: int, out: Path, workdir: Path) -> None:
    """Self-play training of a LoRA adapter for ``args.steps`` steps; per-step metrics and the merged model."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig

    from trl_env import ChatMLProcessor, env_reward, make_rollout_func
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    torch.set_num_threads(args.train_threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    rollout_func = make_rollout_func(
        game.SELF_PLAY,
        ChatMLProcessor(system_prompt=game.SYSTEM_PROMPT),
        credit="per_role",
        max_turns=game.MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,
        base_url=url,
        lora_sync=workdir / f"adapters_seed{seed}",
        transcripts=str(out / f"train_transcripts_seed{seed}.jsonl"),
    )
    config = GRPOConfig(
        output_dir=str(workdir / f"trainer_seed{seed}"), max_steps=args.steps,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=args.batch // args.micro_batch,
        num_generations=4, max_completion_length=1024,
        gradient_checkpointing=args.gradient_checkpointing,
        learning_rate=args.lr, temperature=1.0, beta=0.0, logging_steps=1, report_to=[], save_strategy="no",
        seed=seed, data_seed=seed, use_cpu=True, bf16=False,
    )  # fmt: skip
    started = time.monotonic()
    step_log = out / f"train_seed{seed}.json"

    class StepLog(TrainerCallback):
        """Each logged step to stderr and to ``train_seed{N}.json`` as it comes (a cut run keeps its steps); no step
        starts after ``--train-budget-s`` seconds of training or once ``--stop-file`` exists (the steps done are the
        run)."""

        def on_step_end(self, _args: Any, _state: Any, control: Any, **_: Any) -> None:
            over = args.train_budget_s and time.monotonic() - started > args.train_budget_s
            if over or (args.stop_file and Path(args.stop_file).exists()):
                control.should_training_stop = True

        def on_log(self, _args: Any, state: Any, _control: Any, logs: dict | None = None, **_: Any) -> None:
            if not logs or "env/seat0/win_rate" not in logs:
                return
            wall = time.monotonic() - started
            state.log_history[-1].update(wall_s=wall, load=load())  # Trainer.log appended a copy of logs
            steps = [h for h in state.log_history if "env/seat0/win_rate" in h]
            meta = {
                "seed": seed,
                "steps": len(steps),
                "wall_s": wall,
                "load": load(),  # at this step's log; every step's is in its per_step entry
                "args": {k: str(v) for k, v in vars(args).items()},
            }
            step_log.write_text(json.dumps({**meta, "per_step": steps}, indent=1))
            rates = ", ".join(f"seat {k} win {logs[f'env/seat{k}/win_rate']:.2f} invalid "
                              f"{logs[f'env/seat{k}/invalid_move_rate']:.2f}" for k in (0, 1))  # fmt: skip
            log(f"seed {seed} step {state.global_step} at {wall:.0f} s: {rates}")

    trainer = EpisodeGRPOTrainer(
        model=model, reward_funcs=env_reward, args=config, processing_class=tokenizer, rollout_func=rollout_func,
        train_dataset=Dataset.from_dict({"prompt": [f"game-{i}" for i in range(10000)]}), callbacks=[StepLog()],
        peft_config=LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                               target_modules=TARGET_MODULES),
    )  # fmt: skip
    started = time.monotonic()
    trainer.train()
    save_merged(trainer.model, tokenizer, workdir / f"merged_seed{seed}")
    log(
        f"seed {seed}: {trainer.state.global_step} steps (of --steps {args.steps}) in {time.monotonic() - started:.0f} s"
    )


def save_merged(peft_model: Any, tokenizer: Any, merged_dir: Path) -> None:
    """The adapter merged into the base weights, saved as a plain model folder a fresh vLLM server loads."""
    shutil.rmtree(merged_dir, ignore_errors=True)
    peft_model.merge_and_unload().save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)


def merged_model(args: argparse.Namespace, seed: int, workdir: Path) -> Path:
    """The merged model of ``seed``; from its last synced adapter (``trl-env-{run}-step-N``) when training was cut."""
    merged_dir = workdir / f"merged_seed{seed}"
    if (merged_dir / "config.json").is_file():
        return merged_dir
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapters = sorted(
        (workdir / f"adapters_seed{seed}").glob("trl-env-*-step-*"), key=lambda p: int(p.name.rsplit("-", 1)[1])
    )
    if not adapters:
        raise SystemExit(f"seed {seed}: neither {merged_dir} nor an adapter under {workdir}; run the train phase.")
    log(f"seed {seed}: no merged model (training cut); merging its last synced adapter {adapters[-1].name}")
    base = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    save_merged(PeftModel.from_pretrained(base, adapters[-1]), tokenizer, merged_dir)
    return merged_dir


# --------------------------------------------------------------------------------------------- summary


def wilson(rate: float, n: float, z: float = 1.96) -> str:
    """The 95% Wilson score interval of a rate measured over ``n`` games, as ``lo-hi``."""
    if n <= 0:
        return "-"
    center, half = rate + z * z / (2 * n), z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return f"{(center - half) / (1 + z * z / n):.3f}-{(center + half) / (1 + z * z / n):.3f}"


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f} (one seed)" if values else "-"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def write_summary(out: Path, argv: list[str]) -> dict[str, Any]:
    """``results.json`` and ``summary.md`` from the files in ``out``: every eval's rates, the change per seat."""
    evals = []
    for summary in sorted(out.glob("*_seat[01]/summary.md")):
        name, seat = summary.parent.name.rsplit("_seat", 1)
        meta_path = summary.parent / "command.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        seed = int(name.removeprefix("after_seed")) if name.startswith("after_seed") else None
        phase = "before" if name == "before" else "after"
        evals.append({**seat_row(summary, int(seat)), **meta, "phase": phase, "seed": seed, "seat": int(seat)})
    evals.sort(key=lambda e: (e["phase"] != "before", e["seed"] or 0, e["seat"]))
    trains = [json.loads(p.read_text()) for p in sorted(out.glob("train_seed*.json"))]
    lines = [
        "# Self-play on SmolLM2: win rate against random_move before and after", "",
        f"Written by `python benchmarks/selfplay_smollm2.py {' '.join(argv)}`.", "",
        "| phase | seed | seat | games | win | win, 95% Wilson | draw | loss | invalid move | invalid, 95% Wilson "
        "| eval wall (both seats at once) | load average (start, end) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for e in evals:
        n, (win, draw, loss, invalid) = e.get("scored", 0), (e.get(r, float("nan")) for r in RATES)
        seed = "-" if e["seed"] is None else e["seed"]
        loads = f"{e['load_start'][0]:.1f}, {e['load_end'][0]:.1f}" if "load_start" in e else "-"
        lines.append(f"| {e['phase']} | {seed} | {e['seat']} | {n:.0f} | {win:.3f} | {wilson(win, n)} | {draw:.3f} | "
                     f"{loss:.3f} | {invalid:.3f} | {wilson(invalid, n)} | {e.get('wall_s', float('nan')):.0f} s | "
                     f"{loads} |")  # fmt: skip
    lines += ["", "| seat | rate | before | after (mean ± sd over seeds) | after - before, per seed |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for seat in (0, 1):
        before = [e for e in evals if e["phase"] == "before" and e["seat"] == seat]
        after = [e for e in evals if e["phase"] == "after" and e["seat"] == seat]
        for rate in RATES:
            b = before[0][rate] if before else float("nan")
            changes = ", ".join(f"seed {e['seed']}: {e[rate] - b:+.3f}" for e in after)
            lines.append(f"| {seat} | {rate} | {b:.3f} | {spread([e[rate] for e in after])} | {changes} |")
    lines += ["", "| seed | steps | train wall | s per step |", "| --- | --- | --- | --- |"]
    lines += [f"| {t['seed']} | {t['steps']} | {t['wall_s']:.0f} s | {t['wall_s'] / max(1, t['steps']):.0f} |"
              for t in trains]  # fmt: skip
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    results = {"argv": argv, "evals": evals, "train": [{k: v for k, v in t.items() if k != "per_step"} for t in trains]}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="'smollm2', 'tiny' or a model folder")
    parser.add_argument("--seeds", default="0,1", help="training seeds, comma-separated")
    parser.add_argument("--steps", type=int, default=8, help="training steps per seed")
    parser.add_argument("--batch", type=int, default=8, help="rows per step (num_generations 4: batch/2 games)")
    parser.add_argument("--lr", type=float, default=5e-4, help="LoRA learning rate")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--train-budget-s", type=float, default=0, help="no training step starts after this (0: none)")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=2,
        help="rows per forward/backward (--batch rows a step, accumulated; memory grows with it)",
    )
    parser.add_argument("--stop-file", default=None, help="no training step starts once this file exists")
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="recompute activations in backward (less memory, about a third more compute)",
    )
    parser.add_argument("--train-threads", type=int, default=2, help="torch threads of the trainer")
    parser.add_argument(
        "--server-threads",
        type=int,
        default=1,
        help="OpenMP threads of the vLLM server (2 stall at every barrier when a core is busy)",
    )
    parser.add_argument("--games", type=int, default=200, help="eval games per seat")
    parser.add_argument("--phases", default="before,train,after", help="any of before,train,after")
    parser.add_argument("--out", default=str(C.RESULTS_DIR / "selfplay_smollm2" / "run"))
    parser.add_argument("--workdir", default="/tmp/selfplay_smollm2", help="adapters and merged models (not in git)")
    parser.add_argument("--base-url", default=None, help="a running server of --model with LoRA (rank >= --lora-rank)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 seed, 1 step, 4 games a seat")
    args = parser.parse_args(argv)
    if args.batch % args.micro_batch or args.batch % 4:
        parser.error(f"--batch {args.batch}: a multiple of 4 (a group) and of --micro-batch {args.micro_batch}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run stops its servers too (the finally's)
    if args.quick:
        args.model, args.seeds, args.steps, args.games, args.batch = "tiny", "0", 1, 4, 8
    import selfplay_tictactoe as game  # experiment/examples: the game, its prompt, the seating

    from trl_env.testing.models import resolve_model

    args.model_dir = C.tiny_model_dir() if args.model == "tiny" else str(resolve_model(args.model))
    argv = sys.argv[1:] if argv is None else argv
    out, workdir = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    phases, seeds = set(args.phases.split(",")), [int(x) for x in args.seeds.split(",")]

    def base() -> contextlib.AbstractContextManager[str]:  # the model as it was, LoRA enabled (lora_sync's target)
        if args.base_url:
            return contextlib.nullcontext(args.base_url)
        return server(
            args.model_dir, lora_rank=args.lora_rank, log_path=workdir / "server_base.log", threads=args.server_threads
        )

    if "before" in phases:
        with heavy("before"), base() as url:  # one hold of the lock per piece, its server's start included
            evaluate(url, args, game, out, "before")
        write_summary(out, argv)
    for seed in seeds if phases & {"train", "after"} else []:
        with heavy(f"seed {seed}"):  # its training and its after-eval, then the lock is free for others
            if "train" in phases:
                with base() as url:
                    train(url, args, game, seed, out, workdir)
                write_summary(out, argv)
            if "after" in phases:
                merged = str(merged_model(args, seed, workdir))  # the eval command samples the server's one model
                log_path = workdir / f"server_seed{seed}.log"
                with server(merged, lora_rank=None, log_path=log_path, threads=args.server_threads) as url:
                    evaluate(url, args, game, out, f"after_seed{seed}")
        write_summary(out, argv)
    return write_summary(out, argv)


if __name__ == "__main__":
    main()
