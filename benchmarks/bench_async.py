"""Synchronous vs asynchronous GRPO with trl-env: wall time per optimizer step and trainer idle time.

* sync:  ``GRPOTrainer`` + ``make_rollout_func`` (LoRA hot-sync to the server at each step); generation and
  training alternate, so the trainer idles while the step's episodes run.
* async: ``AsyncGRPOTrainer`` + ``TrlEnvRolloutWorker`` (the trainer's own LoRA-over-HTTP sync, ``max_staleness``
  versions of lag allowed); episodes keep running while the trainer trains.

Same env (``BenchEnv``: ``--turns`` turns, optional per-step sleep; its reward counts steps, so every group's
rewards are equal and the gradient is zero: only the time is measured), the tiny model of ``trl_env.testing``,
one real vLLM CPU server with ``--enable-lora``, the same samples per optimizer step (``--groups`` x 4) and LoRA
config. Per variant: the wall time of each optimizer step after ``--warmup`` steps (from one step's end to the
next), and the trainer's idle fraction (sync: time inside the rollout function / step; async: the trainer's own
``perf/rollout_wait_s`` / step). Repetitions are interleaved (variants in shuffled order within a repetition).

``--admission`` compares the async worker with and without its admission rule instead (no sync run): the
worker's episodes ended, how many of them were dropped as stale (before their push or evicted from the buffer:
generation thrown away), and the trainer's idle fraction, per ``--max-staleness`` value, side by side. "Without"
is the worker before the rule (every free group thread starts a group; they wait for room in the full buffer).
Both use ``from_args``'s buffer (one optimizer step of samples) and ``--inflight`` group threads (default
(max_staleness + 1) x ``--groups``, as docs/async.md recommends).

The "GPU regime" model: with generation on its own device (the vLLM server's GPU) and training on another, the
async step takes max(gen, train) instead of gen + train, so the expected speed-up is (gen + train) / max(gen,
train), with gen and train measured in the sync runs (rollout function time, and the rest of the step). On this
box the server and the trainer share 2 CPU cores, so the measured speed-up is lower: their work competes for
the same cores instead of overlapping.

    python benchmarks/bench_async.py --quick      # smoke test: 3 steps per variant, one repetition (~1.5 min)
    python benchmarks/bench_async.py              # 8 steps (2 warm-up), 3 interleaved repetitions (~10 min)
    python benchmarks/bench_async.py --admission --groups 2 --max-staleness 1 2   # generation thrown away
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

LORA: dict[str, Any] = dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
NUM_GENERATIONS = 4


def step_clock() -> Any:
    """A TrainerCallback whose ``ends`` lists when each optimizer step ended (``time.perf_counter``)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())

    return StepClock()


