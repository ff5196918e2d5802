"""Small text tasks built so that turn-level credit matters, each with its exact per-turn advantages.

A ``CreditTask`` is a deterministic finite-horizon decision process over hashable states, small enough for dynamic
programming: the model picks one of ``moves`` (single letters) per turn, the first of them in its reply, in any case
(``None``, an invalid reply, when there is none). ``TaskEnv`` plays one as a trl-env ``Env``
(``info["anchor"]`` names the state, for GiGPO); ``Exact`` gives ``Q(s, t, a) - V(s, t)`` under a fixed policy over
the moves (uniform over the moves and an invalid reply by default); ``credit_quality`` samples groups from that
policy and compares each estimator's per-turn advantages with the exact ones (docs/credit.md, "Tasks where credit
should matter"; ``benchmarks/bench_credit.py --task NAME`` trains on them).

- ``Rounds`` (``"rounds"``): independent decisions, each rewarded on its own turn (+1 for the round's letter).
- ``Ring`` (``"loop"``): a ring of nodes walked for 12 turns, +1 at each visit of the goal (then back to the start):
  states recur within and across episodes, so GiGPO's anchor groups form often.
- ``EarlyDecision`` (``"early"``): turn 0 decides the outcome, paid on the last turn; the turns between do not
  matter (discounting with ``gamma < 1`` shrinks the deciding turn's share).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trl_env.env import Action, Delta, Env, Seed

__all__ = [
    "TASKS",
    "CreditTask",
    "EarlyDecision",
    "Exact",
    "Rounds",
    "Ring",
    "TaskEnv",
    "credit_quality",
    "parse_move",
    "sample_group",
    "uniform",
]

Move = str | None
"""One of a task's ``moves``, or ``None`` for an invalid reply."""
Policy = Mapping[Move, float]
"""A fixed policy: the probability of each move (and of ``None``), the same in every state."""


class CreditTask(Protocol):
    """A deterministic task over hashable states; an episode ends when ``step`` says so or after ``max_turns``."""

    @property
    def moves(self) -> tuple[str, ...]:
        """The moves, single capital letters."""
        ...

    @property
    def max_turns(self) -> int:
        """The most turns an episode lasts."""
        ...

    def start(self) -> Hashable:
        """The first state."""
        ...

    def step(self, state: Hashable, turn: int, move: Move) -> tuple[float, Hashable, bool]:
        """Turn ``turn``'s ``move`` in ``state``: its reward, the next state, and whether the episode is over."""
        ...

    def observation(self, state: Hashable, turn: int) -> str:
        """The text the model sees before acting in ``state`` at turn ``turn``."""
        ...

    def anchor(self, state: Hashable, turn: int) -> str:
        """The key GiGPO groups turns by: the same for turns that act on the same state."""
        ...


def parse_move(task: CreditTask, reply: str) -> Move:
    """The first of ``task.moves`` (single letters) in ``reply``, in any case; ``None`` when there is none."""
    return next((ch for ch in reply.upper() if ch in task.moves), None)


def uniform(task: CreditTask) -> dict[Move, float]:
    """Each move, and an invalid reply, with the same probability."""
    options: list[Move] = [*task.moves, None]
    return dict.fromkeys(options, 1.0 / len(options))


