"""The vLLM HTTP client's seams: request body, parsing, retries, routing, start-up errors (no server needed).

The real-server tests are in tests/test_vllm_integration.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
import requests

from trl_env import ConfigError, GenerationRequest, ServerError
from trl_env.backends.base import FinishReason
from trl_env.backends.vllm_server import VLLMServerGenerator


class Response:
    def __init__(self, status_code=200, payload=None, text=""):
        self.status_code, self.payload, self.text = status_code, payload, text or str(payload)

    def json(self):
        if self.payload is None:
            raise ValueError("not json")
        return self.payload


def completion(ids, lps=None, finish="stop"):
    lps = lps if lps is not None else [-0.5] * len(ids)
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}]}


def models_get(url, timeout):
    if url.endswith("/v1/models"):
        return Response(payload={"data": [{"id": "tiny"}]})
    return Response(404, text="not found")


def make(post, **kwargs):
    kwargs.setdefault("backoff", 0.001)
    return VLLMServerGenerator(
        kwargs.pop("urls", "http://127.0.0.1:1"), post=post, get=kwargs.pop("get", models_get), **kwargs
    )


def request(max_tokens=8):
    return GenerationRequest([5, 6, 7], max_tokens, (2,))


def test_request_body_carries_ids_budget_stops_and_sampling_and_answers_are_used_verbatim():
    seen = []

    def post(url, json, timeout):
        seen.append((url, json))
        return Response(payload=completion([9, 10, 2], [-0.1, -0.2, -0.3]))

    gen = make(post, temperature=0.7, top_k=0, extra_body={"seed": 3})
    [g] = [f.result() for f in gen.submit([request(8)])]
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([9, 10, 2], [-0.1, -0.2, -0.3], FinishReason.STOP)
    url, body = seen[0]
    assert url == "http://127.0.0.1:1/v1/completions"
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 8 and body["stop_token_ids"] == [2]
    assert body["model"] == "tiny" and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["temperature"] == 0.7 and body["top_k"] == -1 and body["seed"] == 3


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": []},
        {"choices": [{"text": "hi", "finish_reason": "stop"}]},
        completion([1, 2], [-0.1]),
        completion([], []),
        completion([1] * 9),
        completion([1], finish="abort"),
    ],
)
def test_malformed_answers_are_server_errors_not_data(payload):
    gen = make(lambda url, json, timeout: Response(payload=payload))
    with pytest.raises(ServerError, match="127.0.0.1:1"):
        gen.submit([request(8)])[0].result()


def test_5xx_and_dropped_connections_are_retried_then_succeed():
    answers = iter([requests.ConnectionError("reset"), Response(503, text="busy"), Response(payload=completion([2]))])

    def post(url, json, timeout):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert make(post, retries=2).submit([request()])[0].result().token_ids == [2]


def test_retries_run_out_with_an_error_naming_the_url():
    calls = []

    def post(url, json, timeout):
        calls.append(url)
        return Response(502, text="bad gateway")

    with pytest.raises(ServerError, match=r"http://127.0.0.1:1/v1/completions failed 3 times; last: HTTP 502"):
        make(post, retries=2).submit([request()])[0].result()
    assert len(calls) == 3


def test_4xx_fails_at_once_with_the_servers_message():
    calls = []

    def post(url, json, timeout):
        calls.append(url)
        return Response(400, text="max_tokens too large")

    with pytest.raises(ServerError, match="HTTP 400: max_tokens too large") as info:
        make(post).submit([request()])[0].result()
    assert len(calls) == 1 and info.value.status_code == 400


def test_requests_go_to_the_least_loaded_server():
    gate, counts = threading.Event(), {}

    def post(url, json, timeout):
        base = url.rsplit("/v1", 1)[0]
        counts[base] = counts.get(base, 0) + 1
        gate.wait(5)
        return Response(payload=completion([2]))

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    gen = make(post, urls=urls)
    futures = gen.submit([request() for _ in range(9)])
    time.sleep(0.2)
    gate.set()
    assert all(f.result().token_ids == [2] for f in futures)
    assert counts == dict.fromkeys(urls, 3)


def test_no_server_fails_within_seconds_naming_the_url_and_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # a port nobody listens on once closed
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"no vLLM server answers at http://127.0.0.1:{port}.*vllm-serve"):
        VLLMServerGenerator(f"http://127.0.0.1:{port}", connect_timeout=2)
    assert time.perf_counter() - started < 5


def test_a_server_without_processed_logprobs_gets_one_warning_with_the_fix(caplog):
    def get(url, timeout):
        if url.endswith("/server_info"):
            return Response(payload={"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}})
        return models_get(url, timeout)

    with caplog.at_level(logging.WARNING):
        make(lambda *a, **k: None, get=get)
    assert "--logprobs-mode processed_logprobs" in caplog.text and "raw_logprobs" in caplog.text


def test_bad_settings_fail_early():
    with pytest.raises(ConfigError, match="max_in_flight=0"):
        make(lambda *a, **k: None, max_in_flight=0)


def test_the_client_ignores_proxy_settings_in_the_environment(monkeypatch):
    """A vLLM server is addressed directly: no per-request proxy lookup (and no detour through HTTP_PROXY)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from stub_server import stub_server

    with stub_server(0.0) as url:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        gen = VLLMServerGenerator(url, retries=0, timeout=10)
        try:
            generation = gen.submit([request(4)])[0].result()
        finally:
            gen.close()
    assert len(generation.token_ids) == 4
