"""OpenEnvAdapter against REAL OpenEnv servers (experiment/examples/openenv_echo_server.py under uvicorn on 127.0.0.1).

Two servers boot in parallel once per module: "main" (rollouts; rewards checked against its own JSONL log) and
"victim" (tests/openenv_fault_server.py, OpenEnv's own server routes with faults switched on per test; SIGSTOPped
mid-run and continued, then SIGKILLed mid-run; rebooted if a test finds it dead). Each is stopped by its PID at the end.
Skipped when OpenEnv is not installed (`pip install 'trl-env[openenv]'`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="OpenEnv is not installed: pip install 'trl-env[openenv]'")

from helpers import SpyGenerator, assert_token_exact  # noqa: E402

from trl_env import Budgets, ChatMLProcessor, ConfigError, Ending, EnvError, TransformersGenerator, batch_rollout  # noqa: E402
from trl_env.adapters import openenv_schema  # noqa: E402
from trl_env.adapters.openenv import OpenEnvAdapter, observation_to_text, seed_to_reset_kwargs  # noqa: E402

EXAMPLES = Path(__file__).parent.parent / "experiment" / "examples"
sys.path.insert(0, str(EXAMPLES))
import openenv_echo  # noqa: E402  # the examples folder is not a package; this module does not import OpenEnv

WORDS_PER_EPISODE = 3  # openenv_echo_server.WORDS_PER_EPISODE (not imported: that module loads OpenEnv at import)
SESSIONS = 8  # each server's max_concurrent_envs
FAULT_SERVER = Path(__file__).parent / "openenv_fault_server.py"
FAULT_STEPS = 2  # openenv_fault_server.STEPS
FAULTS = ("empty", "no_observation", "no_reward", "no_done", "state")  # openenv_fault_server.FAULTS


class Server:
    """One openenv_echo_server.py process; `start()` boots it without waiting (see `ready()`)."""

    def __init__(self, name: str, folder: Path, script: Path | None = None) -> None:
        self.name, self.folder, self.script = name, folder, str(script or openenv_echo.SERVER)
        self.log = folder / f"{name}.jsonl"
        self.start()

    def start(self) -> None:
        self.base_url, self.proc = openenv_echo.start_server(
            max_sessions=SESSIONS, log=str(self.log), output=str(self.folder / f"{self.name}.out"), script=self.script
        )

    def ready(self) -> Server:
        if self.proc.poll() is not None:  # a fault test killed it: boot a new one
            self.start()
        openenv_echo.wait_ready(self.base_url, self.proc)
        return self

    def stop(self) -> None:
        """Stop the process by its PID (a SIGSTOPped one is continued first so that SIGTERM lands)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001  # never leave a server behind
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def set_fault(self, **options) -> None:
        """Switch a fault of openenv_fault_server.py (POST /fault)."""
        body = json.dumps(options).encode()
        request = urllib.request.Request(self.base_url + "/fault", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    started = {"main": Server("main", folder), "victim": Server("victim", folder, FAULT_SERVER)}  # both boot at once
    try:
        for server in started.values():
            server.ready()
        yield started
    finally:
        for server in started.values():
            server.stop()
        assert all(server.proc.returncode is not None for server in started.values())


def rollout(model, tokenizer, seeds, env_factory, *, max_turns=5, generator=None, **options):
    generator = generator or TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id)
    return batch_rollout(
        seeds,
        env_factory,
        ChatMLProcessor(system_prompt="Repeat the word."),
        tokenizer,
        generator,
        budgets=Budgets(max_turns=max_turns, max_new_tokens=6, max_completion_tokens=300),
        parse_truncated_turns=True,
        **options,
    )


class KillBeforeWave(SpyGenerator):
    """Delivers `sig` to the server's PID just before generation wave `wave` (1-based)."""

    def __init__(self, inner, proc, sig, wave=2):
        super().__init__(inner)
        self.proc, self.sig, self.wave = proc, sig, wave

    def submit(self, requests):
        if len(self.waves) + 1 == self.wave:
            os.kill(self.proc.pid, self.sig)
            if self.sig == signal.SIGKILL:
                self.proc.wait(timeout=10)
        return super().submit(requests)


def test_seed_becomes_reset_kwargs():
    assert seed_to_reset_kwargs("42") == {"seed": 42}
    assert seed_to_reset_kwargs('{"seed": 3, "task": "easy"}') == {"seed": 3, "task": "easy"}
    hashed = seed_to_reset_kwargs("game-7")
    assert hashed == seed_to_reset_kwargs("game-7") and 0 <= hashed["seed"] < 2**31
    assert seed_to_reset_kwargs("game-8") != hashed and set(seed_to_reset_kwargs("-1")) == {"seed"}


