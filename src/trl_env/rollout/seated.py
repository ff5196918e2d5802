"""``play_seats``: games of several seats as seat episodes of one ``batch_rollout`` (docs/selfplay.md).

Every seat the policy plays is an episode of the one engine (``batch_rollout``), with its own conversation and rows;
the seat episodes of a game share a ``trl_env.rollout.match.Match``. This module builds the matches, runs the engine
and applies the game rules afterwards: every seat's rollout says its game and seat, and a game in which one seat's
episode failed is failed for every seat (out of every statistic), with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trl_env.backends.base import as_generator
from trl_env.env import Seed
from trl_env.errors import ConfigError
from trl_env.rollout.engine import batch_rollout
from trl_env.rollout.match import Match, SeatEnv
from trl_env.rollout.records import Ending, Rollout
from trl_env.seats import Frozen, Seating

__all__ = ["check_executor", "play_seats", "seat_counts", "seat_rates"]


def play_seats(
    seeds: Sequence[Seed | BaseException],
    seating: Seating,
    processor: Any,
    tokenizer: Any,
    generator: Any,
    *,
    on_episode_end: Callable[[int], None] | None = None,
    **options: Any,
) -> list[Rollout]:
    """Play one game per ``len(seating.policy_seats)`` consecutive seeds; return one rollout per seed, in order.

    Seeds ``k*i .. k*i + k - 1`` (``k`` policy seats) are game ``i``, played from their seed (they must be equal:
    TRL's ``num_generations`` copies of a prompt, ``num_generations`` a multiple of ``k``); seed ``k*i + j`` is the
    episode of policy seat ``seating.policy_seats[j]``. Each rollout's ``info`` holds ``"seat"`` and ``"game"`` (the
    game's index in this call). A ``Frozen`` seat is an episode of a second engine, run beside this one with its own
    generator (inside its ``session()``) and the same options; its rollout is dropped. Options are ``batch_rollout``'s.

    Raises:
        ConfigError: for a seed count that is not a multiple of ``k``, or a game whose seeds differ.
    """
    seats = seating.policy_seats
    k = len(seats)
    if len(seeds) % k:
        raise ConfigError(
            f"{len(seeds)} seeds for games of {k} policy seats: give a multiple of {k} (with GRPO, make "
            f"num_generations a multiple of {k}: each game takes {k} copies of its prompt)."
        )
    games = [list(seeds[g : g + k]) for g in range(0, len(seeds), k)]
    for g, copies in enumerate(games):
        texts = {str(s) for s in copies if not isinstance(s, BaseException)}
        if len(texts) > 1:
            raise ConfigError(
                f"game {g} got the seeds {sorted(texts)!r:.120}: the {k} seat episodes of a game play one seed; with "
                f"GRPO make num_generations a multiple of {k} so each game gets copies of one prompt."
            )
    matches = [Match(seating, next((str(s) for s in c if not isinstance(s, BaseException)), "")) for c in games]

    def table(key: str) -> tuple[Match, int]:
        index = int(key)
        return matches[index // k], seats[index % k]

    def ended(index: int) -> None:
        matches[index // k].leave(seats[index % k])
        if on_episode_end is not None:
            on_episode_end(index)

    keys: list[Seed | BaseException] = [s if isinstance(s, BaseException) else str(i) for i, s in enumerate(seeds)]
    # A game whose prompt failed fails its frozen seats too (the same exception as their seed).
    game_keys = [next((s for s in c if isinstance(s, BaseException)), str(g)) for g, c in enumerate(games)]
    frozen = [
        _FrozenSeat(seat, seating.players[seat], matches, game_keys, (processor, tokenizer), options)
        for seat in seating.frozen_seats
    ]
    with contextlib.ExitStack() as stack:
        for seat in frozen:
            stack.enter_context(seat.generator.session())  # e.g. LoraSnapshots refuses before its first snapshot
        try:
            for seat in frozen:
                seat.thread.start()
            env = functools.partial(SeatEnv, table)
            rollouts = batch_rollout(keys, env, processor, tokenizer, generator, on_episode_end=ended, **options)
        finally:  # strict mode raised: wake every seat still waiting for its turn
            for match in matches:
                match.leave(-1)
            for seat in frozen:
                seat.thread.join()
    frozen_by_game = [[(seat.seat, seat.rollout(g)) for seat in frozen] for g in range(len(matches))]
    return [
        r
        for g, match in enumerate(matches)
        for r in _settle(rollouts[g * k : g * k + k], match, seats, g, frozen_by_game[g])
    ]


class _FrozenSeat:
    """One ``Frozen`` seat of every game: its episodes run by a ``batch_rollout`` of their own, on a thread."""

    def __init__(
        self,
        seat: int,
        player: object,
        matches: list[Match],
        keys: list[Seed | BaseException],
        model: tuple[Any, Any],
        options: dict[str, Any],
    ) -> None:
        assert isinstance(player, Frozen), "Seating.frozen_seats lists Frozen players"
        self.seat, self.matches, self.generator = seat, matches, as_generator(player.generator)
        self._rollouts: list[Rollout] | BaseException = []
        processor, tokenizer = model
        env = functools.partial(SeatEnv, lambda key: (matches[int(key)], seat))

        def run() -> None:
            try:
                self._rollouts = batch_rollout(
                    keys, env, processor, tokenizer, self.generator, on_episode_end=self._ended, **options
                )
            except BaseException as e:  # noqa: BLE001  # strict mode: re-raised by rollout() on the caller's thread
                self._rollouts = e
                for match in matches:
                    match.leave(seat)

        self.thread = threading.Thread(target=run, name=f"trl-env-frozen-seat-{seat}", daemon=True)

    def _ended(self, game: int) -> None:
        self.matches[game].leave(self.seat)

    def rollout(self, game: int) -> Rollout:
        """The seat's rollout in ``game``; re-raises what its engine raised (``strict``)."""
        if isinstance(self._rollouts, BaseException):
            raise self._rollouts
        return self._rollouts[game]


def check_executor(env_factory: object, env_executor: str) -> None:
    """Refuse ``env_executor="process"`` for a ``Seating``: a game's seats share one game object in one process.

    Raises:
        ConfigError: naming the fix.
    """
    if isinstance(env_factory, Seating) and env_executor == "process":
        raise ConfigError(
            "env_executor='process' with a Seating: a game's seats share one game object; use "
            "env_executor='thread' (the default), or isolate what your SeatedEnv calls."
        )


def _settle(
    rollouts: list[Rollout], match: Match, seats: Sequence[int], game: int, frozen: Sequence[tuple[int, Rollout]]
) -> list[Rollout]:
    """The policy seat rollouts of one game, the game's rules applied to every seat alike.

    Each records its seed, seat and game, and its return in the game (``info["seat_reward"]``, also for a seat that
    never moved). One seat's episode failed: every seat failed, each saying which (``info["seat_failed"]``). One was
    cut (``max_turns``, a token budget): the game is unfinished, so every seat that the game's end left ``env_done``
    is truncated with it (the cut seat's ending), as its reward (``truncated_reward``) already says.
    ``frozen``: the game's frozen seats and their rollouts, which count for these rules only.
    """
    played = [*zip(seats, rollouts, strict=True), *frozen]
    failed = next(((s, r) for s, r in played if r.ending is Ending.ERROR), None)
    cut = next((r.ending for _, r in played if r.truncated), None) if match.reason else None  # ended unfinished
    out = []
    for seat, r in zip(seats, rollouts, strict=True):
        info = {**r.info, "seat": seat, "game": game}
        r = dataclasses.replace(r, seed=match.seed, info=info)
        if failed is None:
            info["seat_reward"] = match.rewards[seat]  # the game's return (truncated_reward for a cut game)
            if cut is not None and r.ending is Ending.ENV_DONE:
                r = dataclasses.replace(r, ending=cut)
        elif r.ending is Ending.ERROR:
            info["seat_failed"] = seat  # its own episode failed (the first such seat fails the others)
        else:
            culprit, cause = failed
            first = cause.error.split("\n", 1)[0]
            info.update(seat_failed=culprit, error_kind=cause.info.get("error_kind", "env_exception"))
            r = dataclasses.replace(
                r, ending=Ending.ERROR, reward=None, error=f"seat {culprit} of this game failed: {first}"
            )
        out.append(r)
    return out


_COUNTED = ("episodes", "errors", "scored", "reward", "win", "draw", "loss", "turns", "model_tokens", "invalid_move")


def seat_counts(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per seat (``Rollout.info["seat"]``), the sums ``seat_rates`` turns into rates: ``"seat{s}/{name}"``.

    ``scored`` episodes are the games the seat was in that did not fail, whether or not it moved; their return is
    ``info["seat_reward"]`` (``play_seats`` records it; else the rollout's reward). A win is a positive return, a loss
    a negative one, a draw 0 (TextArena's 1 / -1 / 0). ``invalid_move`` counts the episodes whose env info says
    ``invalid_move`` is ``True`` (``Rollout.info["env"]``: the game's ``info``, with its ``"seats"`` entry for this
    seat). Rollouts without a seat are left out. Sums (not rates) so that processes can add them up first.
    """
    counts: dict[str, float] = {}
    for r in rollouts:
        seat = r.info.get("seat")
        if not isinstance(seat, int):
            continue
        facts = r.info.get("env")
        env = facts if isinstance(facts, dict) else {}
        failed = r.ending is Ending.ERROR
        reward = None if failed else r.info.get("seat_reward", r.reward)
        values = {
            "episodes": 1.0,
            "errors": float(failed),
            "scored": float(reward is not None),
            "reward": reward or 0.0,
            "win": float(reward is not None and reward > 0),
            "draw": float(reward == 0.0),
            "loss": float(reward is not None and reward < 0),
            "turns": 0.0 if failed else float(len(r.turns)),
            "model_tokens": 0.0 if failed else float(sum(sum(row.env_mask) for row in r.rows)),
            "invalid_move": float(not failed and env.get("invalid_move") is True),
        }
        for name in _COUNTED:
            counts[f"seat{seat}/{name}"] = counts.get(f"seat{seat}/{name}", 0.0) + values[name]
    return counts


def seat_rates(counts: dict[str, float]) -> dict[str, float]:
    """``seat_counts``' sums as per-seat statistics, ``seat{s}/<name>``.

    ``reward_mean``, ``win_rate``, ``draw_rate`` and ``loss_rate`` are over the seat's scored episodes (``scored``:
    how many); ``turns_mean``, ``model_tokens_mean`` and ``invalid_move_rate`` over those that did not fail;
    ``error_rate`` over all.
    """
    out: dict[str, float] = {}
    for seat in sorted({key.split("/")[0] for key in counts}):
        c = {name: counts.get(f"{seat}/{name}", 0.0) for name in _COUNTED}
        scored, ok = max(c["scored"], 1.0), max(c["episodes"] - c["errors"], 1.0)
        out[f"{seat}/scored"] = c["scored"]
        out[f"{seat}/reward_mean"] = c["reward"] / scored
        for name in ("win", "draw", "loss"):
            out[f"{seat}/{name}_rate"] = c[name] / scored
        out[f"{seat}/turns_mean"] = c["turns"] / ok
        out[f"{seat}/model_tokens_mean"] = c["model_tokens"] / ok
        out[f"{seat}/invalid_move_rate"] = c["invalid_move"] / ok
        out[f"{seat}/error_rate"] = c["errors"] / max(c["episodes"], 1.0)
    return out
