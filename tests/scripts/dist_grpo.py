"""Two-process GRPO on CPU (gloo) where process 0's first row fails at reset; run with torchrun --nproc_per_node 2.

Writes the trainer's log history (rank 0) to the JSON file named by the first argument. With a model folder and
comma-separated vLLM server URLs as the second and third, every process samples from those data-parallel servers
(docs/scaling.md's CPU recipe); without, each samples in process with the tiny model.

With ``TRL_ENV_TEST_CREDIT`` set to a ``credit=`` name, it trains with ``EpisodeGRPOTrainer`` and groups of 8 (each
group split across the two processes), and each process also writes, per step, its episodes' credit records and the
per-token advantages TRL trained on to ``<first argument>.rank<RANK>.json``.

With ``TRL_ENV_TEST_HISTORY=deployed`` it trains ``history="deployed"`` rows (the tiny tokenizer with Qwen 3's thinking
template, replies from tests/test_history.py's ``ReplyGenerator``; steps_per_generation and gradient_accumulation_steps
2, groups of 8 split across the two processes) and each process writes, per generation batch, its real rows, the rows
and tokens its micro-batches trained, and each micro-step's denominators to ``<first argument>.rank<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_env import ChatMLProcessor, env_reward, make_rollout_func
from trl_env.testing import build_tiny_model, build_tiny_tokenizer
from trl_env.train.credit import EpisodeCredit
from trl_env.train.episode_trainer import EpisodeGRPOTrainer


class Echo:
    """Two turns; the seed 'FAIL' fails at reset."""

    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        if seed == "FAIL":
            raise RuntimeError("injected reset failure on process 0, row 0")
        return self, f"Say something about {seed}."

    def step(self, action):
        self.turn += 1
        self.reward += len(action) % 3
        self.alive = self.turn < 2
        return self, "again"


def format_reward(completions, **kwargs):
    return [0.0 for _ in completions]


class Recording(EpisodeGRPOTrainer):
    """Keeps each step's episodes (as credit records) and the per-token advantages TRL receives."""

    steps: list[dict] = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        rollouts = self.rollout_func.last
        self.steps.append({
            "credits": [vars(EpisodeCredit.from_rollout(r)) for r in rollouts],
            "tokens": [[[t.num_model_tokens, t.num_env_tokens] for t in r.turns] for r in rollouts],
            "advantages": out["advantages"].tolist(),
        })  # fmt: skip
        return out


class RowRecording(EpisodeGRPOTrainer):
    """Keeps, per generation batch, this process's real rows and what its micro-batches trained."""

    steps: list[dict] = []

    def _prepare_inputs(self, generation_batch):
        from trl_env.train.micro_batches import trained_tokens

        before = self._row_steps
        out = super()._prepare_inputs(generation_batch)
        if self._row_steps is not before:
            chunks = [c for step in self._row_steps for c in step.chunks]
            self.steps.append({
                "rows": self.real_rows,
                "trained": sum(int((c["completion_mask"].sum(dim=1) > 0).sum()) for c in chunks),
                "tokens": sum(int(trained_tokens(c).sum()) for c in chunks),
                "denominators": [[step.rows, step.tokens] for step in self._row_steps],
            })  # fmt: skip
        return out

    def _generate_and_score_completions(self, inputs):
        from trl_env.train.micro_batches import REAL_ROW

        out = super()._generate_and_score_completions(inputs)
        self.real_rows = int(out[REAL_ROW].sum())
        return out


def deployed(out_path: str) -> None:
    """history="deployed" on two processes, rows per process differing (see the module docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from history_support import FlakyTalkEnv, NumberedTalkEnv, ReplyGenerator, thinking_tokenizer, thinks_by_episode

    from trl_env.render.processors import from_tokenizer

    rank = int(os.environ.get("RANK", "0"))
    FlakyTalkEnv.count = rank  # other env numbers, so other rows per episode, on process 1
    tokenizer = thinking_tokenizer(build_tiny_tokenizer())
    processor = from_tokenizer(tokenizer)
    func = make_rollout_func(NumberedTalkEnv, processor, history="deployed", max_turns=3,
                             generator=ReplyGenerator(tokenizer, processor, think=thinks_by_episode))  # fmt: skip
    trainer = RowRecording(
        model=build_tiny_model(tokenizer),
        processing_class=tokenizer,
        reward_funcs=env_reward,
        rollout_func=func,
        train_dataset=Dataset.from_dict({"prompt": [f"topic {i}" for i in range(8)]}),
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            max_steps=2,
            per_device_train_batch_size=2,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            num_generations=8,
            max_completion_length=128,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=0,
        ),  # fmt: skip
        max_micro_batch_tokens=400,
    )
    trainer.train()
    with open(f"{out_path}.rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(RowRecording.steps, f)
    if trainer.accelerator.is_main_process:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"log_history": trainer.state.log_history, "num_processes": trainer.accelerator.num_processes}, f)


def main(out_path: str, model_dir: str | None = None, servers: str | None = None) -> None:
    if os.environ.get("TRL_ENV_TEST_HISTORY") == "deployed":
        return deployed(out_path)
    base_url = servers.split(",") if servers else None
    credit = os.environ.get("TRL_ENV_TEST_CREDIT", "episode")
    inner = make_rollout_func(Echo, ChatMLProcessor(), max_turns=2, max_new_tokens=6, parse_truncated_turns=True,
                              base_url=base_url, credit=credit)  # fmt: skip
    rank = int(os.environ.get("RANK", "0"))
    rollouts = inner.rollouts

    def keep(prompts, trainer):
        inner.last = rollouts(prompts, trainer)
        return inner.last

    inner.rollouts = keep

    def rollout_func(prompts, trainer):
        prompts = list(prompts)
        if rank == 0:
            prompts[0] = "FAIL"  # this process's first row
        return inner(prompts, trainer)

    if credit != "episode":  # EpisodeGRPOTrainer calls the RolloutFunction's rollouts(): the same failure

        def failing(prompts, trainer):
            prompts = list(prompts)
            if rank == 0:
                prompts[0] = "FAIL"
            return keep(prompts, trainer)

        inner.rollouts, rollout_func = failing, inner

    if model_dir is None:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(tokenizer)
    else:  # the served model: the trainer's weights are the servers'
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = (GRPOTrainer if credit == "episode" else Recording)(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[env_reward, format_reward],
        rollout_func=rollout_func,
        train_dataset=Dataset.from_dict({"prompt": [f"topic {i}" for i in range(8)]}),
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=4 if credit == "episode" else 8,
            max_completion_length=32,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=0,
        ),
    )
    trainer.train()
    if credit != "episode":
        with open(f"{out_path}.rank{rank}.json", "w", encoding="utf-8") as f:
            json.dump(Recording.steps, f)
    if trainer.accelerator.is_main_process:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"log_history": trainer.state.log_history, "num_processes": trainer.accelerator.num_processes}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
