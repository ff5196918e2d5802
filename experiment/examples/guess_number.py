"""Level 1: guess the number with higher/lower hints, trained with GRPO on a CPU.

The env picks a secret number from its seed (so every copy of a GRPO group plays the same game)
and answers each guess with "Higher." or "Lower."; the episode ends when the model finds it or
runs out of turns. Reward: 1.0 for a win (minus 0.1 per extra turn), else up to 0.5 for how close
the last guess came; a reply with no number costs 0.2.

Hardware: a CPU (2 cores, ~15 min with SmolLM2-135M-Instruct) or anything bigger.
Run:      python experiment/examples/guess_number.py                 # the main job (SmolLM2, prepared offline)
          python experiment/examples/guess_number.py --model tiny --steps 2   # smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time

from trl_env import Action, ChatMLProcessor, Delta, Env, Seed, env_reward, make_rollout_func

LOW, HIGH = 1, 10  # the secret number's range (inclusive)
MAX_TURNS = 3
SYSTEM_PROMPT = "You play a guessing game. Reply with a single number and nothing else."


class GuessNumberEnv(Env):
    """Guess a secret number in [LOW, HIGH] from higher/lower hints."""

    def __init__(self, low: int = LOW, high: int = HIGH, max_turns: int = MAX_TURNS) -> None:
        self.low, self.high, self.max_turns = low, high, max_turns
        self.reward, self.alive = 0.0, True
        self.secret, self.turns, self.penalty = 0, 0, 0.0

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.reward, self.alive, self.turns, self.penalty = 0.0, True, 0, 0.0
        return self, f"I am thinking of a number between {self.low} and {self.high}. What is your guess?"

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.turns += 1
        match = re.search(r"-?\d+", action)
        if match is None:
            self.penalty += 0.2
            self.reward = -self.penalty
            self.alive = self.turns < self.max_turns
            return self, f"Please reply with a number between {self.low} and {self.high}."
        guess = int(match.group())
        if guess == self.secret:
            self.reward, self.alive = 1.0 - 0.1 * (self.turns - 1) - self.penalty, False
            return self, "Correct!"
        closeness = 1.0 - min(abs(guess - self.secret), self.high - self.low) / (self.high - self.low)
        self.reward = 0.5 * closeness - self.penalty
        self.alive = self.turns < self.max_turns
        return self, "Higher." if guess < self.secret else "Lower."


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' (offline default), 'tiny', or a path/hub id")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/guess_number")
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    os.makedirs(args.out, exist_ok=True)
    transcripts = os.path.join(args.out, f"transcripts_seed{args.seed}.jsonl")
    if os.path.exists(transcripts):
        os.remove(transcripts)

    dataset = Dataset.from_dict({"prompt": [f"game-{i}" for i in range(1000)]})  # each prompt is an env seed
    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=96,
        learning_rate=3e-5 if args.model != "tiny" else 1e-3,
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # float32 on CPU: exact logprobs, and bf16 autocast is slow on most CPUs
        seed=args.seed,
        data_seed=args.seed,
    )
    rollout_func = make_rollout_func(
        GuessNumberEnv,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as a guess
        transcripts=transcripts,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started

    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h and "train_runtime" not in h]
    k = max(1, len(rewards) // 4)
    summary = {"first_mean": sum(rewards[:k]) / k, "last_mean": sum(rewards[-k:]) / k, "wall_s": wall}
    print(f"[guess_number] reward per step: {[round(r, 3) for r in rewards]}")
    print(
        f"[guess_number] first {k} steps {summary['first_mean']:.3f} -> last {k} steps {summary['last_mean']:.3f}"
        f" in {wall:.0f} s; transcripts: {transcripts}"
    )
    with open(os.path.join(args.out, f"rewards_seed{args.seed}.json"), "w") as f:
        json.dump({"rewards": rewards, **summary}, f)
    _plot(rewards, os.path.join(args.out, f"reward_seed{args.seed}.png"))
    return summary


def _plot(rewards: list[float], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[guess_number] matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, marker="o")
    ax.set(xlabel="step", ylabel="mean env reward", title="guess_number: GRPO on CPU")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"[guess_number] reward curve: {path}")


if __name__ == "__main__":
    main()
