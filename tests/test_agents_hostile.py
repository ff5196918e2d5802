"""Hostile agents: keys that are not theirs, huge bodies, slow-loris connections, 500 concurrent calls from one
episode, programs that never call the model, raise, hang, or call after their episode ended."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import pytest
from agents_support import PromptReplyGenerator

from trl_env.agents import Gateway, agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Budgets, Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer


def echo_script(k, prompt):
    """Replies with the number the last user message asks for (``ask N``): a reply tells which request it answers."""
    asks = re.findall(r"ask (\d+)", prompt)
    return f"{asks[-1] if asks else k}<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("pypi:qwen2_5")


@pytest.fixture(scope="module")
def gateway():
    g = Gateway(max_body=20_000, read_timeout_s=1.0)
    yield g
    g.shutdown()


def run(tokenizer, program, gateway=None, seeds=("s",), **kwargs):
    generator = PromptReplyGenerator(tokenizer, echo_script)
    rollouts = batch_rollout(list(seeds), agent_env_factory(program, gateway=gateway), from_tokenizer(tokenizer),
                             tokenizer, generator, history="deployed", **kwargs)  # fmt: skip
    return rollouts, generator


def ask(run, n, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": f"ask {n}"}], **extra}
    return httpx.post(f"{run.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {run.api_key}"},
                      timeout=60)  # fmt: skip


@pytest.mark.slow
def test_an_ended_episodes_key_is_refused_and_records_nothing(tokenizer, gateway):
    keys = {}

    def first(run):
        keys["first"] = run
        return float(ask(run, 1).json()["choices"][0]["message"]["content"] == "1")

    (done,), _ = run(tokenizer, first, gateway)
    assert done.reward == 1.0
    rows_before = [(r.prompt_ids, r.completion_ids) for r in done.rows]
    statuses = []

    def second(run):
        stolen = keys["first"]
        statuses.append(ask(stolen, 2).status_code)  # the other episode's key: it has ended
        forged = type(stolen)(**{**stolen.__dict__, "api_key": run.api_key[:-4] + "AAAA"})
        statuses.append(ask(forged, 3).status_code)  # a guessed key
        return float(ask(run, 4).json()["choices"][0]["message"]["content"] == "4")

    (other,), generator = run(tokenizer, second, gateway)
    assert other.reward == 1.0 and statuses == [409, 401]
    assert len(generator.requests) == 1  # the refused calls were never sampled
    assert [(r.prompt_ids, r.completion_ids) for r in done.rows] == rows_before


def test_a_huge_body_is_refused_with_413_and_the_episode_goes_on(tokenizer, gateway):
    codes = []

    def program(run):
        codes.append(ask(run, 1, padding="x" * 50_000).status_code)
        headers = {"Authorization": f"Bearer {run.api_key}", "content-type": "application/json"}

        def chunked():  # no content-length: the limit holds while reading
            for _ in range(50):
                yield b" " * 1000

        r = httpx.post(f"{run.base_url}/chat/completions", content=chunked(), headers=headers)
        codes.append(r.status_code)
        return float(ask(run, 2).status_code == 200)

    (rollout,), generator = run(tokenizer, program, gateway)
    assert codes == [413, 413] and rollout.reward == 1.0 and len(generator.requests) == 1


def test_slow_loris_connections_do_not_stop_others(tokenizer, gateway):
    host, port = gateway.host, gateway.port
    idle = []
    for _ in range(20):  # half-sent headers, never finished
        s = socket.create_connection((host, port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        idle.append(s)
    codes = []

    def program(run):
        s = socket.create_connection((host, port))  # the whole header, then a body that never comes
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {run.api_key}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{".encode())  # fmt: skip
        s.settimeout(10)
        codes.append(s.recv(100).split(b" ")[1])  # 408 after read_timeout_s
        s.close()
        return float(ask(run, 5).json()["choices"][0]["message"]["content"] == "5")

    started = time.monotonic()
    rollouts, _ = run(tokenizer, program, gateway, seeds=["a", "b", "c"])
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0] and codes == [b"408"] * 3
    assert time.monotonic() - started < 30
    for s in idle:  # closed by the gateway once read_timeout_s passed without a whole request head
        s.settimeout(10)
        assert s.recv(100) == b""
        s.close()


@pytest.mark.slow
def test_500_concurrent_calls_from_one_episode_are_answered_or_refused_never_mixed(tokenizer):
    answers = {}

    async def program(run):
        limits = httpx.Limits(max_connections=600)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:

            async def one(n):
                body = {"model": "m", "messages": [{"role": "user", "content": f"ask {n}"}]}
                r = await client.post(f"{run.base_url}/chat/completions", json=body,
                                      headers={"Authorization": f"Bearer {run.api_key}"})  # fmt: skip
                answers[n] = (r.status_code, r.json())

            await asyncio.gather(*(one(n) for n in range(500)))
        return 1.0

    (rollout,), generator = run(tokenizer, program, budgets=Budgets(max_turns=4), env_timeout=120)
    assert len(answers) == 500
    ok = {n: a["choices"][0] for n, (code, a) in answers.items() if code == 200}
    refused = [a for code, a in answers.values() if code != 200]
    answered = {n: c for n, c in ok.items() if c["finish_reason"] == "stop"}
    assert len(answered) == 4 and all(c["message"]["content"] == str(n) for n, c in answered.items())
    assert len(ok) == 5 and len(refused) == 495  # the fifth call waited when the budget hit: answered "length"
    assert all(a["error"]["code"] == "episode_ended" for a in refused)
    assert rollout.ending is Ending.MAX_TURNS and len(generator.requests) == 4 and rollout.reward == 1.0


def test_programs_that_never_call_raise_hang_or_call_after_their_end_fail_alone(tokenizer):
    late = {}

    def program(run):
        kind = run.seed
        if kind == "never":
            return 1.0
        if kind == "raises":
            ask(run, 1)
            raise ValueError("the agent broke")
        if kind == "hangs":
            ask(run, 1)
            time.sleep(30)
        if kind == "late":
            late["run"] = run
            ask(run, 1)
            return 1.0
        return float(ask(run, 7).json()["choices"][0]["message"]["content"] == "7")

    seeds = ["never", "raises", "hangs", "late", "fine"]
    rollouts, _ = run(tokenizer, program, seeds=seeds, env_timeout=3.0)
    by = dict(zip(seeds, rollouts, strict=True))
    assert by["never"].ending is Ending.ERROR and by["never"].info["error_kind"] == "agent_error"
    assert "before its first model call" in by["never"].error
    assert by["raises"].info["error_kind"] == "agent_error" and "the agent broke" in by["raises"].error
    assert by["hangs"].info["error_kind"] == "env_timeout"
    assert all(by[k].reward is None for k in ("never", "raises", "hangs"))  # out of the learning signal
    assert by["late"].reward == 1.0 and by["fine"].reward == 1.0
    r = ask(late["run"], 2)
    assert r.status_code == 409 and r.json()["error"]["code"] == "episode_ended"


def test_the_gateway_listens_on_loopback_by_default():
    g = Gateway()
    try:
        assert g.base_url.startswith("http://127.0.0.1:") and g.port > 0
        assert httpx.get(f"{g.base_url}/models").status_code == 401
    finally:
        g.shutdown()
    assert not g._thread.is_alive()  # noqa: SLF001  # closes cleanly


def test_programs_in_worker_processes_a_program_that_kills_its_interpreter_fails_only_its_episode(tokenizer):
    from agents_support import exiting_program

    from trl_env.rollout.isolation import isolated

    generator = PromptReplyGenerator(tokenizer, lambda k, p: f"{k}<|im_end|>")
    factory = isolated(agent_env_factory(exiting_program), pool_size=2)
    seeds = ["exit", "a", "b"]
    rollouts = batch_rollout(seeds, factory, from_tokenizer(tokenizer), tokenizer, generator, history="deployed",
                             env_timeout=60)  # fmt: skip
    by = dict(zip(seeds, rollouts, strict=True))
    assert by["exit"].ending is Ending.ERROR and by["exit"].reward is None
    assert by["a"].reward == by["b"].reward == 1.0


@pytest.mark.slow
def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry():
    # httpx (under the openai SDK) keeps an idle pooled connection for 5 s; a gateway that closed idle connections at
    # 5 s too raced it: a call sent on a connection the gateway was closing failed with "Server disconnected without
    # sending a response" (seen in benchmarks/bench_agents.py with a shared client). The gateway must outlast it.
    g = Gateway()
    try:
        with socket.create_connection((g.host, g.port), timeout=5) as s:
            s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {g.host}\r\nConnection: keep-alive\r\n\r\n".encode())
            assert s.recv(65536).startswith(b"HTTP/1.1 401")
            time.sleep(6.0)  # longer than httpx's default keepalive_expiry (5 s)
            s.setblocking(False)
            try:
                closed = s.recv(1) == b""
            except BlockingIOError:  # nothing to read: still open
                closed = False
            assert not closed, "the gateway closed an idle keep-alive connection a client may still reuse"
    finally:
        g.shutdown()