def quiet(trainer: Any) -> Any:
    """No progress bar and no printed log dicts (the runs' numbers are in the table)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer


def unload_adapters(base_url: str) -> None:
    """Unload every LoRA adapter the server holds (a run's last ones stay loaded; the next run reuses the names)."""
    import requests

    for card in requests.get(f"{base_url}/v1/models", timeout=10).json()["data"]:
        if card.get("parent"):
            requests.post(f"{base_url}/v1/unload_lora_adapter", json={"lora_name": card["id"]}, timeout=30)


def seeds(n: int) -> list[str]:
    return [f"game-{i}" for i in range(n)]


def run_sync(base_url: str, model_dir: str, opts: Any, workdir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_env import ChatMLProcessor, env_reward, make_rollout_func

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inner = make_rollout_func(_common.EnvFactory(opts.turns, opts.sleep), ChatMLProcessor(), max_turns=opts.turns,
                              max_new_tokens=opts.tokens, parse_truncated_turns=True, base_url=base_url,
                              lora_sync=workdir / "adapters")  # fmt: skip
    gen_s: list[float] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(prompts, trainer)
        gen_s.append(time.perf_counter() - t0)
        return out

    clock = step_clock()
    batch = opts.groups * NUM_GENERATIONS
    args = GRPOConfig(output_dir=str(workdir / "sync"), max_steps=opts.steps, per_device_train_batch_size=batch,
                      num_generations=NUM_GENERATIONS, max_completion_length=opts.turns * (opts.tokens + 16),
                      learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
                      use_vllm=False, logging_steps=1)  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=env_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": seeds(batch * opts.steps)}),
                          rollout_func=rollout_func, peft_config=LoraConfig(**LORA), callbacks=[clock])  # fmt: skip
    start = time.perf_counter()
    quiet(trainer).train()
    ends = [start, *clock.ends]
    steps = [b - a for a, b in zip(ends, ends[1:])][opts.warmup :]
    gens = gen_s[opts.warmup : opts.warmup + len(steps)]
    return dict(step_s=steps, gen_s=gens, idle=[g / s for g, s in zip(gens, steps)])


def run_async(
    base_url: str, model_dir: str, opts: Any, workdir: Path, max_staleness: int, admission: bool = True
) -> dict[str, Any]:
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trl_env import ChatMLProcessor
    from trl_env.train.async_grpo import TrlEnvRolloutWorker, patch_for_cpu

    patch_for_cpu()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    clock = step_clock()
    batch = opts.groups * NUM_GENERATIONS
    args = AsyncGRPOConfig(output_dir=str(workdir / "async"), max_steps=opts.steps, per_device_train_batch_size=batch,
                           num_generations=NUM_GENERATIONS, max_completion_length=opts.turns * (opts.tokens + 16),
                           token_budget=0, bf16=False, gradient_checkpointing=False, report_to=[], logging_steps=1,
                           save_strategy="no", max_staleness=max_staleness, learning_rate=1e-3,
                           vllm_server_base_url=base_url, temperature=1.0)  # fmt: skip
    worker = TrlEnvRolloutWorker.from_args(args, _common.EnvFactory(opts.turns, opts.sleep), ChatMLProcessor(),
                                           tokenizer, seeds(64), max_turns=opts.turns, max_new_tokens=opts.tokens,
                                           max_inflight_groups=opts.inflight or (max_staleness + 1) * opts.groups,
                                           parse_truncated_turns=True)  # fmt: skip
    if not admission:  # the worker before its admission rule: a free group thread always starts a group
        worker._buffer._admits = lambda n, max_staleness: True
    trainer = AsyncGRPOTrainer(model=model_dir, args=args, processing_class=tokenizer, rollout_worker=worker,
                               train_dataset=Dataset.from_dict({"prompt": seeds(64)}),
                               peft_config=LoraConfig(**LORA), callbacks=[clock])  # fmt: skip
    if not trainer._lora_sync:
        raise SystemExit("the server did not accept LoRA sync (needs --enable-lora and --max-loras)")
    start = time.perf_counter()
    quiet(trainer).train()
    ends = [start, *clock.ends]
    steps = [b - a for a, b in zip(ends, ends[1:])][opts.warmup :]
    logs = [h for h in trainer.state.log_history if "loss" in h][opts.warmup :]
    waits = [float(h.get("perf/rollout_wait_s", 0.0)) for h in logs][: len(steps)]
    staleness = [float(h.get("sample/staleness_mean", 0.0)) for h in logs]
    counts = worker.counts
    return dict(step_s=steps, wait_s=waits, idle=[w / s for w, s in zip(waits, steps)], staleness=staleness,
                dropped_stale=counts["dropped_stale"] + counts["evicted"],
                ended=counts["episodes"] - counts["stopped"], counts=dict(counts))  # fmt: skip


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = _common.base_parser(__doc__.split("\n")[0])
    _common.add_server_options(parser)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 8; quick: 3)")
    parser.add_argument("--warmup", type=int, default=None, help="steps not timed (default 2; quick: 1)")
    parser.add_argument("--groups", type=int, default=None, help="groups of 4 episodes per step (default 4; quick 2)")
    parser.add_argument("--turns", type=int, default=3, help="turns per episode")
    parser.add_argument("--tokens", type=int, default=16, help="sampled tokens per turn (at most)")
    parser.add_argument("--sleep", type=float, nargs=2, default=None, metavar=("MIN_MS", "MAX_MS"),
                        help="env step latency, uniform in [MIN_MS, MAX_MS] (default: none)")  # fmt: skip
    parser.add_argument("--max-staleness", type=int, nargs="+", default=[1], help="one async run per value")
    parser.add_argument("--inflight", type=int, default=None,
                        help="the worker's max_inflight_groups (default (max_staleness + 1) x --groups)")  # fmt: skip
    parser.add_argument("--admission", action="store_true",
                        help="compare the async worker with and without its admission rule (no sync run)")  # fmt: skip
    opts = parser.parse_args()
    opts.steps = opts.steps or (3 if opts.quick else 8)
    opts.warmup = opts.warmup if opts.warmup is not None else (1 if opts.quick else 2)
    opts.groups = opts.groups or (2 if opts.quick else 4)
    opts.reps = opts.reps or (1 if opts.quick else 3)
    out = _common.out_dir(opts)
    notes = _common.machine_notes()

    import vllm_server as vs  # type: ignore[import-not-found]  # tests/vllm_server.py, on the path via _common

    # (label, max_staleness, admission rule): "sync" runs once per repetition, the async variants per staleness.
    variants = [] if opts.admission else [("sync", 0, True)]
    for staleness in opts.max_staleness:
        if opts.admission:
            variants.append((f"async without admission rule, max_staleness {staleness}", staleness, False))
        variants.append((f"async, max_staleness {staleness}" if opts.admission else "async", staleness, True))
    model_dir = _common.tiny_model_dir()
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        if opts.base_url:
            servers = _common.vllm_server(opts.base_url)
        else:
            extra = ["--max-loras", str(max(opts.max_staleness) + 2), "--no-enable-prefix-caching"]
            servers = vs.start_vllm_server(
                model_dir, lora=True, extra_args=extra, env=_common.SERVER_OMP[opts.server_omp]
            )
        with servers as (base_url, server_model):
            if opts.base_url:
                model_dir = server_model
            config = _common.server_config(base_url)
            order = random.Random(opts.seed)
            for rep in range(opts.reps):
                for i, (label, staleness, admission) in enumerate(order.sample(variants, len(variants))):
                    t0 = time.perf_counter()
                    workdir = Path(tmp) / f"run{rep}-{i}"
                    if label == "sync":
                        run = run_sync(base_url, model_dir, opts, workdir)
                    else:
                        run = run_async(base_url, model_dir, opts, workdir, staleness, admission)
                    unload_adapters(base_url)
                    runs[label].append(run)
                    print(f"[rep {rep}] {label}: {len(run['step_s'])} timed steps, median "
                          f"{median(run['step_s']):.2f} s/step, idle {median(run['idle']):.0%}, dropped stale "
                          f"{run.get('dropped_stale', 0)} of {run.get('ended', '-')} "
                          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)  # fmt: skip
    if opts.admission:
        report_admission(opts, runs, variants, out, notes, config)
    else:
        report_sync_async(opts, runs, out, notes, config)