def test_observation_text_is_its_one_string_field_else_json():
    assert observation_to_text({"prompt": "hi", "metadata": {"x": "y"}, "done": False, "reward": None}) == "hi"
    assert observation_to_text({"a": "x", "b": 2, "c": "y"}) == '{"a": "x", "b": 2, "c": "y"}'


@pytest.mark.slow
def test_multi_turn_rollouts_are_token_exact_and_rewards_are_what_the_server_reported(servers, model, tokenizer):
    server = servers["main"]
    seeds = [str(100 + i) for i in range(SESSIONS)]  # one session per episode: exactly the server's capacity
    before = len(server.records())
    spy = SpyGenerator(TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id))
    rollouts = rollout(model, tokenizer, seeds, lambda: OpenEnvAdapter(server.base_url), generator=spy)

    assert [r.ending for r in rollouts] == [Ending.ENV_DONE] * len(seeds), [r.error for r in rollouts]
    assert assert_token_exact(rollouts, spy.requests, spy.outputs) == WORDS_PER_EPISODE * len(seeds)
    episodes = defaultdict(list)
    for record in server.records()[before:]:
        episodes[record["episode"]].append(record)
    by_seed = {str(e[0]["seed"]): e for e in episodes.values()}
    assert len(episodes) == len(seeds) and sorted(by_seed) == seeds  # one server-side episode per rollout
    for r in rollouts:
        reset, *steps = by_seed[r.seed]
        assert reset["event"] == "reset" and reset["prompt"] in tokenizer.decode(r.prompt_ids)
        assert [s["action"] for s in steps] == [t.action for t in r.turns]
        assert [s["prompt"] for s in steps] == [t.delta for t in r.turns]
        assert [s["done"] for s in steps] == [False] * (WORDS_PER_EPISODE - 1) + [True]
        total = 0.0
        for step, turn in zip(steps, r.turns, strict=True):
            total += step["reward"]
            assert turn.reward == pytest.approx(total, abs=1e-12)
        assert r.reward == pytest.approx(total, abs=1e-12)
    assert sum(r.reward for r in rollouts) > 0  # partial credit: the check is not vacuous


@pytest.mark.slow
def test_episodes_cut_by_max_turns_give_their_sessions_back(servers, model, tokenizer):
    server = servers["main"]
    for attempt in range(2):  # a leaked session would leave the second batch over the server's capacity
        rollouts = rollout(
            model, tokenizer, [str(i) for i in range(SESSIONS)], lambda: OpenEnvAdapter(server.base_url), max_turns=1
        )
        assert [r.ending for r in rollouts] == [Ending.MAX_TURNS] * SESSIONS, (attempt, [r.error for r in rollouts])


@pytest.mark.slow
def test_more_episodes_than_server_sessions_fail_with_a_capacity_hint(servers, model, tokenizer):
    url = servers["main"].base_url
    rollouts = rollout(
        model, tokenizer, [str(i) for i in range(SESSIONS + 2)], lambda: OpenEnvAdapter(url), max_turns=1
    )
    refused = [r for r in rollouts if r.ending is Ending.ERROR]
    assert len(refused) == 2 and all("max_concurrent_envs >=" in r.error for r in refused)
    assert sum(r.ending is Ending.MAX_TURNS for r in rollouts) == SESSIONS
    # The failed episodes' tracebacks keep that whole batch (and its sessions) in a reference cycle; a refused
    # reset collects it, which closes those sessions, and tries again: the next full batch gets all its sessions.
    rollouts = rollout(model, tokenizer, [str(i) for i in range(SESSIONS)], lambda: OpenEnvAdapter(url), max_turns=1)
    assert [r.ending for r in rollouts] == [Ending.MAX_TURNS] * SESSIONS, [r.error for r in rollouts]


