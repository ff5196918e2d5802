"""The estimators, tasks and training runs of ``bench_credit.py`` (one module, so the script stays a report).

``VARIANTS``: the benchmarked ``credit=`` settings by label, ``discounted`` at its default ``gamma=1`` and at 0.9.
``TASK_NAMES``: ``maze`` (``experiment/examples/text_maze.py``, trained by its own ``train_maze``) and the tasks of
``trl_env.testing.credit_tasks`` (trained here by ``train_task``, the same trainer settings as ``train_maze``).
``quality``: the credit-quality table without training, the maze included (``MazeTask`` adapts it to the
``CreditTask`` protocol, so one dynamic programme serves every task).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import _common as C

sys.path.insert(0, str(C.REPO_ROOT / "experiment" / "examples"))  # text_maze.py
sys.path.insert(0, str(C.REPO_ROOT / "experiment"))  # models.py

VARIANTS = ("episode", "discounted", "discounted_g0.9", "gigpo", "per_turn_index", "discounted_g0")
"""Benchmarked settings: the four ``credit=`` names at their defaults (``discounted``: gamma=1, ``gigpo``: weight 1,
gamma 0.95), ``DiscountedReturns(gamma=0.9)`` and ``DiscountedReturns(gamma=0.0)`` (each turn its own reward minus
its index's mean: the textbook estimator for independent per-turn rewards)."""
DEFAULT_VARIANTS = VARIANTS[:5]
COLORS = {"episode": "tab:gray", "discounted": "tab:blue", "discounted_g0.9": "tab:purple", "gigpo": "tab:green",
          "per_turn_index": "tab:red", "discounted_g0": "tab:orange"}  # fmt: skip
TASK_NAMES = ("maze", "rounds", "loop", "early")


def credit_arg(label: str) -> Any:
    """What ``make_rollout_func(credit=...)`` gets for a ``VARIANTS`` label (the trainer's ``scale_rewards="group"``)."""
    from trl_env.train.credit import DiscountedReturns

    if label.startswith("discounted_g"):
        return DiscountedReturns(gamma=float(label.removeprefix("discounted_g")), scale_rewards="group")
    return label


def estimator(label: str) -> Any:
    """The estimator a label trains with, for the quality table (``scale_rewards="group"``, as in training)."""
    from trl_env.train.credit import EpisodeAdvantage, get_estimator

    arg = credit_arg(label)
    return EpisodeAdvantage("group") if arg == "episode" else get_estimator(arg) if isinstance(arg, str) else arg


@dataclass(frozen=True)
class MazeTask:
    """The text maze as a ``CreditTask`` (state: the cell), stepping a ``text_maze.MazeEnv`` placed in it."""

    layout: tuple[str, ...]
    max_turns: int
    progress: float
    moves: tuple[str, ...] = ("N", "E", "S", "W")

    def _env(self) -> Any:
        import text_maze

        return text_maze.MazeEnv(self.layout, self.max_turns, self.progress)

    def start(self) -> Hashable:
        return self._env().start

    def step(self, state: Hashable, turn: int, move: str | None) -> tuple[float, Hashable, bool]:
        env = self._env()
        env.cell, env.turns = state, turn
        env.step(move or "?")
        return env.reward, env.cell, env.cell == env.goal

    def observation(self, state: Hashable, turn: int) -> str:
        env = self._env()
        env.cell = state
        return str(env.observation())

    def anchor(self, state: Hashable, turn: int) -> str:
        import text_maze

        return str(text_maze.MazeEnv.name(state))  # type: ignore[arg-type]  # a cell


def maze_task(settings: dict[str, Any]) -> MazeTask:
    """The benchmark's maze (its ``--layout``, ``--max-turns`` and ``--progress``)."""
    import text_maze

    layout = tuple(settings["layout"].split("/")) if settings.get("layout") else text_maze.LAYOUT
    return MazeTask(layout, settings["max_turns"], settings.get("progress", 0.0))


def task(settings: dict[str, Any]) -> Any:
    """The ``CreditTask`` of ``settings["task"]``."""
    from trl_env.testing.credit_tasks import TASKS

    name = settings.get("task", "maze")
    return maze_task(settings) if name == "maze" else TASKS[name]


def target(settings: dict[str, Any]) -> tuple[float, float, float]:
    """(random policy's expected return, best return, the fixed reward level halfway between them)."""
    from trl_env.testing.credit_tasks import Exact

    t = task(settings)
    exact = Exact(t)
    low, best = exact.value(t.start(), 0), exact.best()
    return low, best, low + 0.5 * (best - low)


def quality(settings: dict[str, Any], groups: int) -> list[dict[str, Any]]:
    """``credit_quality`` of every benchmarked variant on the task, groups of the benchmark's size."""
    from trl_env.testing.credit_tasks import credit_quality

    estimators = {label: estimator(label) for label in settings["credits"]}
    return credit_quality(task(settings), estimators, groups=groups, size=settings["generations"])


def run_one(settings: dict[str, Any], label: str, seed: int) -> dict[str, Any]:
    """One training run (a fresh process's worth of state): its per-step curves, labelled."""
    import text_maze

    s = settings
    if s.get("task", "maze") == "maze":
        layout = tuple(s["layout"].split("/")) if s["layout"] else text_maze.LAYOUT
        result = text_maze.train_maze(
            model=s["model"], credit=credit_arg(label), steps=s["steps"], seed=seed, batch=s["batch"],
            num_generations=s["generations"], learning_rate=s["lr"], max_new_tokens=s["tokens"],
            max_turns=s["max_turns"], layout=layout, progress=s["progress"], quiet=True,
        )  # fmt: skip
    else:
        result = train_task(s, credit_arg(label), seed)
    return {**result, "credit": label}


def train_task(s: dict[str, Any], credit: Any, seed: int) -> dict[str, Any]:
    """``train_maze``'s trainer and settings on a ``credit_tasks`` task; ``success``: episodes at the target."""
    import torch
    from datasets import Dataset
    from models import load_model_and_tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from trl_env import ChatMLProcessor, env_reward, make_rollout_func
    from trl_env.testing.credit_tasks import TaskEnv
    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    torch.set_num_threads(1)
    the_task, level = task(s), target(s)[2]
    net, tokenizer = load_model_and_tokenizer(s["model"], AutoModelForCausalLM, AutoTokenizer)
    envs: list[TaskEnv] = []

    def factory() -> TaskEnv:
        envs.append(TaskEnv(the_task))
        return envs[-1]

    func = make_rollout_func(
        factory, ChatMLProcessor(system_prompt="Play the game. Reply with one letter."), credit=credit,
        max_turns=the_task.max_turns, max_new_tokens=s["tokens"], parse_truncated_turns=True, env_workers=1,
    )  # fmt: skip
    success: list[float] = []

    class Successes(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            success.append(sum(e.reward >= level - 1e-9 for e in envs) / max(1, len(envs)))
            envs.clear()

    config = GRPOConfig(
        output_dir=os.path.join("outputs", "bench_credit"), max_steps=s["steps"], per_device_train_batch_size=s["batch"],
        num_generations=s["generations"], max_completion_length=the_task.max_turns * (s["tokens"] + 48),
        learning_rate=s["lr"], temperature=1.0, lr_scheduler_type="constant", beta=0.0, logging_steps=1,
        report_to=[], save_strategy="no", seed=seed, data_seed=seed, use_cpu=True, bf16=False, disable_tqdm=True,
    )  # fmt: skip
    trainer = EpisodeGRPOTrainer(
        model=net, reward_funcs=env_reward, args=config, processing_class=tokenizer, rollout_func=func,
        train_dataset=Dataset.from_dict({"prompt": [f"task-{i}" for i in range(max(64, s["steps"] * s["batch"]))]}),
        callbacks=[Successes()],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    started = time.perf_counter()
    trainer.train()
    logged = [h for h in trainer.state.log_history if h.get("reward") is not None]
    return {
        "seed": seed, "wall_s": time.perf_counter() - started, "rewards": [h["reward"] for h in logged],
        "success": success, "turns": [h.get("env/turns_mean") for h in logged],
        "flip_frac": [h.get("credit/flip_frac") for h in logged],
        "anchor_groups": [h.get("credit/anchor_groups") for h in logged],
        "anchored_turn_frac": [h.get("credit/anchored_turn_frac") for h in logged],
        "advantage_abs_mean": [h.get("credit/advantage_abs_mean") for h in logged],
    }  # fmt: skip
