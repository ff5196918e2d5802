"""Guess the number (level 1) with asynchronous GRPO: TRL's AsyncGRPOTrainer fed by trl-env's rollout worker.

Episodes keep running on a vLLM server while the trainer trains; after each optimizer step the trainer
publishes its LoRA adapter to the server (`trl-policy-vN`) and the worker's next turns use it. See
docs/async.md. The server must be started first, with LoRA enabled (the model it serves is trained here):

    VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora \
        --max-lora-rank 8 --max-loras 4 --logprobs-mode processed_logprobs --dtype float32

Hardware: a CPU works with a tiny model (docs/async.md shows the tiny test model's server command); the
speed-up over the sync path needs the server and the trainer on separate devices.
Run:      python experiment/examples/async_guess.py --base-url http://127.0.0.1:8000 --steps 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples: guess_number's env


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True, help="a running vLLM server started with --enable-lora")
    parser.add_argument("--model", default=None, help="the model to train (default: the one the server serves)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="samples per optimizer step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2, help="the server needs --max-loras >= this + 2")
    parser.add_argument("--out", default="/tmp/async_guess")
    args = parser.parse_args(argv)

    import requests
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from guess_number import MAX_TURNS, SYSTEM_PROMPT, GuessNumberEnv
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trl_env import ChatMLProcessor, TrlEnvRolloutWorker, patch_for_cpu

    model = args.model or requests.get(f"{args.base_url}/v1/models", timeout=10).json()["data"][0]["root"]
    cpu = not torch.cuda.is_available()
    if cpu:
        patch_for_cpu()  # TRL 1.16's AsyncGRPOTrainer assumes CUDA (docs/async.md)
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = AsyncGRPOConfig(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch,
                             num_generations=args.num_generations, max_completion_length=96,
                             max_staleness=args.max_staleness, learning_rate=1e-4, logging_steps=1, report_to=[],
                             save_strategy="no", vllm_server_base_url=args.base_url, temperature=1.0,
                             bf16=False, gradient_checkpointing=False, token_budget=0 if cpu else None)  # fmt: skip
    seeds = [f"game-{i}" for i in range(1000)]
    worker = TrlEnvRolloutWorker.from_args(config, GuessNumberEnv, ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
                                           tokenizer, seeds, max_inflight_groups=max(1, args.batch // 4),
                                           max_turns=MAX_TURNS, max_new_tokens=8,
                                           parse_truncated_turns=True)  # fmt: skip
    trainer = AsyncGRPOTrainer(model=model, args=config, processing_class=tokenizer, rollout_worker=worker,
                               train_dataset=Dataset.from_dict({"prompt": seeds}),
                               peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                      lora_dropout=0.0))  # fmt: skip
    if not trainer._lora_sync:
        raise SystemExit(f"{args.base_url} does not take LoRA adapters: start it with --enable-lora (docs/async.md)")
    t0 = time.time()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    quarter = max(1, len(logs) // 4)
    summary = {
        "reward_first": sum(h["reward"] for h in logs[:quarter]) / quarter,
        "reward_last": sum(h["reward"] for h in logs[-quarter:]) / quarter,
        "staleness_mean": sum(h.get("sample/staleness_mean", 0.0) for h in logs) / max(1, len(logs)),
        "wall_s": time.time() - t0,
    }
    print({k: round(v, 3) for k, v in summary.items()}, "| worker:", dict(worker.counts))
    return summary


if __name__ == "__main__":
    main()
