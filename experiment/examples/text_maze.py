"""Turn-level credit: walk a small text maze where early moves decide the episode, with GRPO on a CPU.

Every episode plays the same maze (the seed changes nothing, so a GRPO group is several tries at one
task). Each turn the model answers one move, N, E, S or W, and sees the cell it is in and its exits,
e.g. "Cell (1,0). Exits: E, W." The reply is read leniently: the first of the letters n, e, s, w in it,
in any case, is the move; a reply without one is an invalid move. The observation names only the cell,
so an episode that comes back to a cell, bumps into a wall or wastes a turn sees the same text again,
and so do the episodes of a group that reach that cell; the env also names the cell as
``info["anchor"]``, the state key GiGPO groups turns by (docs/credit.md).

    . S . #      S: start (1,0), G: goal (3,1), #: wall; cells are (column, row). The way is
    . # . G      E, S, E (three moves). West leads to a dead-end column, (0,0) to (0,2): one
    . # # #      step west and back costs two turns, going further down loses the episode.

Reward (``env.reward``, the running total): +1 for reaching the goal (the episode ends), -0.05 per
turn, -0.05 more for an invalid reply; an episode lasts at most ``MAX_TURNS`` = 6 turns. The best
episode scores 0.85. The turn rewards are the differences of the total, so "discounted" credit sees
the step costs and the goal on the turn that earned them, and "gigpo" compares the turns of a group
taken from the same cell. ``--progress P`` adds P per move closer to the goal (P x the drop of the
shortest-path distance; moving away costs as much): per-turn shaping, off by default.

Hardware: a CPU (the tiny model: about 1 s per step on 2 cores, one torch thread; SmolLM2-135M: much slower).
Run:      python experiment/examples/text_maze.py --model tiny --steps 2                  # smoke run, seconds
          python experiment/examples/text_maze.py --credit gigpo    # tiny model, 80 steps, ~1.5 min
          python benchmarks/bench_credit.py   # every credit estimator x 3 seeds, side by side (~16 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

from trl_env import Action, ChatMLProcessor, Delta, Env, Seed

LAYOUT = (
    ".S.#",
    ".#.G",
    ".###",
)
"""Rows from north to south: ``S`` start, ``G`` goal, ``.`` open, ``#`` wall; cells are (column, row)."""
MAX_TURNS = 6
GOAL, STEP_COST, INVALID = 1.0, 0.05, 0.05
MOVES = {"N": (0, -1), "E": (1, 0), "S": (0, 1), "W": (-1, 0)}
SYSTEM_PROMPT = "You are in a maze. Reach the goal. Reply with one move: N, E, S or W."
CREDITS = ("episode", "discounted", "gigpo", "per_turn_index")


def parse_move(reply: str) -> str | None:
    """The first of the letters n, e, s, w in ``reply`` (any case), upper-cased; ``None`` if there is none."""
    for ch in reply.upper():
        if ch in MOVES:
            return ch
    return None


class MazeEnv(Env):
    """A small grid maze; each turn one move. The observation names the cell and its exits, nothing else."""

    def __init__(self, layout: tuple[str, ...] = LAYOUT, max_turns: int = MAX_TURNS, progress: float = 0.0) -> None:
        self.layout, self.max_turns, self.progress = layout, max_turns, progress
        self.open = {(x, y) for y, row in enumerate(layout) for x, c in enumerate(row) if c != "#"}
        self.start = next((x, y) for y, row in enumerate(layout) for x, c in enumerate(row) if c == "S")
        self.goal = next((x, y) for y, row in enumerate(layout) for x, c in enumerate(row) if c == "G")
        self.distance = self._distances()
        if self.start not in self.distance:
            raise ValueError(f"maze {layout}: no path from the start to the goal")
        self.cell, self.turns, self.reward, self.alive = self.start, 0, 0.0, True
        self.path: list[tuple[int, int]] = [self.start]
        self.info: dict[str, Any] = {"anchor": self.name(self.cell)}

    def _distances(self) -> dict[tuple[int, int], int]:
        """Moves from each open cell to the goal (breadth-first search from the goal); unreachable cells absent."""
        distance, frontier, moves = {self.goal: 0}, {self.goal}, 0
        while frontier:
            moves += 1
            frontier = {self.neighbour(c, m) for c in frontier for m in MOVES} - distance.keys()
            distance.update(dict.fromkeys(frontier, moves))
        return distance

    def shortest(self) -> int:
        """The fewest moves from the start to the goal."""
        return self.distance[self.start]

    def neighbour(self, cell: tuple[int, int], move: str) -> tuple[int, int]:
        """Where ``move`` leads from ``cell``: the next cell, or ``cell`` itself when a wall is in the way."""
        dx, dy = MOVES[move]
        after = (cell[0] + dx, cell[1] + dy)
        return after if after in self.open else cell

    def best_reward(self) -> float:
        """The highest episode reward: the goal by the shortest path."""
        return GOAL + (self.progress - STEP_COST) * self.shortest()

    def exits(self, cell: tuple[int, int]) -> list[str]:
        """The moves that leave ``cell`` (in N, E, S, W order)."""
        return [m for m in MOVES if self.neighbour(cell, m) != cell]

    @staticmethod
    def name(cell: tuple[int, int]) -> str:
        """``"(x,y)"``: the cell's name in the observation, and its anchor (``info["anchor"]``)."""
        return f"({cell[0]},{cell[1]})"

    def observation(self) -> str:
        """The text of the current cell: the same whenever any episode stands there."""
        return f"Cell {self.name(self.cell)}. Exits: {', '.join(self.exits(self.cell))}."

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        self.cell, self.turns, self.reward, self.alive = self.start, 0, 0.0, True
        self.path[:] = [self.start]
        self.info = {"anchor": self.name(self.cell)}
        return self, self.observation()

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.turns += 1
        self.reward -= STEP_COST
        move = parse_move(action)
        if move is None:
            self.reward -= INVALID
        else:
            before, self.cell = self.cell, self.neighbour(self.cell, move)  # a wall leaves the cell unchanged
            self.reward += self.progress * (self.distance[before] - self.distance[self.cell])
        self.path.append(self.cell)
        self.info = {"anchor": self.name(self.cell)}
        if self.cell == self.goal:
            self.reward += GOAL
            self.alive = False
            return self, "Goal!"
        self.alive = self.turns < self.max_turns
        return self, self.observation()


