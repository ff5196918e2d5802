"""Evaluation without training: run an env + processor against a vLLM server or a local model, summarise, save.

``trl-env eval`` (see ``trl_env.tools.cli``) is the command-line face of ``evaluate``: a progress bar, a
summary table, JSONL transcripts and a readable markdown view of every episode.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_env.env import Env
from trl_env.errors import ConfigError
from trl_env.rollout.records import Budgets, Ending, Rollout
from trl_env.rollout.seated import seat_counts, seat_rates
from trl_env.rollout.transcripts import write_transcripts
from trl_env.seats import Seating


@dataclass(frozen=True)
class Summary:
    """Aggregate figures of an evaluation."""

    episodes: int
    mean_reward: float
    success_rate: float
    """Share of episodes the env ended with reward >= the success threshold."""
    mean_turns: float
    truncation_rate: float
    error_rate: float
    mean_model_tokens: float
    mean_completion_tokens: float
    wall_s: float

    def table(self) -> str:
        """A markdown table of the figures."""
        rows = [(name, getattr(self, name)) for name in self.__dataclass_fields__]
        lines = ["| metric | value |", "| --- | --- |"]
        lines += [
            f"| {name} | {value:.4g} |" if isinstance(value, float) else f"| {name} | {value} |" for name, value in rows
        ]
        return "\n".join(lines)


def summarize(rollouts: Sequence[Rollout], *, wall_s: float, success_threshold: float = 1.0) -> Summary:
    """Figures over ``rollouts``; rewards of failed episodes (``None``) are left out of the mean."""
    n = max(1, len(rollouts))
    rewards = [r.reward for r in rollouts if r.reward is not None]
    rows_B = [r.rows for r in rollouts]  # history="deployed": several rows, every sampled token in one
    return Summary(
        episodes=len(rollouts),
        mean_reward=statistics.fmean(rewards) if rewards else float("nan"),
        success_rate=sum(r.terminated and (r.reward or 0.0) >= success_threshold for r in rollouts) / n,
        mean_turns=statistics.fmean(len(r.turns) for r in rollouts) if rollouts else 0.0,
        truncation_rate=sum(r.truncated for r in rollouts) / n,
        error_rate=sum(r.ending is Ending.ERROR for r in rollouts) / n,
        mean_model_tokens=statistics.fmean(sum(sum(w.env_mask) for w in rows) for rows in rows_B) if rollouts else 0.0,
        mean_completion_tokens=statistics.fmean(sum(len(w.completion_ids) for w in rows) for rows in rows_B)
        if rollouts
        else 0.0,
        wall_s=wall_s,
    )


def write_markdown(path: str | os.PathLike[str], rollouts: Sequence[Rollout], *, limit: int = 50) -> None:
    """A readable view of the first ``limit`` episodes: each turn's model text and the env's answer."""
    lines = ["# Transcripts", ""]
    for i, r in enumerate(rollouts[:limit]):
        seat = f", game {r.info['game']}, seat {r.info['seat']}" if "seat" in r.info else ""
        lines += [
            f"## Episode {i}: seed `{r.seed}`{seat}",
            "",
            f"ending **{r.ending.value}**, reward **{r.reward}**",
            "",
        ]
        for k, turn in enumerate(r.turns, 1):
            lines += [
                f"**turn {k} · model** ({turn.num_model_tokens} tokens, {turn.finish_reason.value})",
                "",
                "```text",
                turn.text,
                "```",
                "",
            ]
            if turn.delta is not None:
                lines += [f"**turn {k} · env** (reward {turn.reward})", "", "```text", turn.delta, "```", ""]
        if r.error:
            lines += ["**error**", "", "```text", r.error.strip(), "```", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def seat_table(rollouts: Sequence[Rollout]) -> str:
    """Per seat of a game (``trl_env.rollout.seated.seat_rates``): win, draw and loss rates, ...; "" without seats."""
    rates = seat_rates(seat_counts(rollouts))
    if not rates:
        return ""
    seats = sorted({key.split("/")[0] for key in rates})
    names = [key.split("/")[1] for key in rates if key.startswith(seats[0] + "/")]
    lines = ["| seat | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [f"| {s[4:]} | " + " | ".join(f"{rates[f'{s}/{n}']:.4g}" for n in names) + " |" for s in seats]
    return "\n".join(lines)


def load_env_factory(spec: str, option: str = "--env") -> Callable[[], Env]:
    """``module.path:Name`` or ``path/to/file.py:Name`` -> the class or function ``Name`` (``--env``, ``--seats``).

    Raises:
        ConfigError: naming the option, the spec and the expected form.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        name = "EnvClass" if option == "--env" else "Name"
        raise ConfigError(f"{option} {spec!r}: expected 'module.path:{name}' or 'path/to/file.py:{name}'.")
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise ConfigError(f"{option} {spec!r}: file {target!r} does not exist.")
        module_name = os.path.splitext(os.path.basename(target))[0]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        module_spec = importlib.util.spec_from_file_location(module_name, target)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ConfigError(
                f"{option} {spec!r}: no module {target!r} ({e}); give 'module.path:Name' of an "
                "importable module, or 'path/to/file.py:Name'."
            ) from e
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(f"{option} {spec!r}: {target} has no callable {name!r}.")
    return factory  # type: ignore[no-any-return]  # checked callable; an Env factory by contract


