"""Two-process GRPO on CPU (gloo) where process 0's first row fails at reset; run with torchrun --nproc_per_node 2.

Writes the trainer's log history (rank 0) to the JSON file named by the first argument. With a model folder and
comma-separated vLLM server URLs as the second and third, every process samples from those data-parallel servers
(docs/scaling.md's CPU recipe); without, each samples in process with the tiny model.
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


def main(out_path: str, model_dir: str | None = None, servers: str | None = None) -> None:
    base_url = servers.split(",") if servers else None
    inner = make_rollout_func(Echo, ChatMLProcessor(), max_turns=2, max_new_tokens=6, parse_truncated_turns=True,
                              base_url=base_url)  # fmt: skip
    rank = int(os.environ.get("RANK", "0"))

    def rollout_func(prompts, trainer):
        prompts = list(prompts)
        if rank == 0:
            prompts[0] = "FAIL"  # this process's first row
        return inner(prompts, trainer)

    if model_dir is None:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(tokenizer)
    else:  # the served model: the trainer's weights are the servers'
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[env_reward, format_reward],
        rollout_func=rollout_func,
        train_dataset=Dataset.from_dict({"prompt": [f"topic {i}" for i in range(8)]}),
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=4,
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
    if trainer.accelerator.is_main_process:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"log_history": trainer.state.log_history, "num_processes": trainer.accelerator.num_processes}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
