"""Packed (prefix-shared, padding-free) vs padded forward + backward of TRL's per-token logprobs, side by side.

Each case runs in a fresh process (so peak RSS is its own): TRL's padded forward of the rows (prompts left-padded,
completions right-padded, the fused LM head as GRPOTrainer calls it) or trl_env.train.packing's packed one, then a
backward of the logprobs' sum, in micro-batches of ``--rows`` rows; the step wall is the median of ``--repeats``.

Workloads (tiny Qwen2 model by default, float32, CPU):
  (a) groups:   4 prompts x 8 completions of 64 tokens; every prompt a shared 512-token system prompt + a 32-token task.
  (b) deployed: history="deployed" rows of 8-turn conversations under Qwen 3's official (thinking) template, which
                drops earlier reasoning, so each turn is a row whose prompt extends the conversation; 8 episodes.
  (c) agent:    an agent program's calls through the gateway as deployed rows: 2 tasks x 4 episodes x 6 calls, each
                row's prompt the system prompt, 4 tool schemas (Qwen 3 template), the task and the calls so far.
  (d) selfplay: two seats, 8 games x 8 turns; each seat's turn a deployed row of its own conversation.
  nothing:      32 rows sharing no token (random prompts of 64-160 tokens, completions of 16-96).

``--model smollm2`` runs SmolLM2-135M-Instruct (trl_env.testing, offline) instead; ``--limit N`` keeps the first N
rows of each workload.

Run: ``flock /tmp/trl_env_heavy.lock python benchmarks/bench_packing.py``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

WORKLOADS = ("groups", "deployed", "agent", "selfplay", "nothing")


def rows_of(workload: str, tok: object, vocab: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=g).tolist()

    if workload == "groups":
        system = ids(512)
        return [(p, ids(64)) for p in (system + ids(32) for _ in range(4)) for _ in range(8)]
    if workload == "nothing":
        return [(ids(64 + 3 * i), ids(16 + (37 * i) % 80)) for i in range(32)]
    from trl_env.testing.templates import trl_templates

    tok.chat_template = trl_templates()["qwen3"]  # type: ignore[attr-defined]

    def row(messages: list[dict[str, object]], reply: str, **extra: object) -> tuple[list[int], list[int]]:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)  # type: ignore[attr-defined]
        prompt = tok(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        return prompt, tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # type: ignore[operator,attr-defined]

    if workload == "agent":
        return agent_rows(row)
    if workload == "selfplay":
        return selfplay_rows(row)
    rows = []
    for episode in range(8):
        messages = [{"role": "system", "content": "You are playing a word game; answer with one word. " * 6}]
        for turn in range(8):
            messages.append({"role": "user", "content": f"Game {episode}, turn {turn}: the board says {turn * 7}."})
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
            prompt = tok(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
            answer = f"word{episode}{turn}"
            reply = f"<think>\nThe board says {turn * 7}; I pick {answer}.\n</think>\n\n{answer}"
            rows.append((prompt, tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))  # type: ignore[operator,attr-defined]
            messages.append({"role": "assistant", "content": answer})
    return rows


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} in the project's files. {doc}",
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg} to use."} for arg in args},
                "required": list(args),
            },
        },
    }
    for name, doc, args in [
        ("search_files", "Returns the matching lines with their paths.", ("pattern", "folder")),
        ("read_file", "Returns the file's text, numbered.", ("path",)),
        ("write_file", "Replaces the file's text.", ("path", "text")),
        ("run_tests", "Runs the test suite and returns its summary.", ("selection",)),
    ]
]


def agent_rows(row) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    """An agent program through the gateway: 2 tasks x 4 episodes, 6 calls each, every call a deployed row (its
    prompt: the system prompt, the tool schemas, the task and the calls and tool results so far)."""
    rows = []
    system = "You are a coding agent. Use the tools to find and fix the bug, then run the tests."
    for task in range(2):
        for episode in range(4):
            messages: list[dict[str, object]] = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Task {task}: the test test_parse_{task} fails with a KeyError."},
            ]
            for call in range(6):
                name = TOOLS[call % 4]["function"]["name"]  # type: ignore[index]
                arguments = {"path": f"src/mod_{episode}_{call}.py", "pattern": f"key{call}"}
                reply = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
                rows.append(row(messages, reply, tools=TOOLS))
                messages.append(
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
                )  # fmt: skip
                messages.append({"role": "tool", "content": f"line {call}: result of {name} in episode {episode}"})
    return rows


def selfplay_rows(row) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    """Self-play, two seats: 8 games of 4 rounds; each seat's turn is a deployed row of its own conversation (its
    own system prompt, the other seat's moves as user messages)."""
    rows = []
    rules = "The game: name a country whose first letter is the last letter of the previous one. "
    for game in range(8):
        seats = [[{"role": "system", "content": rules * 3 + f"You are player {seat + 1}."}] for seat in range(2)]
        last = "Start: the first country is Spain."
        for turn in range(8):
            seat = turn % 2
            seats[seat].append({"role": "user", "content": last})
            answer = f"country{game}{turn}"
            rows.append(row(seats[seat], f"<think>\nI need a country; {answer} fits.\n</think>\n\n{answer}"))
            seats[seat].append({"role": "assistant", "content": answer})
            last = f"Player {seat + 1} says {answer}."
    return rows


