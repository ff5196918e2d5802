"""Level 2c: self-play. The policy plays both seats of TextArena's TicTacToe-v0 and learns from both, per role.

Each game is two episodes of one engine, one per seat, each with its own conversation (docs/selfplay.md): a GRPO
group of 4 copies of a seed is 2 games, and ``credit="per_role"`` compares each seat's result with the same seat's in
the group's other game (SPIRAL's role-conditioned advantages), so the zero-sum rewards do not cancel. Trained with
``EpisodeGRPOTrainer``; logged per seat: ``env/seat{0,1}/win_rate``, ``draw_rate``, ``loss_rate``,
``invalid_move_rate``. ``--save`` keeps the trained model for ``trl-env eval --seats`` against a random-move player.
``--frozen-every N`` plays seat 1 with a frozen copy instead: a LoRA snapshot of the policy, refreshed every N steps
and served by the same vLLM server (``LoraSnapshots``; the policy trains a LoRA adapter, synced as one: ``lora_sync``).

Hardware: a CPU (2 cores shared with other jobs: SmolLM2 steps of 142-435 s, docs/selfplay.md) or a GPU with a
          vLLM server. Against random_move, SmolLM2's win rate as seat 0 rose from 0.005 to 0.07 and 0.12 (2 seeds)
          after 3-4 LoRA self-play steps (benchmarks/selfplay_smollm2.py; docs/selfplay.md).
Run:      python experiment/examples/selfplay_tictactoe.py --save                  # SmolLM2, offline
          python experiment/examples/selfplay_tictactoe.py --model tiny --steps 2  # smoke run, seconds
          python experiment/examples/selfplay_tictactoe.py --vllm-server URL --frozen-every 10  # `vllm serve MODEL
            --enable-lora --max-lora-rank 8` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (docs/selfplay.md)
Measure:  trl-env eval --env trl_env.adapters.textarena_seats:TextArenaGame --env-kwargs '{"game": "TicTacToe-v0"}'
            --seats policy,trl_env.adapters.textarena_seats:random_move --model outputs/selfplay_tictactoe/model
            --system-prompt "$(python -c 'import selfplay_tictactoe as s; print(s.SYSTEM_PROMPT)')" --n 200 ...
          (and --seats random_move,policy for the other seat; docs/selfplay.md: full commands, what was measured)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

from trl_env import POLICY, ChatMLProcessor, Seating
from trl_env.adapters import TextArenaGame

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

SYSTEM_PROMPT = "You play Tic Tac Toe. Reply with one free cell number in square brackets, like [4], and nothing else."
GAME = "TicTacToe-v0"
MAX_TURNS = 5  # a seat's moves in one game (TicTacToe has at most 5)
SELF_PLAY = Seating(functools.partial(TextArenaGame, GAME), (POLICY, POLICY))
PER_SEAT = ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")


def main(argv: list[str] | None = None) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path
    from training import example_parser
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from trl_env import EpisodeGRPOTrainer, env_reward, make_rollout_func

    parser = example_parser(__doc__, name="selfplay_tictactoe", steps=30)
    parser.add_argument("--save", action="store_true", help="save the trained model under --out/model")
    parser.add_argument("--frozen-every", type=int, help="seat 1: a LoRA snapshot, new every N steps")
    args = parser.parse_args(argv)
    if args.frozen_every is not None and args.vllm_server is None:
        parser.error("--frozen-every needs --vllm-server: the snapshot is a LoRA adapter that server serves")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    os.makedirs(args.out, exist_ok=True)
    transcripts = os.path.join(args.out, f"transcripts_seed{args.seed}.jsonl")
    if os.path.exists(transcripts):
        os.remove(transcripts)
    gpu, seating, frozen, lora, peft_config = args.vllm_server is not None, SELF_PLAY, [], {}, None
    if args.frozen_every is not None:  # seat 1: the policy's adapter as it was N steps ago, on the same server
        from peft import LoraConfig

        from trl_env import LoraSnapshots, VLLMServerGenerator

        snapshots = LoraSnapshots(VLLMServerGenerator(args.vllm_server, temperature=1.0), every=args.frozen_every,
                                  adapter_dir=os.path.join(args.out, "frozen"))  # fmt: skip
        seating, frozen = Seating(SELF_PLAY.game, (POLICY, snapshots.seat)), [snapshots]
        lora = {"base_url": args.vllm_server, "lora_sync": os.path.join(args.out, "policy")}
        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    rollout_func = make_rollout_func(
        seating,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        credit="per_role",  # each seat against the same seat of the group's other game
        max_turns=MAX_TURNS,
        max_new_tokens=8,
        parse_truncated_turns=True,  # a small model rambles: a cut turn still counts as a move
        transcripts=transcripts,
        **lora,  # base_url and lora_sync, with --frozen-every
    )
    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        num_generations=4,  # 2 games of one seed, 2 seats each
        max_completion_length=1024,
        learning_rate=1e-3 if args.model == "tiny" else 3e-5,
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not torch.cuda.is_available(),  # a vLLM server on a CPU machine (the tests') trains on the CPU
        bf16=gpu and torch.cuda.is_available(),
        use_vllm=gpu and not frozen,  # a frozen snapshot needs the server's base weights unchanged
        vllm_mode="server",
        vllm_server_base_url=args.vllm_server,
    )
    trainer = EpisodeGRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [f"game-{i}" for i in range(1000)]}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=frozen,
        peft_config=peft_config,
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started

    logged = [h for h in trainer.state.log_history if "env/seat0/win_rate" in h]
    k, seats = max(1, len(logged) // 4), seating.policy_seats  # a frozen seat has no rows, so no metrics
    summary: dict[str, float] = {"wall_s": wall, "steps": float(len(logged))}
    for seat in seats:
        for name in PER_SEAT:
            values = [h[f"env/seat{seat}/{name}"] for h in logged]
            summary[f"seat{seat}/{name}/first"] = sum(values[:k]) / k
            summary[f"seat{seat}/{name}/last"] = sum(values[-k:]) / k
    print(f"[selfplay_tictactoe] {len(logged)} steps in {wall:.0f} s; first -> last {k} steps, per seat:")
    for seat in seats:
        print(f"  seat {seat}: " + ", ".join(f"{n} {summary[f'seat{seat}/{n}/first']:.3f} -> "
                                            f"{summary[f'seat{seat}/{n}/last']:.3f}" for n in PER_SEAT))  # fmt: skip
    with open(os.path.join(args.out, f"selfplay_seed{args.seed}.json"), "w") as f:
        json.dump({"per_step": logged, **summary}, f)
    if args.save:
        trainer.save_model(os.path.join(args.out, "model"))
        tokenizer.save_pretrained(os.path.join(args.out, "model"))
    return summary


if __name__ == "__main__":
    main()
