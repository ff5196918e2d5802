"""The engine: token-exactness, budgets, endings, fresh envs per episode, scheduling, recorded failures."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import GuessEnv, InfoEnv, ScriptedEnv, ScriptedGenerator, assert_token_exact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_env import (
    Budgets,
    ChatMLProcessor,
    ConfigError,
    Ending,
    EnvError,
    FinishReason,
    ProcessorError,
    batch_rollout,
)
from trl_env.backends.base import Generation, resolved

IM_END = "<|im_end|>"


def vocab_of(tokenizer):
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def scripted(tokenizer, **kwargs):
    return ScriptedGenerator(vocab_of(tokenizer), tokenizer.convert_tokens_to_ids(IM_END), **kwargs)


def seed_of(n, deltas):
    return json.dumps({"n": n, "deltas": deltas})


delta_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=0, max_size=30
) | st.sampled_from([" leading space", "\n\nnewlines\n", "42 + 17 = 59", "日本語 → é", "  ", "higher"])
episode_spec = st.tuples(st.integers(0, 6), st.lists(delta_text, min_size=1, max_size=4))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(episode_spec, min_size=1, max_size=12),
    max_turns=st.integers(1, 7),
    max_new_tokens=st.integers(1, 40),
    max_completion_tokens=st.integers(1, 300),
    max_context=st.none() | st.integers(2, 400),
    p_stop=st.floats(0.0, 1.0),
    parse_truncated_turns=st.booleans(),
    gen_seed=st.integers(0, 10_000),
)
def test_budgets_are_never_exceeded_and_every_request_is_the_trajectory_prefix(
    tokenizer,
    specs,
    max_turns,
    max_new_tokens,
    max_completion_tokens,
    max_context,
    p_stop,
    parse_truncated_turns,
    gen_seed,
):
    budgets = Budgets(max_turns, max_new_tokens, max_completion_tokens, max_context)
    generator = scripted(tokenizer, seed=gen_seed, p_stop=p_stop)
    seeds = [seed_of(n, deltas) for n, deltas in specs]
    rollouts = batch_rollout(
        seeds,
        ScriptedEnv,
        ChatMLProcessor(),
        tokenizer,
        generator,
        budgets=budgets,
        parse_truncated_turns=parse_truncated_turns,
    )
    assert [r.seed for r in rollouts] == seeds
    assert_token_exact(rollouts, generator.requests, generator.outputs)
    for r in rollouts:
        assert isinstance(r.ending, Ending) and r.ending is not Ending.ERROR, r.error
        assert r.terminated + r.truncated == 1
        assert len(r.turns) <= max_turns
        assert len(r.completion_ids) <= max_completion_tokens
        if max_context is not None:
            assert len(r.prompt_ids) + len(r.completion_ids) <= max_context
        for turn in r.turns:
            assert 1 <= turn.num_model_tokens <= max_new_tokens
            if turn.finish_reason is FinishReason.LENGTH and not parse_truncated_turns:
                assert turn.action is None and turn is r.turns[-1] and r.ending is Ending.LENGTH
        if r.ending is Ending.MAX_TURNS:
            assert len(r.turns) == max_turns
    for request in generator.requests:
        assert 1 <= request.max_tokens <= max_new_tokens


def test_each_episode_gets_a_fresh_env_and_a_group_shares_its_problem(tokenizer, guess_env):
    seeds = [s for s in ["3", "7", "1"] for _ in range(4)]  # as TRL passes them: each repeated num_generations
    rollouts = batch_rollout(seeds, guess_env, ChatMLProcessor(), tokenizer, scripted(tokenizer), budgets=Budgets(3, 8))
    assert len(GuessEnv.instances) == len(seeds)
    envs = sorted(GuessEnv.instances, key=lambda e: e.seeds)
    assert all(env.seeds == [seed] for env, seed in zip(envs, sorted(seeds), strict=True))
    for group in range(3):
        members = rollouts[4 * group : 4 * group + 4]
        assert len({tuple(r.prompt_ids) for r in members}) == 1  # same problem text for every copy
        assert {r.seed for r in members} == {seeds[4 * group]}


def test_dead_at_reset_yields_one_masked_placeholder_token_and_no_reward(tokenizer):
    [r] = batch_rollout([seed_of(0, ["over already"])], ScriptedEnv, ChatMLProcessor(), tokenizer, scripted(tokenizer))
    assert r.ending is Ending.ENV_DONE and r.terminated and not r.turns
    assert r.completion_ids == [tokenizer.convert_tokens_to_ids(IM_END)] and r.env_mask == [0] and r.logprobs == [0.0]
    assert r.info == {"dead_at_reset": True, "placeholder": True, "prompt_tokens": 17} and r.reward is None
    assert r.prompt_ids == r.completion_ids  # one stand-in token: fits any model's context


def test_prompt_longer_than_the_context_is_a_truncated_episode_that_fits(tokenizer):
    budgets = Budgets(max_context=10)
    [r] = batch_rollout(
        [seed_of(3, ["word " * 50])], ScriptedEnv, ChatMLProcessor(), tokenizer, scripted(tokenizer), budgets=budgets
    )
    assert r.ending is Ending.LENGTH and r.truncated and r.info["placeholder"] and r.info["prompt_too_long"] > 10
    # A one-token prompt: TRL pads rows to the longest prompt plus the longest completion of the batch.
    assert len(r.prompt_ids) == len(r.completion_ids) == 1 and r.env_mask == [0]


def test_a_delta_that_does_not_fit_ends_the_episode_before_it_is_appended(tokenizer):
    huge = "many tokens " * 40
    generator = scripted(tokenizer, p_stop=1.0)  # every turn is just the stop token
    [r] = batch_rollout(
        [seed_of(5, ["start", huge])],
        ScriptedEnv,
        ChatMLProcessor(),
        tokenizer,
        generator,
        budgets=Budgets(max_completion_tokens=60),
    )
    assert r.ending is Ending.LENGTH and r.info["delta_too_long"] > 60
    assert len(r.turns) == 1 and r.turns[0].num_env_tokens == 0 and r.turns[0].delta == huge
    assert r.completion_ids == [tokenizer.convert_tokens_to_ids(IM_END)]


def test_a_turn_cut_by_the_length_limit_is_not_an_action_unless_asked(tokenizer):
    spec = [seed_of(4, ["go"])]
    generator = scripted(tokenizer, p_stop=0.0)  # never stops by itself
    [r] = batch_rollout(spec, ScriptedEnv, ChatMLProcessor(), tokenizer, generator, budgets=Budgets(max_new_tokens=5))
    assert r.ending is Ending.LENGTH and len(r.turns) == 1 and r.turns[0].action is None and r.turns[0].delta is None

    generator = scripted(tokenizer, p_stop=0.0)
    [r] = batch_rollout(
        spec,
        ScriptedEnv,
        ChatMLProcessor(),
        tokenizer,
        generator,
        budgets=Budgets(max_new_tokens=5),
        parse_truncated_turns=True,
    )
    assert r.ending is Ending.ENV_DONE and len(r.turns) == 4 and all(t.action is not None for t in r.turns)
    # the cut turn is closed by its end-of-turn marker, written as env text before the next user turn
    first_env = r.completion_ids[5 : 5 + r.turns[0].num_env_tokens]
    assert tokenizer.decode(first_env).startswith(IM_END + "\n<|im_start|>user\n")


class Exploding:
    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        if seed == "bad-reset":
            raise KeyError("no such level")
        return self, "hi"

    def step(self, action):
        raise ZeroDivisionError("env bug")


def test_an_env_error_ends_only_its_episode_with_the_reason_recorded(tokenizer):
    seeds = [seed_of(2, ["ok"]), "bad-reset", "boom", seed_of(3, ["fine"])]

    def factory():
        return ScriptedEnv() if seeds_by_call.pop(0).startswith("{") else Exploding()

    seeds_by_call = list(seeds)
    rollouts = batch_rollout(
        seeds, factory, ChatMLProcessor(), tokenizer, scripted(tokenizer, p_stop=1.0), env_workers=1
    )
    assert [r.ending for r in rollouts] == [Ending.ENV_DONE, Ending.ERROR, Ending.ERROR, Ending.ENV_DONE]
    assert "KeyError" in rollouts[1].error and "no such level" in rollouts[1].error
    assert "ZeroDivisionError: env bug" in rollouts[2].error and len(rollouts[2].turns) == 1
    assert rollouts[1].reward is None and rollouts[2].reward is None and rollouts[0].reward is not None


def test_strict_mode_raises_the_first_env_error_with_episode_turn_and_cause(tokenizer):
    with pytest.raises(EnvError) as info:
        batch_rollout(["x"], Exploding, ChatMLProcessor(), tokenizer, scripted(tokenizer), strict=True)
    assert info.value.env_index == 0 and info.value.turn == 0
    assert isinstance(info.value.__cause__, ZeroDivisionError) and "episode 0" in str(info.value)


class WrongReset:
    def __init__(self, result=None, reward=0.0, alive=True):
        self.reward, self.alive, self.result = reward, alive, result

    def reset(self, seed):
        return self.result if self.result is not None else (self, "fine")

    def step(self, action):
        return self, "x"


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (lambda: WrongReset(result="just text"), ["WrongReset.reset", "'just text'", "2-tuple"]),
        (lambda: WrongReset(result=(None, 3)), ["WrongReset.reset", "int", "observation text"]),
        (lambda: WrongReset(reward=math.nan), ["WrongReset.reset", "reward = nan", "finite float"]),
        (lambda: WrongReset(alive="yes"), ["WrongReset.reset", "alive = 'yes'", "bool"]),
    ],
)
def test_wrong_env_return_values_fail_with_class_method_value_and_fix(tokenizer, factory, expected):
    with pytest.raises(EnvError) as info:
        batch_rollout(["s"], factory, ChatMLProcessor(), tokenizer, scripted(tokenizer), strict=True)
    for fragment in expected:
        assert fragment in str(info.value)
    [r] = batch_rollout(["s"], factory, ChatMLProcessor(), tokenizer, scripted(tokenizer))
    assert r.ending is Ending.ERROR and expected[0] in r.error


def test_bad_configuration_fails_at_once_with_the_value_and_the_fix(tokenizer):
    with pytest.raises(ConfigError, match=r"is not callable.*env_factory=MyEnv"):
        batch_rollout(["s"], GuessEnv(), ChatMLProcessor(), tokenizer, scripted(tokenizer))

    class NoParse:
        def init_system_input(self, prompt):
            return prompt

        def append_user_input(self, prompt):
            return prompt

    with pytest.raises(ProcessorError, match="NoParse has no method parse_agent_output"):
        batch_rollout(["s"], GuessEnv, NoParse(), tokenizer, scripted(tokenizer))
    with pytest.raises(ConfigError, match="max_new_tokens=0"):
        Budgets(max_new_tokens=0)
    with pytest.raises(ConfigError, match="splits into"):
        batch_rollout(["s"], GuessEnv, ChatMLProcessor(stop_strings=("not one token",)), tokenizer, scripted(tokenizer))


def test_a_processor_returning_the_wrong_shape_is_recorded_with_a_clear_message(tokenizer):
    class BadParse(ChatMLProcessor):
        def parse_agent_output(self, completion):
            return completion

    [r] = batch_rollout(["3"], GuessEnv, BadParse(), tokenizer, scripted(tokenizer))
    assert r.ending is Ending.ERROR and "BadParse.parse_agent_output returned" in r.error


def test_wave_backend_batches_every_running_episode(tokenizer):
    from helpers import SpyGenerator

    spy = SpyGenerator(scripted(tokenizer, p_stop=1.0))
    seeds = [seed_of(n, ["d"]) for n in (1, 2, 3, 3)]
    batch_rollout(seeds, ScriptedEnv, ChatMLProcessor(), tokenizer, spy)
    assert spy.waves == [4, 3, 2]


class SlowFastGenerator:
    """A continuous backend whose "slow" request finishes only once ``fast_turns`` "fast" ones finished (or 30 s)."""

    continuous = True

    def __init__(self, tokenizer, inner, fast_turns):
        self.tokenizer, self.inner, self.pool = tokenizer, inner, ThreadPoolExecutor(8)
        self.log, self.lock, self.fast_turns = [], threading.Lock(), fast_turns
        self.fast_done, self.waited = threading.Event(), []

    def submit(self, requests):
        def run(request):
            slow = "slow" in self.tokenizer.decode(request.prompt_ids)
            if slow:
                self.waited.append(self.fast_done.wait(30))  # False: the fast turns waited for this one
            with self.lock:
                self.log.append("slow" if slow else "fast")
                if self.log.count("fast") == self.fast_turns:
                    self.fast_done.set()
            return self.inner.sample(request)

        return [self.pool.submit(run, r) for r in requests]


def test_continuous_backend_lets_fast_episodes_finish_while_a_slow_one_generates(tokenizer):
    generator = SlowFastGenerator(tokenizer, scripted(tokenizer, p_stop=1.0), fast_turns=8)
    seeds = [seed_of(1, ["slow"]), seed_of(4, ["fast"]), seed_of(4, ["fast"])]
    rollouts = batch_rollout(seeds, ScriptedEnv, ChatMLProcessor(), tokenizer, generator)
    assert generator.waited == [True]  # the slow turn was in flight until ...
    assert generator.log == ["fast"] * 8 + ["slow"]  # ... both fast episodes ran all 4 turns
    assert [len(r.turns) for r in rollouts] == [1, 4, 4]


class Hanging:
    """Hangs forever in reset or step (per seed) unless released."""

    release = threading.Event()

    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        self.seed = seed
        if seed == "hang-reset":
            Hanging.release.wait()
        return self, "go"

    def step(self, action):
        if self.seed == "hang-step":
            Hanging.release.wait()
        self.alive = False
        return self, "done"


def test_hung_envs_are_abandoned_at_their_timeout_and_the_rollout_returns(tokenizer):
    seeds = ["hang-reset", "ok", "hang-step", "ok"] * 3
    # 6 calls that never return on 2 workers (Hanging.release is never set): the rollout returns at all only because
    # each is abandoned at env_timeout and its worker replaced
    rollouts = batch_rollout(
        seeds, Hanging, ChatMLProcessor(), tokenizer, scripted(tokenizer, p_stop=1.0), env_workers=2, env_timeout=0.3
    )
    for seed, r in zip(seeds, rollouts, strict=False):
        if seed.startswith("hang"):
            assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_timeout" and r.reward is None
            assert f"Hanging.{seed.split('-')[1]} did not return within env_timeout=0.3 s" in r.error
        else:
            assert r.ending is Ending.ENV_DONE
    assert len(rollouts[2].turns) == 1  # the sampled turn before the hung step is kept (masked out in TRL)
    Hanging.release.set()


def test_error_kinds_are_recorded(tokenizer):
    [r] = batch_rollout(["x"], Exploding, ChatMLProcessor(), tokenizer, scripted(tokenizer))
    assert r.info["error_kind"] == "env_exception"
    [r] = batch_rollout(["s"], lambda: WrongReset(result="text"), ChatMLProcessor(), tokenizer, scripted(tokenizer))
    assert r.info["error_kind"] == "env_bad_return"


def test_each_turn_records_its_parse_status_and_the_trainer_logs_the_rates(tokenizer):
    from collections import defaultdict

    from trl_env.train.grpo import log_metrics

    turns = ["<answer>4</answer><|im_end|>", "four<|im_end|>", "<think>hm</think><answer>5<|im_end|>"]

    class Replay:
        continuous = False

        def __init__(self):
            self.k = 0

        def submit(self, requests):
            out = []
            for _ in requests:
                ids, self.k = tokenizer.encode(turns[self.k], add_special_tokens=False), self.k + 1
                out.append(resolved(Generation(ids, [0.0] * len(ids), FinishReason.STOP)))
            return out

    processor = ChatMLProcessor(action_tags=("<answer>", "</answer>"))
    (rollout,) = batch_rollout([seed_of(3, ["go"])], ScriptedEnv, processor, tokenizer, Replay(), strict=True)
    assert [t.parse_status for t in rollout.turns] == ["ok", "no_action_marker", "unclosed_action"]
    assert [t.action for t in rollout.turns] == ["4", "four", "5"]

    class Trainer:
        _metrics = defaultdict(lambda: defaultdict(list))
        accelerator = None

        class model:  # noqa: N801
            training = True

    log_metrics(Trainer, [rollout])
    logged = Trainer._metrics["train"]
    assert logged["env/parse_ok_rate"] == [pytest.approx(1 / 3)]
    assert logged["env/parse_no_action_marker_rate"] == [pytest.approx(1 / 3)]
    assert logged["env/parse_cut_in_reasoning_rate"] == [0.0]


def test_env_side_facts_in_info_reach_the_rollout_json_safe(tokenizer):
    budgets = Budgets(max_turns=4, max_new_tokens=4, max_completion_tokens=64)
    generator = scripted(tokenizer, p_stop=1.0)
    rollouts = batch_rollout(["a", "odd", "broken"], InfoEnv, ChatMLProcessor(), tokenizer, generator, budgets=budgets)
    assert rollouts[0].info["env"] == {"phase": "over", "moves": 2, "won": True}
    assert rollouts[1].ending is Ending.ENV_DONE and rollouts[1].info["env"]["moves"] == 2
    assert rollouts[2].info["error_kind"] == "env_bad_return" and "info must be a dict" in rollouts[2].error
    json.dumps([r.info for r in rollouts])  # transcripts write info as JSON


def test_each_turn_records_the_policy_that_sampled_it(tokenizer):
    """``Generation.policy`` (the model or adapter a server request named) is kept on the turn it sampled."""

    class Named(ScriptedGenerator):
        def sample(self, request):
            generation = super().sample(request)
            return Generation(generation.token_ids, generation.logprobs, generation.finish_reason,
                              policy=f"v{len(self.requests)}")  # fmt: skip

    gen = Named(vocab_of(tokenizer), tokenizer.convert_tokens_to_ids(IM_END), continuous=True)
    [r] = batch_rollout([seed_of(3, ["a"])], ScriptedEnv, ChatMLProcessor(), tokenizer, gen,
                        budgets=Budgets(max_turns=3, max_new_tokens=4), parse_truncated_turns=True)  # fmt: skip
    assert [t.policy for t in r.turns] == ["v0", "v1", "v2"]


def test_each_turn_records_the_state_key_the_env_named_before_it_acted(tokenizer):
    """``env.info["anchor"]`` after reset or a step: the state the next turn acts on (GiGPO's anchor)."""

    class Anchored(InfoEnv):
        def reset(self, seed):
            env, delta = super().reset(seed)
            self.info = {"anchor": "cell 0"} if seed == "a" else {}
            return env, delta

        def step(self, action):
            env, delta = super().step(action)
            self.info = {"anchor": f"cell {self.moves}"} if self.moves == 1 else {"moves": self.moves}
            return env, delta

    budgets = Budgets(max_turns=4, max_new_tokens=4, max_completion_tokens=64)
    rollouts = batch_rollout(["a", "b"], Anchored, ChatMLProcessor(), tokenizer, scripted(tokenizer, p_stop=1.0),
                             budgets=budgets)  # fmt: skip
    assert [t.anchor for t in rollouts[0].turns] == ["cell 0", "cell 1"]
    assert [t.anchor for t in rollouts[1].turns] == [None, "cell 1"]


def test_every_rollout_has_its_training_rows_even_one_built_by_hand():
    """Consumers read ``Rollout.rows`` alone: a one-row episode built by hand (``Rollout.single``) holds its lists as
    its one row, with its turns' spans; a rollout without rows is refused."""
    from trl_env import ConfigError
    from trl_env.rollout.records import Rollout, Row, Span, Turn

    turn = Turn("t", "", "a", "o", 1.0, FinishReason.STOP, 2, 1, 0.0, 0.0)
    by_hand = Rollout.single("s", [1], [5, 6, 7], [-0.5, -0.25, 0.0], [1, 1, 0], (turn,), 1.0, Ending.ENV_DONE)
    assert by_hand.rows == (Row([1], [5, 6, 7], [-0.5, -0.25, 0.0], [1, 1, 0], (Span(0, slice(0, 2), slice(2, 3)),)),)
    assert by_hand.completion_ids is by_hand.rows[0].completion_ids
    rows = (Row.of_turns([1], [5], [0.0], [1], [turn]),)
    assert Rollout("s", rows, (turn,), 1.0, Ending.ENV_DONE).rows == rows
    with pytest.raises(ConfigError, match=r"Rollout\(rows=\(\)\).*Rollout.single"):
        Rollout("s", (), (turn,), 1.0, Ending.ENV_DONE)
