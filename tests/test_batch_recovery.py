"""Recovery of a failed batched request is concurrent (issue 32, item 7); no vLLM server (a handler, or the stub).

A batch that fails as a whole is split in two and each half is sent again: the halves go at once, so a healthy half
is answered while the half with the poisoned prompt is still being narrowed down. A read timeout on a batch of
several prompts splits it once before the server is called unreachable. The wall-time figures are in
benchmarks/bench_recovery.py and docs/benchmarks.md.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from vllm_client_support import Response, echo, make, prompts_of

from trl_env import GenerationRequest, ServerError

POISON = [5, 0]


def batch(n):
    return [GenerationRequest([5, i], 8, (2,)) for i in range(n)]


def poisoned_post(delay_s):
    """Every request that carries ``POISON`` fails with a 500 after ``delay_s`` (the engine's time to fail)."""

    def post(url, json, timeout):
        if POISON in prompts_of(json):
            time.sleep(delay_s)
            return Response(500, text="engine error")
        return Response(payload=echo(json))

    return post


def settled_at(futures):
    """When each future settled, in seconds from now."""
    start, times, lock = time.perf_counter(), [None] * len(futures), threading.Lock()

    def record(i):
        def done(_):
            with lock:
                times[i] = time.perf_counter() - start

        return done

    for i, f in enumerate(futures):
        f.add_done_callback(record(i))
    return times


def test_the_healthy_half_of_a_failed_batch_is_answered_before_the_poisoned_half_is_narrowed_down():
    futures = make(poisoned_post(0.2), retries=1).submit(batch(8))
    times = settled_at(futures)
    assert [f.result().token_ids[0] for f in futures[4:]] == [104, 105, 106, 107]
    with pytest.raises(ServerError, match="HTTP 500: engine error"):
        futures[0].result()
    # the batch fails twice (0.4 s); then [0-3] and [4-7] go at once: [4-7] is answered at ~0.4 s, while the
    # poisoned prompt takes [0-3] x2, [0, 1] x2, [0] x2 more (1.2 s). Sent one after the other, [4-7] waited for it.
    assert max(times[4:]) < times[0] - 0.6, times
    assert [f.result().token_ids[0] for f in futures[1:4]] == [101, 102, 103]


def test_both_halves_are_in_flight_at_once():
    in_flight, most, lock = [0], [0], threading.Lock()

    def post(url, json, timeout):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            time.sleep(0.1)
            if len(prompts_of(json)) == 8:
                return Response(500, text="engine error")
            return Response(payload=echo(json))
        finally:
            with lock:
                in_flight[0] -= 1

    futures = make(post, retries=0).submit(batch(8))
    assert [f.result().token_ids[0] for f in futures] == [100 + i for i in range(8)]
    assert most[0] == 2


def test_a_read_timeout_on_a_large_batch_splits_it_once_and_the_halves_are_answered():
    sizes = []

    def post(url, json, timeout):
        sizes.append(len(prompts_of(json)))
        if len(prompts_of(json)) > 4:  # too many prompts to answer within the timeout
            raise requests.ReadTimeout("Read timed out. (read timeout=300)")
        return Response(payload=echo(json))

    futures = make(post, retries=1).submit(batch(8))
    assert [f.result().token_ids[0] for f in futures] == [100 + i for i in range(8)]
    assert sizes == [8, 8, 4, 4]


def test_a_server_that_times_out_on_every_request_is_called_unreachable_after_one_split():
    sizes, lock = [], threading.Lock()

    def post(url, json, timeout):
        with lock:
            sizes.append(len(prompts_of(json)))
        raise requests.ReadTimeout("Read timed out. (read timeout=300)")

    futures = make(post, retries=1).submit(batch(8))
    for f in futures:
        with pytest.raises(ServerError, match="failed 2 times; last: ReadTimeout") as info:
            f.result()
        assert info.value.unreachable
    assert sorted(sizes) == [4, 4, 4, 4, 8, 8]  # the batch twice, then each half twice; no further split


def test_a_server_that_refuses_connections_still_fails_the_batch_without_sending_its_parts():
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    calls = []

    def post(url, json, timeout):
        calls.append(len(prompts_of(json)))
        raise requests.ConnectionError(MaxRetryError(None, url, NewConnectionError(None, "Connection refused")))

    futures = make(post, retries=1).submit(batch(8))
    for f in futures:
        with pytest.raises(ServerError, match="failed 2 times"):
            f.result()
    assert calls == [8, 8]


def test_recovery_completes_with_a_single_request_thread():
    futures = make(poisoned_post(0.0), retries=1, max_in_flight=1).submit(batch(8))
    assert [f.result(timeout=10).token_ids[0] for f in futures[1:]] == [101, 102, 103, 104, 105, 106, 107]
    with pytest.raises(ServerError, match="HTTP 500"):
        futures[0].result(timeout=10)


def test_closing_the_generator_during_recovery_fails_what_is_left_and_hangs_nothing():
    gen = make(poisoned_post(0.2), retries=1)
    futures = gen.submit(batch(8))
    time.sleep(0.3)  # the batch's first attempt is under way
    gen.close()
    for f in futures:
        try:
            f.result(timeout=5)
        except ServerError:
            pass


def test_bench_recovery_quick_runs_both_recoveries_side_by_side(tmp_path):
    from helpers import run_quick

    text = run_quick("bench_recovery.py", tmp_path)
    assert "| timeout | 16 | now (halves at once) |" in text and "| timeout | 16 | before" in text, text
    data = json.loads((tmp_path / "bench_recovery.json").read_text())
    lost = {(r["case"], r["variant"].split()[0]): r["runs"][0]["healthy_failed"] for r in data["results"]}
    assert lost[("timeout", "now")] == 0 and lost[("timeout", "before")] == 16, lost


def test_against_real_vllm_a_batch_that_times_out_and_holds_a_poisoned_prompt_costs_only_that_prompt(vllm_server):
    """The real server answers the halves; the seam adds the faults: a read timeout over 4 prompts, a poisoned one."""
    from trl_env.backends.vllm_server import VLLMServerGenerator

    session, sizes = requests.Session(), []

    def post(url, json, timeout):
        sizes.append(len(prompts_of(json)))
        if len(prompts_of(json)) > 4:
            raise requests.ReadTimeout("Read timed out. (read timeout=300)")
        if [5, 6, 0] in prompts_of(json):
            return Response(500, text="engine error")
        return session.post(url, json=json, timeout=timeout)

    gen = VLLMServerGenerator(vllm_server.base_url, post=post, retries=1, backoff=0.01, max_batch=8)
    try:
        futures = gen.submit([GenerationRequest([5, 6, i], 4, ()) for i in range(8)])
        answered = [f.result(timeout=120) for f in futures[1:]]
        with pytest.raises(ServerError, match="HTTP 500: engine error"):
            futures[0].result(timeout=120)
    finally:
        gen.close()
    assert all(len(g.token_ids) == len(g.logprobs) > 0 for g in answered)
    assert sorted(sizes) == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8]  # 8 x2 (timeouts), [0-3] x2 + [4-7], ..., [0] x2 + [1]