def test_typed_client_with_its_own_action_type(servers, model, tokenizer):
    from openenv.core import EnvClient
    from openenv.core.client_types import StepResult

    class EchoClient(EnvClient):
        def _step_payload(self, action):
            return {"message": action["text"]}

        def _parse_result(self, payload):
            return StepResult(payload["observation"]["prompt"], payload.get("reward"), payload.get("done", False))

        def _parse_state(self, payload):
            return payload

    url = servers["main"].base_url
    with pytest.raises(ConfigError, match="pass action="):
        OpenEnvAdapter(url, client_cls=EchoClient)
    adapters = []

    def env_factory():
        adapters.append(OpenEnvAdapter(url, client_cls=EchoClient, action=lambda t: {"text": t}, reward_mode="last"))
        return adapters[-1]

    rollouts = rollout(model, tokenizer, ["7", "8"], env_factory)
    assert [r.ending for r in rollouts] == [Ending.ENV_DONE] * 2, [r.error for r in rollouts]
    assert all(len(r.turns) == WORDS_PER_EPISODE for r in rollouts)
    last = sorted(a.results[-1].reward for a in adapters)  # reward_mode="last": the final step's reward only
    assert sorted(r.reward for r in rollouts) == last and all(len(a.results) == 1 + WORDS_PER_EPISODE for a in adapters)


def test_unreachable_server_ends_each_episode_as_an_error_at_once(model, tokenizer):
    dead = f"http://127.0.0.1:{openenv_echo.free_port()}"  # nothing listens there
    started = time.monotonic()
    rollouts = rollout(model, tokenizer, ["1", "2", "3"], lambda: OpenEnvAdapter(dead, connect_timeout_s=2))
    assert time.monotonic() - started < 10
    for r in rollouts:
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_exception" and r.reward is None
        assert "Failed to connect" in r.error and r.info["placeholder"]
    with pytest.raises(EnvError, match="Failed to connect"):  # strict mode raises the first one instead
        rollout(model, tokenizer, ["1"], lambda: OpenEnvAdapter(dead, connect_timeout_s=2), strict=True)


@pytest.mark.slow
def test_a_schema_that_never_answers_stalls_only_its_own_server_up_to_the_timeout(
    servers, model, tokenizer, monkeypatch
):
    fault, healthy = servers["victim"].ready(), servers["main"]
    urls = iter([fault.base_url] * SESSIONS + [healthy.base_url] * 2)
    lock, healthy_reset_s = threading.Lock(), []

    class TimedAdapter(OpenEnvAdapter):
        def reset(self, seed):
            time.sleep(0.5)  # starts once the hung server's look-ups are under way
            started = time.monotonic()
            answer = super().reset(seed)
            healthy_reset_s.append(round(time.monotonic() - started, 2))
            return answer

    def env_factory():
        with lock:
            url = next(urls, fault.base_url)
        return (TimedAdapter if url == healthy.base_url else OpenEnvAdapter)(url, connect_timeout_s=2)

    OpenEnvAdapter(healthy.base_url)  # imports openenv.core (and gradio, seconds) before the clock starts
    fault.set_fault(schema_hang=True)
    try:
        started = time.monotonic()
        rollouts = rollout(model, tokenizer, [str(i) for i in range(SESSIONS + 2)], env_factory, max_turns=3)
        first_s = time.monotonic() - started
        urls = iter([fault.base_url] * SESSIONS)
        started = time.monotonic()
        again = rollout(model, tokenizer, [str(i) for i in range(SESSIONS)], env_factory)  # the failure is remembered
        again_s = time.monotonic() - started
    finally:  # the server answers again, and is read again at once: later tests find it sound
        fault.set_fault(schema_hang=False)
        monkeypatch.setattr(openenv_schema, "SCHEMA_RETRY_S", 0.0, raising=False)
        recovered = rollout(model, tokenizer, ["1", "2"], lambda: OpenEnvAdapter(fault.base_url, connect_timeout_s=2))
    failed = [r for r in rollouts if r.ending is Ending.ERROR]
    report = (
        f"{first_s=:.1f} {again_s=:.1f} {healthy_reset_s=}",
        [(r.ending, r.info.get("error_kind")) for r in rollouts],
    )
    # 8 episodes on the hung server fail together after one connect_timeout_s (2 s), not one after another (16 s);
    # the healthy server's resets never wait on them. The bound is half the serial time: a loaded 2-core box took
    # 5.6 s once in a full run beside a benchmark (the episodes' own start-up, not the schema wait).
    assert first_s < 8 and len(healthy_reset_s) == 2 and max(healthy_reset_s) < 1.5, report
    assert len(failed) == SESSIONS and sum(r.ending is Ending.ENV_DONE for r in rollouts) == 2, report
    for r in failed + again:
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_timeout", r.error
        assert "did not answer GET /schema within connect_timeout_s=2" in r.error, r.error
    assert again_s < 1.5 and all("tried again" in r.error for r in again), report
    assert [r.ending for r in recovered] == [Ending.ENV_DONE] * 2, [r.error for r in recovered]