def evaluate(
    seeds: Sequence[str],
    env_factory: Callable[[], Env] | Seating,
    processor: Any,
    tokenizer: Any,
    generator: Any,
    *,
    budgets: Budgets | None = None,
    parse_truncated_turns: bool = False,
    out_dir: str | os.PathLike[str] | None = None,
    success_threshold: float = 1.0,
    progress: bool = True,
    env_workers: int = 16,
    env_timeout: float | None = 300.0,
    history: str = "sampled",
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Summary, list[Rollout]]:
    """Run one episode per seed and summarise; with ``out_dir``, also write transcripts (JSONL and markdown).

    ``history``/``template_kwargs``: as ``batch_rollout``'s (``"deployed"``: each turn sampled from the chat
    template's rendering, as the deployed model sees it; docs/history.md). A ``Seating`` plays one game per seed
    (an episode per policy seat; ``seat_table`` summarises them per seat).
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    from trl_env.rollout import batch_rollout
    from trl_env.rollout.seated import play_seats

    if isinstance(env_factory, Seating):
        seeds = [s for s in seeds for _ in env_factory.policy_seats]  # each game: one episode per policy seat
    run = play_seats if isinstance(env_factory, Seating) else batch_rollout
    bar = tqdm(total=len(seeds), desc="episodes", disable=not progress)
    started = time.perf_counter()
    try:
        rollouts = run(
            seeds,
            env_factory,  # type: ignore[arg-type]  # play_seats takes the Seating, batch_rollout the factory
            processor,
            tokenizer,
            generator,
            budgets=budgets,
            parse_truncated_turns=parse_truncated_turns,
            on_episode_end=lambda _: bar.update(1),
            env_workers=env_workers,
            env_timeout=env_timeout,
            history=history,
            template_kwargs=template_kwargs,
        )
    finally:
        bar.close()
    summary = summarize(rollouts, wall_s=time.perf_counter() - started, success_threshold=success_threshold)
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        jsonl = os.path.join(out_dir, "transcripts.jsonl")
        if os.path.exists(jsonl):
            os.remove(jsonl)
        write_transcripts(jsonl, rollouts, tokenizer=tokenizer, mode="eval")
        write_markdown(os.path.join(out_dir, "transcripts.md"), rollouts)
        with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
            f.write(summary.table() + "\n" + (f"\n{seat_table(rollouts)}\n" if seat_table(rollouts) else ""))
    return summary, rollouts