def train_maze(
    *,
    model: str = "tiny",
    credit: str = "episode",
    steps: int = 80,
    seed: int = 0,
    out: str | None = None,
    batch: int = 16,
    num_generations: int = 8,
    learning_rate: float | None = None,
    max_new_tokens: int = 3,
    max_turns: int = MAX_TURNS,
    layout: tuple[str, ...] = LAYOUT,
    progress: float = 0.0,
    threads: int = 1,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train ``model`` on the maze with ``EpisodeGRPOTrainer`` and ``credit``; the mean env reward of every step.

    Returns ``rewards`` (one per step), ``success`` (the fraction of episodes that reached the goal, per step),
    ``wall_s`` and the settings. With ``out``, also writes the transcripts (``transcripts_seed{N}.jsonl``).
    """
    import torch
    from datasets import Dataset
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from trl_env import EpisodeGRPOTrainer, env_reward, make_rollout_func

    torch.set_num_threads(threads)
    net, tokenizer = load_model_and_tokenizer(model, AutoModelForCausalLM, AutoTokenizer)
    lr = learning_rate if learning_rate is not None else (3e-3 if model == "tiny" else 3e-5)
    transcripts = None
    if out is not None:
        os.makedirs(out, exist_ok=True)
        transcripts = os.path.join(out, f"transcripts_seed{seed}.jsonl")
        if os.path.exists(transcripts):
            os.remove(transcripts)
    ends: list[list[tuple[int, int]]] = []

    def factory() -> MazeEnv:
        env = MazeEnv(layout, max_turns, progress)
        ends.append(env.path)  # the env appends to it: read after the step
        return env

    func = make_rollout_func(
        factory,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        credit=credit,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        parse_truncated_turns=True,  # a cut reply is still a move: the first letter counts
        transcripts=transcripts,
        env_workers=1,  # the env is instant: no thread pool needed
    )
    success: list[float] = []

    class Successes(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            done = [p for p in ends if p]
            goal = MazeEnv(layout).goal
            success.append(sum(p[-1] == goal for p in done) / max(1, len(done)))
            ends.clear()

    config = GRPOConfig(
        output_dir=out or os.path.join("outputs", "text_maze"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        num_generations=num_generations,
        max_completion_length=max_turns * (max_new_tokens + 24),
        learning_rate=lr,
        temperature=1.0,
        lr_scheduler_type="constant",
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        bf16=False,
        disable_tqdm=quiet,
    )
    trainer = EpisodeGRPOTrainer(
        model=net,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [f"maze-{i}" for i in range(max(64, steps * batch))]}),
        processing_class=tokenizer,
        rollout_func=func,
        callbacks=[Successes()],
    )
    if quiet:
        trainer.remove_callback(PrinterCallback)  # no dict of metrics printed per step
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    logged = [h for h in trainer.state.log_history if h.get("reward") is not None]
    return {
        "credit": credit, "seed": seed, "model": model, "steps": steps, "batch": batch,
        "num_generations": num_generations, "learning_rate": lr, "max_new_tokens": max_new_tokens,
        "max_turns": max_turns, "progress": progress, "wall_s": wall,
        "rewards": [h["reward"] for h in logged], "success": success,
        "entropy": [h.get("entropy") for h in logged], "turns": [h.get("env/turns_mean") for h in logged],
        "flip_frac": [h.get("credit/flip_frac") for h in logged],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (default), 'smollm2', or a path/hub id")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--credit", choices=CREDITS, default="episode", help="the turn-level credit estimator")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default 3e-3 tiny, 3e-5 otherwise)")
    parser.add_argument("--progress", type=float, default=0.0, help="reward per move closer to the goal (shaping)")
    parser.add_argument("--out", default="outputs/text_maze")
    args = parser.parse_args(argv)
    result = train_maze(
        model=args.model, credit=args.credit, steps=args.steps, seed=args.seed, out=args.out, learning_rate=args.lr,
        progress=args.progress,
    )  # fmt: skip
    rewards, k = result["rewards"], max(1, len(result["rewards"]) // 4)
    result["first_mean"], result["last_mean"] = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"[text_maze] credit={args.credit} reward per step: {[round(r, 3) for r in rewards]}")
    print(f"[text_maze] success per step: {[round(s, 2) for s in result['success']]}")
    print(
        f"[text_maze] first {k} steps {result['first_mean']:.3f} -> last {k} steps {result['last_mean']:.3f} "
        f"in {result['wall_s']:.0f} s"
    )
    with open(os.path.join(args.out, f"rewards_{args.credit}_seed{args.seed}.json"), "w") as f:
        json.dump(result, f)
    from training import plot  # experiment/training.py: the shared reward-curve PNG

    plot(rewards, os.path.join(args.out, f"reward_{args.credit}_seed{args.seed}.png"),
         title=f"text_maze: GRPO, credit={args.credit}, seed {args.seed}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
