"""The whole run's rollout statistics, added to the trainer's logged metrics (``env/*``) by the rollout function."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trl_env.errors import ERROR_KINDS
from trl_env.render.processors.base import ParseStatus
from trl_env.rollout.records import Ending, Rollout
from trl_env.rollout.seated import seat_counts, seat_rates
from trl_env.train.trl_internals import metric_lists


def log_metrics(trainer: Any, rollouts: Sequence[Rollout]) -> None:
    """Add the whole run's rollout statistics to the trainer's logged metrics (with TRL's own: wandb, tensorboard).

    Every process calls this with its own rollouts; sums are gathered across processes first, so
    the rates and means describe every episode of the step, not process 0's.
    """
    metrics = metric_lists(trainer)
    if metrics is None:
        return
    turns = [t for r in rollouts for t in r.turns]
    sums = {
        "episodes": len(rollouts),
        "turns": len(turns),
        "model_tokens": sum(sum(row.env_mask) for r in rollouts for row in r.rows),  # every row: deployed has several
        "generation_s": sum(t.generation_s for t in turns),
        "step_s": sum(t.env_s for t in turns),
    }
    for ending in Ending:
        sums[f"ending_{ending.value}"] = sum(r.ending is ending for r in rollouts)
    for kind in ERROR_KINDS:
        sums[f"error_{kind}"] = sum(r.info.get("error_kind") == kind for r in rollouts)
    sums["max_tokens_cut"] = sum(r.info.get("max_tokens_cut", 0) for r in rollouts)  # a chat request's own cap
    calls = [call for t in turns for call in t.tool_calls]
    tools = _names_over_processes(trainer, sorted({name for name, _ in calls}))
    sums["tool_calls"] = len(calls)
    sums["tool_errors"] = sum(not ok for _, ok in calls)
    for tool in tools:
        sums[f"tool_calls/{tool}"] = sum(name == tool for name, _ in calls)
        sums[f"tool_errors/{tool}"] = sum(name == tool and not ok for name, ok in calls)
    facts = [r.info["env"] for r in rollouts if isinstance(r.info.get("env"), dict)]
    stats = _names_over_processes(trainer, sorted({name for f in facts for name in _fact_stats(f)}))
    for name in stats:  # "mean:<key>" for numbers, "rate:<key>" for flags; over the episodes that report the key
        values_of = [v for f in facts for n, v in _fact_stats(f).items() if n == name]
        sums[f"{name}/sum"], sums[f"{name}/n"] = sum(values_of), len(values_of)
    seats = seat_counts(rollouts)  # games of several seats: per-seat sums (trl_env.rollout.seated)
    seat_keys = _names_over_processes(trainer, sorted(seats))
    for key in seat_keys:
        sums[key] = seats.get(key, 0.0)
    sums["parsed"] = sum(t.parse_status is not None for t in turns)
    for status in ParseStatus:
        sums[f"parse_{status.value}"] = sum(t.parse_status == status.value for t in turns)
    total = dict(zip(sums, _sum_over_processes(trainer, list(sums.values())), strict=True))
    episodes, n_turns = max(total["episodes"], 1.0), max(total["turns"], 1.0)
    values = {
        "env/turns_mean": total["turns"] / episodes,
        "env/model_tokens_mean": total["model_tokens"] / episodes,
        "env/generation_s_mean": total["generation_s"] / n_turns,
        "env/step_s_mean": total["step_s"] / n_turns,
    }
    for ending in Ending:
        values[f"env/ending_{ending.value}_rate"] = total[f"ending_{ending.value}"] / episodes
    for kind in ERROR_KINDS:
        values[f"env/error_{kind}_rate"] = total[f"error_{kind}"] / episodes
    for status in ParseStatus:  # over the turns a family processor parsed
        values[f"env/parse_{status.value}_rate"] = total[f"parse_{status.value}"] / max(total["parsed"], 1.0)
    if total["max_tokens_cut"]:  # turns cut at their call's own max_tokens (agents), per episode
        values["env/max_tokens_cut_mean"] = total["max_tokens_cut"] / episodes
    if total["tool_calls"]:  # over the calls the env answered (a ToolEnv, or any env answering with ToolResults)
        values["env/tool_calls_mean"] = total["tool_calls"] / episodes
        values["env/tool_errors_rate"] = total["tool_errors"] / total["tool_calls"]
        for tool in tools:
            values[f"env/tool/{tool}/calls_mean"] = total[f"tool_calls/{tool}"] / episodes
            values[f"env/tool/{tool}/errors_rate"] = total[f"tool_errors/{tool}"] / max(
                total[f"tool_calls/{tool}"], 1.0
            )
    for name in stats:  # env-side facts (the env's optional ``info``): numbers averaged, flags as rates
        kind, _, key = name.partition(":")
        values[f"env/info/{key}_{kind}"] = total[f"{name}/sum"] / max(total[f"{name}/n"], 1.0)
    for key, value in seat_rates({key: total[key] for key in seat_keys}).items():  # per role: env/seat{s}/...
        values[f"env/{key}"] = value
    mode = "train" if trainer.model.training else "eval"
    for key, value in values.items():
        metrics[mode][key].append(value)


def _fact_stats(info: dict[str, Any]) -> dict[str, float]:
    """An env's info as statistics: ``rate:<key>`` for a flag, ``mean:<key>`` for a finite number; the rest skipped."""
    stats = {}
    for key, value in info.items():
        if isinstance(value, bool):
            stats[f"rate:{key}"] = float(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            stats[f"mean:{key}"] = float(value)
    return stats


def _names_over_processes(trainer: Any, names: list[str]) -> list[str]:
    """The union of every process's ``names``, sorted (so every process sums the same keys in the same order)."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return names
    from accelerate.utils import gather_object  # type: ignore[import-untyped]

    return sorted(set(gather_object(names)))


def _sum_over_processes(trainer: Any, values: list[float]) -> list[float]:
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return [float(v) for v in values]
    import torch

    local = torch.tensor([values], dtype=torch.float64, device=accelerator.device)  # (1, n)
    return [float(v) for v in accelerator.gather(local).sum(dim=0).tolist()]  # (processes, n) -> (n,)
