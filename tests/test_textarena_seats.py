"""TextArena games of two seats (TextArenaGame) played by the policy on both seats, against the real library."""

from __future__ import annotations

import functools
import re

import pytest

pytest.importorskip("textarena")

from tests.helpers import ReplyGenerator, assert_token_exact  # noqa: E402
from trl_env import Budgets, ChatMLProcessor, ConfigError, Ending  # noqa: E402
from trl_env.adapters.textarena_seats import TextArenaGame  # noqa: E402
from trl_env.rollout.seated import play_seats  # noqa: E402
from trl_env.seats import POLICY, Seating  # noqa: E402


def selfplay(game: str) -> Seating:
    return Seating(functools.partial(TextArenaGame, game), (POLICY, POLICY))


def first_listed(pattern: str):
    """Reply with the first move the last observation lists."""
    return lambda prompt: re.findall(pattern, prompt)[-1] + "<|im_end|>"


FIRST_FREE = first_listed(r"Available Moves: '(\[\d\])'")
FIRST_ACTION = first_listed(r"Your available actions are: '(\[\w+\])'")


def play(seeds, game, reply, tokenizer, **options):
    generator = ReplyGenerator(tokenizer, reply)
    options.setdefault("budgets", Budgets(max_turns=12, max_new_tokens=12))
    rollouts = play_seats(seeds, selfplay(game), ChatMLProcessor(), tokenizer, generator, **options)
    assert_token_exact(rollouts, generator.requests, generator.outputs)
    return rollouts


def text_of(rollout, tokenizer) -> str:
    return tokenizer.decode(rollout.rows[0].prompt_ids + rollout.rows[0].completion_ids)  # one row: history=sampled


def test_tictactoe_both_seats_by_the_policy(tokenizer):
    seat0, seat1 = play(["1", "1"], "TicTacToe-v0", FIRST_FREE, tokenizer)
    # first free cell each: O 0, X 1, O 2, X 3, O 4, X 5, O 6 -> O has 2-4-6
    assert (seat0.reward, seat1.reward) == (1.0, -1.0) and seat0.ending is seat1.ending is Ending.ENV_DONE
    assert (len(seat0.turns), len(seat1.turns)) == (4, 3)
    assert "You are Player 0" in text_of(seat0, tokenizer) and "You are Player 1" not in text_of(seat0, tokenizer)
    assert "[Player 0] [0]" in text_of(seat1, tokenizer) and "[Player 0] [0]" not in text_of(seat0, tokenizer)
    assert seat0.info["seat"] == 0 and seat1.info["env"]["invalid_move"] is False


def test_kuhn_poker_seats_see_only_their_own_card(tokenizer):
    seat0, seat1 = play(["3", "3"], "KuhnPoker-v0", FIRST_ACTION, tokenizer)
    assert seat0.ending is seat1.ending is Ending.ENV_DONE and seat0.reward == -seat1.reward
    cards0 = re.findall(r"Your card is: '(\w)'", text_of(seat0, tokenizer))
    cards1 = re.findall(r"Your card is: '(\w)'", text_of(seat1, tokenizer))
    assert cards0 and cards1 and cards0[0] != cards1[0]  # one deck: each seat is told its own card only


def test_simple_negotiation_runs_to_its_turn_limit(tokenizer):
    seat0, seat1 = play(["5", "5"], "SimpleNegotiation-v0", lambda prompt: "[Deny]<|im_end|>", tokenizer)
    assert seat0.ending is seat1.ending is Ending.ENV_DONE
    # TextArena 0.7.4 checks max_turns=10 before counting the move: the game ends on the 11th; nobody traded: a draw
    assert (len(seat0.turns), len(seat1.turns)) == (6, 5) and seat0.reward == seat1.reward == 0.0


def test_invalid_moves_end_the_game_as_textarena_scores_them(tokenizer):
    def reply(prompt: str) -> str:  # seat 0 insists on a cell that does not exist; seat 1 plays well
        return "[9]<|im_end|>" if "You are Player 0" in prompt else FIRST_FREE(prompt)

    seat0, seat1 = play(["1", "1"], "TicTacToe-v0", reply, tokenizer)
    assert seat0.reward == -1.0 and len(seat0.turns) == 2  # one retry, then the loss
    # seat 1 won before its first turn: no model turn, so no reward (trl-env's rule: it would only shift a baseline)
    assert seat1.turns == () and seat1.reward is None and seat1.ending is Ending.ENV_DONE
    assert seat0.info["env"]["invalid_move"] is True and "attempted an invalid move" in seat0.turns[0].delta


def test_concurrent_games_play_exactly_what_each_plays_alone(tokenizer):
    """Kuhn Poker shuffles a new deck each round, from the global random: 16 games at once on 16 threads."""
    seeds = [f"game-{g % 8}" for g in range(16) for _ in range(2)]
    together = play(seeds, "KuhnPoker-v0", FIRST_ACTION, tokenizer, env_workers=16)

    def record(r):
        return [(t.action, t.delta) for t in r.turns], r.reward

    for g in range(8):
        [alone0, alone1] = play(seeds[2 * g : 2 * g + 2], "KuhnPoker-v0", FIRST_ACTION, tokenizer)
        for copy in (g, g + 8):
            assert record(together[2 * copy]) == record(alone0) and record(together[2 * copy + 1]) == record(alone1)


def test_bad_configuration_fails_early():
    with pytest.raises(ConfigError, match="use TextArenaEnv"):
        TextArenaGame("GuessTheNumber-v0", num_players=1)
    with pytest.raises(ConfigError, match="textarena.make failed"):
        TextArenaGame("NoSuchGame-v9")