@pytest.mark.slow
def test_an_env_whose_server_renamed_its_action_field_is_read_again(servers, model, tokenizer):
    fault = servers["victim"].ready()
    try:
        for field in ("message", "text"):  # the same URL, redeployed with the action {"text": str}
            fault.set_fault(action_field=field)
            rollouts = rollout(model, tokenizer, ["1", "2"], lambda: OpenEnvAdapter(fault.base_url))
            assert [r.ending for r in rollouts] == [Ending.ENV_DONE] * 2, (field, [r.error for r in rollouts])
            assert all(len(r.turns) == FAULT_STEPS and r.reward == 0.5 * FAULT_STEPS for r in rollouts)
    finally:
        fault.set_fault(action_field="message")


def test_a_step_answered_with_a_frame_that_is_not_an_observation_ends_as_env_bad_return(servers, model, tokenizer):
    seeds = [json.dumps({"seed": i, "fault": fault}) for i, fault in enumerate(FAULTS)] + ["9"]
    url = servers["victim"].ready().base_url
    rollouts = rollout(model, tokenizer, seeds, lambda: OpenEnvAdapter(url), max_turns=3)
    *faulted, sound = rollouts
    for r in faulted:
        report = (r.seed, r.ending, r.info.get("error_kind"), [t.delta for t in r.turns], r.error)
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_bad_return" and len(r.turns) == 1, report
        assert "not an observation" in r.error and r.reward is None, report
    assert sound.ending is Ending.ENV_DONE and len(sound.turns) == FAULT_STEPS, sound.error


def test_frozen_server_times_out_as_env_timeout(servers, model, tokenizer):
    server = servers["victim"].ready()
    spy = KillBeforeWave(TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id), server.proc, signal.SIGSTOP)
    started = time.monotonic()
    try:
        rollouts = rollout(
            model, tokenizer, ["1", "2"], lambda: OpenEnvAdapter(server.base_url, message_timeout_s=1), generator=spy
        )
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert time.monotonic() - started < 20
    for r in rollouts:
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_timeout", r.error
        assert "did not answer step within message_timeout_s=1" in r.error and len(r.turns) == 2


def test_a_frozen_server_is_bounded_by_the_adapters_own_timeouts_and_named_alike(servers, model, tokenizer):
    server = servers["victim"].ready()
    adapter = OpenEnvAdapter(server.base_url, connect_timeout_s=1)
    adapter.reset("1")
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        adapter.close()  # the close handshake gets connect_timeout_s, not websockets' fixed 10 s
        close_s = time.monotonic() - started
        started = time.monotonic()
        rollouts = rollout(model, tokenizer, ["1", "2"], lambda: OpenEnvAdapter(server.base_url, connect_timeout_s=1))
        connect_s = time.monotonic() - started
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    report = (f"{close_s=:.1f} {connect_s=:.1f}", [(r.info.get("error_kind"), r.error[:120]) for r in rollouts])
    assert close_s < 2.5 and connect_s < 4, report
    for r in rollouts:  # frozen at connect: a timeout, as when frozen mid-episode
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_timeout", report
        assert "did not open a session within connect_timeout_s=1" in r.error, report


@pytest.mark.slow
def test_server_killed_mid_run_ends_its_episodes_as_errors(servers, model, tokenizer):
    server = servers["victim"].ready()
    spy = KillBeforeWave(TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id), server.proc, signal.SIGKILL)
    started = time.monotonic()
    rollouts = rollout(model, tokenizer, ["1", "2", "3", "4"], lambda: OpenEnvAdapter(server.base_url), generator=spy)
    assert time.monotonic() - started < 30
    assert server.proc.returncode == -signal.SIGKILL
    for r in rollouts:
        assert r.ending is Ending.ERROR and r.info["error_kind"] == "env_exception", r.error
        assert "closed the session" in r.error and len(r.turns) == 2 and r.turns[0].reward is not None
    assert_token_exact(rollouts, spy.requests, spy.outputs)  # the turns sampled before the failure stay exact


@pytest.mark.slow
def test_openenv_echo_example_trains_one_step_against_its_own_server(tmp_path):
    summary = openenv_echo.main(["--model", "tiny", "--steps", "1", "--out", str(tmp_path)])
    assert summary["wall_s"] > 0
    assert len(json.loads((tmp_path / "rewards_seed0.json").read_text())["rewards"]) == 1
    lines = [json.loads(line) for line in (tmp_path / "transcripts_seed0.jsonl").read_text().splitlines()]
    assert len(lines) == openenv_echo.BATCH and {line["ending"] for line in lines} == {"env_done"}
