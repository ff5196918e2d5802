"""Every env is closed however its episode ended (a failed or timed-out ``reset`` too), once, on a worker thread; a
worker process is given back or killed whatever its env did; an agent's session ends with its episode (issue 46)."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
from helpers import ScriptedGenerator

from trl_env import Budgets, ChatMLProcessor, Ending, batch_rollout
from trl_env.rollout.isolation import isolated

BUDGETS = Budgets(max_turns=2, max_new_tokens=4, max_completion_tokens=40)
RELEASE = threading.Event()  # set at the end of the module: every test hang returns


@pytest.fixture(scope="module", autouse=True)
def _release_hangs():
    yield
    RELEASE.set()


def run(tokenizer, factory, seeds, **kwargs):
    generator = ScriptedGenerator(range(100, 200), tokenizer.convert_tokens_to_ids("<|im_end|>"), p_stop=1.0)
    return batch_rollout(seeds, factory, ChatMLProcessor(), tokenizer, generator, budgets=BUDGETS, **kwargs)


class Recorded:
    """An env that fails its ``reset`` as its seed says and records every ``close`` (and its thread)."""

    closes: list[tuple[str, str]] = []

    def __init__(self) -> None:
        self.reward, self.alive, self.seed = 0.0, True, ""

    def reset(self, seed):
        self.seed = seed
        if seed == "raise":
            raise RuntimeError("reset failed")
        if seed == "hang":
            RELEASE.wait(60)
        if seed == "bad":
            return self, 42  # not text: env_bad_return
        return self, "hello"

    def step(self, action):
        self.alive = False
        return self, "done"

    def close(self):
        Recorded.closes.append((self.seed, threading.current_thread().name))


def test_an_env_whose_reset_raised_hung_or_returned_garbage_is_closed_once_on_a_worker_thread(tokenizer):
    Recorded.closes.clear()
    rollouts = run(tokenizer, Recorded, ["raise", "hang", "bad", "ok"], env_timeout=0.5)
    assert [r.info.get("error_kind") for r in rollouts] == ["env_exception", "env_timeout", "env_bad_return", None]
    assert sorted(seed for seed, _ in Recorded.closes) == ["bad", "hang", "ok", "raise"]  # each once
    assert all(name.startswith("trl-env-worker") for _, name in Recorded.closes), Recorded.closes


class SlowFactory:
    """A factory that builds its env after ``env_timeout``: the abandoned open closes the env it built."""

    def __call__(self):
        time.sleep(1.0)
        return Recorded()


def test_an_env_built_after_its_open_was_abandoned_is_closed_by_the_late_call(tokenizer):
    Recorded.closes.clear()
    (rollout,) = run(tokenizer, SlowFactory(), ["late"], env_timeout=0.3)
    assert rollout.info["error_kind"] == "env_timeout"
    deadline = time.monotonic() + 10
    while not Recorded.closes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [seed for seed, _ in Recorded.closes] == [""]  # closed before any reset, and only once


# -- worker processes -------------------------------------------------------------------------------------------


class Failing:
    """In a worker process: reset raises or hangs, or close hangs, as the seed says; reports its pid."""

    def __init__(self) -> None:
        self.reward, self.alive, self.seed = 0.0, True, ""

    def reset(self, seed):
        self.seed = seed
        self.info = {"pid": os.getpid()}
        if seed == "raise_reset":
            raise RuntimeError("reset failed")
        if seed == "hang_reset":
            time.sleep(3600)
        return self, "hello"

    def step(self, action):
        self.alive = False
        return self, "done"

    def close(self):
        if self.seed == "close_hang":
            time.sleep(3600)


def children():
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def started(factory, tokenizer):
    """``factory`` with its zygote started (seconds on a loaded machine: not to be timed by a short env_timeout)."""
    run(tokenizer, factory, ["ok"], env_timeout=120)
    return factory


def test_a_hung_close_in_a_worker_process_kills_that_worker(tokenizer):
    factory = started(isolated(Failing, pool_size=4), tokenizer)
    (rollout,) = run(tokenizer, factory, ["close_hang"], env_timeout=5)
    pid = rollout.info["env"]["pid"]
    assert "close did not return" in rollout.info["close_error"]
    assert pid not in children()  # killed (and reaped) by the time batch_rollout returns


@pytest.mark.parametrize("seed", ["raise_reset", "hang_reset"])
def test_a_failed_or_timed_out_reset_in_a_worker_process_gives_the_worker_back_or_kills_it(tokenizer, seed):
    factory = started(isolated(Failing, pool_size=1), tokenizer)
    counts = []
    for _ in range(3):
        rollouts = run(tokenizer, factory, [seed, seed, "ok"], env_timeout=5)
        assert [r.ending for r in rollouts] == [Ending.ERROR, Ending.ERROR, Ending.ENV_DONE]
        counts.append(len(children()))
    assert counts[0] == counts[1] == counts[2], counts  # the zygote and its one pooled worker, every time


# -- agent programs -----------------------------------------------------------------------------------------------


def test_an_agent_slow_before_its_first_call_has_its_session_ended_with_its_episode(tokenizer):
    """The issue's minimal case: env_timeout 0.5 s, a program that sleeps 2 s, then makes one call."""
    openai = pytest.importorskip("openai")
    from agents_support import PromptReplyGenerator

    from trl_env.agents import agent_env_factory
    from trl_env.agents.gateway import Gateway
    from trl_env.render.processors import from_tokenizer

    gateway, seen, done, before = Gateway(), {}, threading.Event(), set(threading.enumerate())

    def program(run):
        seen["key"] = run.api_key
        time.sleep(2)
        try:
            run.openai(max_retries=0, timeout=30).chat.completions.create(model=run.model, messages=[
                {"role": "user", "content": "hi"}])  # fmt: skip
        except openai.APIError as e:
            seen["late"] = e
        finally:
            done.set()
        return 1.0

    try:
        generator = PromptReplyGenerator(tokenizer, lambda k, prompt: "0<|im_end|>")
        (rollout,) = batch_rollout(["s"], agent_env_factory(program, gateway=gateway), from_tokenizer(tokenizer),
                                   tokenizer, generator, history="deployed", env_timeout=0.5)  # fmt: skip
        assert rollout.info["error_kind"] == "env_timeout"
        assert gateway.open_sessions() == 0  # its key stops authenticating as its episode ends
        with pytest.raises(Exception, match="episode_ended|this episode has ended"):
            gateway.accept(f"Bearer {seen['key']}", b"{}")
        assert done.wait(20)  # the late call is answered at once, not after the client's 30 s read timeout
        assert isinstance(seen["late"], openai.ConflictError) and "ended" in str(seen["late"])
        deadline = time.monotonic() + 10  # the engine's abandoned worker is released from Session.next
        while _engine_threads(before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _engine_threads(before)
    finally:
        gateway.shutdown()


def test_an_agent_that_never_calls_releases_the_engines_worker(tokenizer):
    pytest.importorskip("openai")
    from agents_support import PromptReplyGenerator

    from trl_env.agents import agent_env_factory
    from trl_env.agents.gateway import Gateway
    from trl_env.render.processors import from_tokenizer

    gateway, before = Gateway(), set(threading.enumerate())
    try:
        generator = PromptReplyGenerator(tokenizer, lambda k, prompt: "0<|im_end|>")
        (rollout,) = batch_rollout(["s"], agent_env_factory(lambda run: RELEASE.wait(60), gateway=gateway),
                                   from_tokenizer(tokenizer), tokenizer, generator, history="deployed",
                                   env_timeout=0.5)  # fmt: skip
        assert rollout.info["error_kind"] == "env_timeout" and gateway.open_sessions() == 0
        deadline = time.monotonic() + 10
        while _engine_threads(before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _engine_threads(before)  # before: blocked in Session.next until the program ended
    finally:
        gateway.shutdown()


def _engine_threads(before):
    return [t for t in set(threading.enumerate()) - before if t.name.startswith("trl-env-worker") and t.is_alive()]