def pooled(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [v for run in runs for v in run.get(key, [])]


def report_admission(
    opts: Any, runs: dict[str, list[dict[str, Any]]], variants: list[Any], out: Path, notes: str, config: Any
) -> None:
    """The async worker with and without its admission rule: generation thrown away, trainer idle."""
    rows = []
    for label, staleness, _ in variants:
        ended = sum(run["ended"] for run in runs[label])
        stale = sum(run["dropped_stale"] for run in runs[label])
        per_run = ", ".join(f"{run['dropped_stale']}/{run['ended']}" for run in runs[label])
        rows.append([label, str(opts.inflight or (staleness + 1) * opts.groups),
                     _common.fmt_range(pooled(runs[label], "step_s")),
                     f"{sum(pooled(runs[label], 'wait_s')) / sum(pooled(runs[label], 'step_s')):.1%}",
                     f"{median(pooled(runs[label], 'staleness')):.2f}",
                     f"{stale / ended if ended else float('nan'):.1%} ({per_run})"])  # fmt: skip
    print(f"\n## The async worker's admission rule, {opts.groups * NUM_GENERATIONS} samples/step ({opts.groups} "
          f"groups x {NUM_GENERATIONS}), {opts.turns} turns x <= {opts.tokens} tokens, {opts.reps} rep(s) x "
          f"{opts.steps} steps ({opts.steps - opts.warmup} timed)\n")  # fmt: skip
    print(_common.markdown_table(["variant", "group threads", "s / optimizer step, median (min-max)",
                                  "trainer idle (waited / timed)", "staleness (mean)",
                                  "dropped stale / episodes ended (per run)"], rows))  # fmt: skip
    print(f"\n{notes}; server: {config}")
    _common.save_json(out / "bench_async_admission.json", dict(options=vars(opts), runs=runs, machine=notes,
                                                               server=config))  # fmt: skip
    print(f"\nwrote {out / 'bench_async_admission.json'}", file=sys.stderr)


def report_sync_async(opts: Any, runs: dict[str, list[dict[str, Any]]], out: Path, notes: str, config: Any) -> None:
    """Sync against async: s per step, idle, and the GPU-regime model."""
    sync_step, async_step = pooled(runs["sync"], "step_s"), pooled(runs["async"], "step_s")
    gen = median(pooled(runs["sync"], "gen_s"))
    train = median([s - g for run in runs["sync"] for s, g in zip(run["step_s"], run["gen_s"])])
    expected = (gen + train) / max(gen, train)
    measured = median(sync_step) / median(async_step)
    rows = [
        ["sync (GRPOTrainer + make_rollout_func)", _common.fmt_range(sync_step),
         f"{median(pooled(runs['sync'], 'idle')):.0%}", "0", "-"],
        ["async (AsyncGRPOTrainer + TrlEnvRolloutWorker)", _common.fmt_range(async_step),
         f"{median(pooled(runs['async'], 'idle')):.0%}", f"{median(pooled(runs['async'], 'staleness')):.2f}",
         f"{sum(run['dropped_stale'] for run in runs['async'])} of {sum(run['ended'] for run in runs['async'])}"],
    ]  # fmt: skip
    print(f"\n## Sync vs async GRPO, {opts.groups * NUM_GENERATIONS} samples/step ({opts.groups} groups x "
          f"{NUM_GENERATIONS}), {opts.turns} turns x <= {opts.tokens} tokens, max_staleness {opts.max_staleness[0]}, "
          f"{opts.reps} rep(s) x {opts.steps - opts.warmup} timed steps\n")  # fmt: skip
    print(_common.markdown_table(["variant", "s / optimizer step, median (min-max)", "trainer idle",
                                  "staleness (mean)", "dropped stale / episodes (worker)"], rows))  # fmt: skip
    print(f"\nMeasured here: sync step = gen {gen:.2f} s + train {train:.2f} s (medians); async step "
          f"{median(async_step):.2f} s: measured speed-up {measured:.2f}x. Expected with generation and training "
          f"on separate devices (the GPU regime): (gen + train) / max(gen, train) = {expected:.2f}x.\n")  # fmt: skip
    ratios = [0.25, 0.5, 1.0, 2.0, 4.0, gen / train if train > 0 else float("nan")]
    print(_common.markdown_table(
        ["gen / train", "expected async speed-up (gen + train) / max(gen, train)"],
        [[f"{r:.2f}" + (" (this run)" if i == len(ratios) - 1 else ""), f"{(r + 1) / max(r, 1):.2f}x"]
         for i, r in enumerate(ratios)],
    ))  # fmt: skip
    print(f"\n{notes}; server: {config}")

    plt = _common.plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    names = ["sync", "async"]
    axes[0].bar(names, [median(sync_step), median(async_step)], color=["#888", "#3a7"])
    axes[0].set_ylabel("s per optimizer step (median)")
    axes[1].bar(names, [median(pooled(runs["sync"], "idle")), median(pooled(runs["async"], "idle"))],
                color=["#888", "#3a7"])  # fmt: skip
    axes[1].set_ylabel("trainer idle fraction")
    fig.suptitle(f"trl-env sync vs async GRPO (tiny model, CPU): expected GPU speed-up {expected:.2f}x")
    fig.tight_layout()
    fig.savefig(out / "bench_async.png", dpi=120)
    _common.save_json(out / "bench_async.json", dict(options=vars(opts), runs=runs, gen_s=gen, train_s=train,
                                                     expected_speedup=expected, measured_speedup=measured,
                                                     machine=notes, server=config))  # fmt: skip
    print(f"\nwrote {out / 'bench_async.png'} and {out / 'bench_async.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