def padded(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    width_p = max(len(p) for p, _ in rows)
    width_c = max(len(c) for _, c in rows)
    ids = torch.full((len(rows), width_p + width_c), pad_id)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p)
        ids[i, width_p : width_p + len(c)] = torch.tensor(c)
        mask[i, width_p - len(p) : width_p + len(c)] = 1
    return ids, mask, width_c


def case(workload: str, mode: str, rows_per_batch: int, repeats: int, model_name: str, limit: int) -> dict[str, float]:
    """One workload in one mode, in this process: forwarded positions, unique tokens, step wall, peak RSS."""
    from trl.trainer.utils import add_fused_lm_head

    from trl_env.testing import build_tiny_model, build_tiny_tokenizer
    from trl_env.train.packing import (
        pack_rows,
        packed_logps,
        packing_pays,
        pair_weight_of,
        row_token_lists,
        unique_tokens,
    )

    torch.manual_seed(0)
    if model_name == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trl_env.testing.models import prepare_smollm2

        folder = prepare_smollm2()
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").train()
    else:
        tok = build_tiny_tokenizer()
        model = build_tiny_model(tok).train()
    model.config._attn_implementation = "sdpa"
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    rows = rows_of(workload, tok, model.config.vocab_size)[: limit or None]
    batches = [padded(rows[i : i + rows_per_batch], tok.pad_token_id) for i in range(0, len(rows), rows_per_batch)]
    weight = pair_weight_of(model)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    walls, positions, unique = [], 0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        positions = unique = 0
        for ids, mask, keep in batches:
            pays = True
            if mode == "packed":  # as trainer_packed_logps decides: the padded forward where the trie saves ~nothing
                kept = [row for _, row in row_token_lists(ids, mask) or []]
                pays = packing_pays(sum(len(row) for row in kept), unique_tokens(kept))
            if mode == "padded" or not pays:
                labels = ids.masked_fill(mask == 0, -100)
                labels[:, :-keep] = -100
                out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
                logps = out.log_probs[:, -keep:]
                positions += ids.numel()
                unique += int(mask.sum())
            else:
                packed = pack_rows(ids, mask, keep, tok.pad_token_id, pair_weight=weight)
                assert packed is not None
                logps, _ = packed_logps(model, packed, compute_entropy=True)
                positions += packed.stats.forwarded_positions
                unique += packed.stats.unique_tokens
            logps.sum().backward()
        walls.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "rows": len(rows),
        "row_tokens": sum(len(p) + len(c) for p, c in rows),
        "positions": positions,
        "unique": unique,
        "wall_s": statistics.median(walls[1:] if len(walls) > 2 else walls),
        "peak_rss_mib": peak / 1024,
        "rss_growth_mib": (peak - base) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8, help="rows per micro-batch (TRL's per_device batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--limit", type=int, default=0, help="the first LIMIT rows of each workload (0: all)")
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.case:
        print(json.dumps(case(args.case[0], args.case[1], args.rows, args.repeats, args.model, args.limit)))
        return
    name = "SmolLM2-135M-Instruct" if args.model == "smollm2" else "tiny Qwen2 (2 layers, hidden 128)"
    print(
        f"torch {torch.__version__}, 1 thread, {name}, float32, {args.rows} rows/forward, limit {args.limit or 'none'}"
    )
    header = (
        f"{'workload':<9} {'rows':>4} {'row tok':>8} {'unique':>7} {'padded pos':>10} {'packed pos':>10} "
        f"{'pos/unique':>10} {'ratio':>6} {'padded s':>9} {'packed s':>9} {'speed-up':>8} "
        f"{'RSS+ pad MiB':>12} {'RSS+ pack MiB':>13}"
    )
    print(header)
    for workload in args.workloads:
        out = {}
        for mode in ("padded", "packed"):
            command = [sys.executable, __file__, "--case", workload, mode, "--rows", str(args.rows)]
            command += ["--repeats", str(args.repeats), "--model", args.model, "--limit", str(args.limit)]
            out[mode] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        pad, pack = out["padded"], out["packed"]
        print(
            f"{workload:<9} {pad['rows']:>4} {pad['row_tokens']:>8} {pack['unique']:>7} {pad['positions']:>10} "
            f"{pack['positions']:>10} {pack['positions'] / pack['unique']:>10.3f} "
            f"{pad['row_tokens'] / pack['unique']:>6.2f} {pad['wall_s']:>9.3f} {pack['wall_s']:>9.3f} "
            f"{pad['wall_s'] / pack['wall_s']:>7.2f}x {pad['rss_growth_mib']:>12.1f} {pack['rss_growth_mib']:>13.1f}"
        )


if __name__ == "__main__":
    main()
