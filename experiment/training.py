"""What every example's training script shares: its command line, GRPO settings, the run and its report.

An example defines its env and calls ``train(...)``; this module builds the trainer (CPU in process,
or a `trl vllm-serve` server with ``--vllm-server``), trains, prints the reward per step, and saves
``rewards_seed{N}.json``, ``reward_seed{N}.png`` and ``transcripts_seed{N}.jsonl`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path


def example_parser(doc: str, *, name: str, steps: int) -> argparse.ArgumentParser:
    """The command line every example takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' (offline default), 'tiny', or a path/hub id")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=f"outputs/{name}")
    parser.add_argument("--vllm-server", default=None, help="URL of a `trl vllm-serve` server (GPU recipe)")
    return parser


def train(
    name: str,
    args: argparse.Namespace,
    env_factory: Callable[[], Any],
    processor: Any,
    *,
    seed_format: str,
    batch: int = 8,
    num_generations: int = 4,
    max_completion_length: int = 96,
    learning_rate: float = 3e-5,
    **rollout_options: Any,
) -> dict[str, float]:
    """Train ``env_factory``'s env with GRPO and report; returns first/last-quarter mean rewards and wall time.

    Each dataset prompt is an env seed, ``seed_format.format(i=i)``. ``rollout_options`` go to
    ``make_rollout_func`` (``max_turns``, ``max_new_tokens``, ...).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_env import env_reward, make_rollout_func

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    if not callable(getattr(processor, "init_system_input", None)):  # a builder: tokenizer -> processor
        processor = processor(tokenizer)
    os.makedirs(args.out, exist_ok=True)
    transcripts = os.path.join(args.out, f"transcripts_seed{args.seed}.jsonl")
    if os.path.exists(transcripts):
        os.remove(transcripts)
    gpu = args.vllm_server is not None
    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=batch,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        learning_rate=1e-3 if args.model == "tiny" else learning_rate,
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not gpu,
        bf16=gpu,  # float32 on CPU: exact logprobs, and bf16 autocast is slow on most CPUs
        use_vllm=gpu,
        vllm_mode="server",
        vllm_server_base_url=args.vllm_server,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [seed_format.format(i=i) for i in range(1000)]}),
        processing_class=tokenizer,
        rollout_func=make_rollout_func(env_factory, processor, transcripts=transcripts, **rollout_options),
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started

    # A step whose episodes all ended unscored (cut before any env step) logs no reward: left out.
    rewards = [h["reward"] for h in trainer.state.log_history if h.get("reward") is not None]
    k = max(1, len(rewards) // 4)
    summary = {"first_mean": sum(rewards[:k]) / k, "last_mean": sum(rewards[-k:]) / k, "wall_s": wall}
    print(f"[{name}] reward per step: {[round(r, 3) for r in rewards]}")
    print(
        f"[{name}] first {k} steps {summary['first_mean']:.3f} -> last {k} steps {summary['last_mean']:.3f} "
        f"in {wall:.0f} s; transcripts: {transcripts}"
    )
    with open(os.path.join(args.out, f"rewards_seed{args.seed}.json"), "w") as f:
        json.dump({"rewards": rewards, **summary}, f)
    plot(rewards, os.path.join(args.out, f"reward_seed{args.seed}.png"), title=f"{name}: GRPO, seed {args.seed}")
    return summary


def plot(rewards: list[float], path: str, *, title: str) -> None:
    """Save the reward curve as a PNG (skipped, with a note, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, marker="o")
    ax.set(xlabel="step", ylabel="mean env reward", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"reward curve: {path}")