@dataclass(frozen=True)
class Rounds:
    """``rounds`` independent rounds; round t pays +1 for the letter ``key[t]``, 0 for the other or no letter."""

    key: str = "ABBABAAB"
    moves: tuple[str, ...] = ("A", "B")

    @property
    def max_turns(self) -> int:
        """One turn per round."""
        return len(self.key)

    def start(self) -> Hashable:
        """See ``CreditTask.start``."""
        return 0

    def step(self, state: Hashable, turn: int, move: Move) -> tuple[float, Hashable, bool]:
        """See ``CreditTask.step``."""
        return float(move == self.key[turn]), turn + 1, turn + 1 >= len(self.key)

    def observation(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.observation``."""
        return f"Round {turn + 1} of {len(self.key)}. Reply A or B."

    def anchor(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.anchor``."""
        return f"round {turn}"


@dataclass(frozen=True)
class Ring:
    """A ring of ``nodes`` nodes, ``max_turns`` turns: R steps +1, L steps -1, no letter stays.

    Reaching ``goal`` pays +1 and puts the walker back on node 0; the observation names the node only.
    """

    nodes: int = 6
    goal: int = 2
    max_turns: int = 12
    moves: tuple[str, ...] = ("L", "R")

    def start(self) -> Hashable:
        """See ``CreditTask.start``."""
        return 0

    def step(self, state: Hashable, turn: int, move: Move) -> tuple[float, Hashable, bool]:
        """See ``CreditTask.step``."""
        assert isinstance(state, int)
        node = (state + {"R": 1, "L": -1, None: 0}[move]) % self.nodes
        return (1.0, 0, False) if node == self.goal else (0.0, node, False)

    def observation(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.observation``."""
        return f"Node {state} of a ring of {self.nodes}; the goal is node {self.goal}. Reply L or R."

    def anchor(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.anchor``."""
        return f"node {state}"


@dataclass(frozen=True)
class EarlyDecision:
    """Turn 0: A commits to a win, B (or no letter) to a loss; ``max_turns - 1`` turns that change nothing follow.

    The outcome, +1 or 0, is paid on the last turn. The later observations are the same whatever was decided.
    """

    max_turns: int = 10
    moves: tuple[str, ...] = ("A", "B")

    def start(self) -> Hashable:
        """See ``CreditTask.start``."""
        return "undecided"

    def step(self, state: Hashable, turn: int, move: Move) -> tuple[float, Hashable, bool]:
        """See ``CreditTask.step``."""
        if turn == 0:
            state = "win" if move == "A" else "loss"
        last = turn + 1 >= self.max_turns
        return float(last and state == "win"), state, last

    def observation(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.observation``."""
        if turn == 0:
            return "Choose A or B. The result comes at the end."
        return f"Turn {turn + 1} of {self.max_turns}. Reply anything."

    def anchor(self, state: Hashable, turn: int) -> str:
        """See ``CreditTask.anchor``."""
        return self.observation(state, turn)


TASKS: dict[str, CreditTask] = {"rounds": Rounds(), "loop": Ring(), "early": EarlyDecision()}
"""The benchmark's tasks by ``--task`` name (the maze lives in ``experiment/examples/text_maze.py``)."""


class TaskEnv(Env):
    """A ``CreditTask`` as a trl-env ``Env``: ``reward`` the running total, ``info["anchor"]`` the state's key."""

    def __init__(self, task: CreditTask) -> None:
        self.task = task
        self.state, self.turn, self.reward, self.alive = task.start(), 0, 0.0, True
        self.info: dict[str, Any] = {"anchor": task.anchor(self.state, 0)}

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """The task's first state (the seed changes nothing: a GRPO group plays one task)."""
        self.state, self.turn, self.reward, self.alive = self.task.start(), 0, 0.0, True
        self.info = {"anchor": self.task.anchor(self.state, 0)}
        return self, self.task.observation(self.state, 0)

    def step(self, action: Action) -> tuple[Env, Delta]:
        """The reply's move (``parse_move``) applied to the task."""
        reward, self.state, done = self.task.step(self.state, self.turn, parse_move(self.task, action))
        self.reward += reward
        self.turn += 1
        self.alive = not done and self.turn < self.task.max_turns
        self.info = {"anchor": self.task.anchor(self.state, self.turn)}
        return self, self.task.observation(self.state, self.turn) if self.alive else "Done."


class Exact:
    """Exact values of a task under a fixed policy, by dynamic programming over (state, turn)."""

    def __init__(self, task: CreditTask, policy: Policy | None = None) -> None:
        self.task, self.policy = task, dict(policy if policy is not None else uniform(task))
        self.value = functools.cache(self._value)
        self.q_value = functools.cache(self._q_value)

    def _value(self, state: Hashable, turn: int) -> float:
        """``V(state, turn)``: the expected return from here on."""
        return math.fsum(p * self.q_value(state, turn, m) for m, p in self.policy.items())

    def _q_value(self, state: Hashable, turn: int, move: Move) -> float:
        """``Q(state, turn, move)``: the move's reward plus the expected return after it."""
        reward, after, done = self.task.step(state, turn, move)
        alive = not done and turn + 1 < self.task.max_turns
        return reward + (self.value(after, turn + 1) if alive else 0.0)

    def advantage(self, state: Hashable, turn: int, move: Move) -> float:
        """``Q - V``: how much better the move is than the policy's average in this state."""
        return self.q_value(state, turn, move) - self.value(state, turn)

    def best(self) -> float:
        """The highest return an episode can reach (any policy)."""

        @functools.cache
        def best_from(state: Hashable, turn: int) -> float:
            outcomes = (self.task.step(state, turn, m) for m in [*self.task.moves, None])
            alive = turn + 1 < self.task.max_turns
            return max(r + (best_from(s, turn + 1) if alive and not d else 0.0) for r, s, d in outcomes)

        return best_from(self.task.start(), 0)


def sample_group(exact: Exact, size: int, rng: random.Random) -> tuple[list[Any], list[list[float]]]:
    """``size`` episodes from ``exact``'s policy: their ``EpisodeCredit`` and each turn's exact advantage."""
    from trl_env.train.credit import EpisodeCredit

    task, moves = exact.task, list(exact.policy)
    weights = [exact.policy[m] for m in moves]
    group, advantages = [], []
    for _ in range(size):
        state, rewards, anchors, exact_t = task.start(), [], [], []
        for turn in range(task.max_turns):
            move = rng.choices(moves, weights)[0]
            exact_t.append(exact.advantage(state, turn, move))
            anchors.append(task.anchor(state, turn))
            reward, state, done = task.step(state, turn, move)
            rewards.append(reward)
            if done:
                break
        group.append(EpisodeCredit(turn_rewards=rewards, anchors=anchors))
        advantages.append(exact_t)
    return group, advantages


def credit_quality(
    task: CreditTask, estimators: Mapping[str, Any], *, groups: int = 400, size: int = 8, seed: int = 0
) -> list[dict[str, Any]]:
    """Per estimator: its per-turn advantages against the exact ones over ``groups`` sampled groups.

    ``correlation`` (Pearson, over all turns), ``sign_agreement`` (over the turns whose exact advantage is not 0),
    and the GiGPO anchor statistics of the sampled groups (``credit_metrics``'s ``anchor_groups`` per group and
    ``anchored_turn_frac``). The same groups go to every estimator; no model, seconds.
    """
    from trl_env.train.credit import credit_metrics

    exact, rng = Exact(task), random.Random(seed)
    sampled = [sample_group(exact, size, rng) for _ in range(groups)]
    truth = [x for _, adv in sampled for episode in adv for x in episode]
    nonzero = [i for i, x in enumerate(truth) if abs(x) > 1e-12]
    out = []
    for name, estimator in estimators.items():
        computed = [estimator(group) for group, _ in sampled]
        got = [x for advs in computed for a in advs for x in a]
        metrics = credit_metrics([g for g, _ in sampled], computed)
        out.append(
            dict(
                credit=name,
                correlation=_correlation(got, truth),
                turns=len(truth),
                groups=groups,
                sign_agreement=sum((got[i] > 0) == (truth[i] > 0) for i in nonzero) / max(1, len(nonzero)),
                anchor_groups=metrics["credit/anchor_groups"],
                anchored_turn_frac=metrics["credit/anchored_turn_frac"],
            )
        )
    return out


def _correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's correlation; 0 when either side is constant."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return 0.0
