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
from vllm_client_support import Response, completion, echo, make, models_get, prompts_of

from trl_env import ConfigError, GenerationRequest, ServerError
from trl_env.backends import vllm_server as vllm_server_module
from trl_env.backends.base import FinishReason
from trl_env.backends.vllm_server import VLLMServerGenerator


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
    assert body["model"] == "tiny" and body["logprobs"] == 0
    # The ids come back as logprob tokens ("token_id:N"), so vLLM does not echo every prompt's ids (O(context)).
    assert body["return_tokens_as_token_ids"] is True and "return_token_ids" not in body
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
        counts[base] = counts.get(base, 0) + (len(json["prompt"]) if isinstance(json["prompt"][0], list) else 1)
        gate.wait(5)
        return Response(payload=echo(json))

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    gen = make(post, urls=urls)
    futures = gen.submit([GenerationRequest([5, i], 8, (2,)) for i in range(9)])
    futures += gen.submit([GenerationRequest([5, i], 8, (2,)) for i in range(9, 12)])
    time.sleep(0.2)
    gate.set()
    assert [f.result().token_ids for f in futures] == [[100 + i, 2] for i in range(12)]
    assert counts == dict.fromkeys(urls, 4)  # 3 prompts each, then one more each


def test_a_request_that_fails_on_one_server_is_retried_on_another_and_later_requests_avoid_the_failed_one(monkeypatch):
    calls, slept = [], []
    monkeypatch.setattr(vllm_server_module, "time", SleepRecorder(slept))

    def post(url, json, timeout):
        calls.append(url.rsplit("/v1", 1)[0])
        if calls[-1] == "http://127.0.0.1:1":
            raise requests.ConnectionError("refused")
        return Response(payload=echo(json))

    gen = make(post, urls=["http://127.0.0.1:1", "http://127.0.0.1:2"], retries=1, backoff=5.0)
    results = [gen.submit([GenerationRequest([5, i], 8, (2,))])[0].result() for i in range(4)]
    assert [g.token_ids for g in results] == [[100 + i, 2] for i in range(4)]
    assert calls == ["http://127.0.0.1:1"] + ["http://127.0.0.1:2"] * 4  # one failed attempt in all
    assert slept == []  # no backoff before trying another server (backoff=5 s)


class SleepRecorder:
    """Stands in for the ``time`` module of ``trl_env.backends.vllm_server``: records each ``sleep``, sleeps none."""

    def __init__(self, slept):
        self.slept = slept

    def sleep(self, seconds):
        self.slept.append(seconds)

    def __getattr__(self, name):
        return getattr(time, name)


def test_a_request_that_every_server_fails_names_them_all():
    def post(url, json, timeout):
        return Response(503, text="overloaded")

    gen = make(post, urls=["http://127.0.0.1:1", "http://127.0.0.1:2"], retries=2)
    with pytest.raises(ServerError, match=r"127.0.0.1:1/v1/completions, http://127.0.0.1:2/v1/completions failed 3"):
        gen.submit([request()])[0].result()


def test_turns_submitted_together_go_as_one_request_and_answers_reach_their_own_episode():
    bodies = []

    def post(url, json, timeout):
        bodies.append(json)
        return Response(payload=echo(json))

    gen = make(post)
    reqs = [GenerationRequest([5, 6, i], 8, (2,)) for i in range(5)] + [GenerationRequest([7, 50], 3, (2,))]
    results = [f.result() for f in gen.submit(reqs)]
    assert [g.token_ids for g in results] == [[100 + i, 2] for i in range(5)] + [[150, 2]]
    assert len(bodies) == 2  # one per distinct (max_tokens, stop ids)
    assert bodies[0]["prompt"] == [[5, 6, i] for i in range(5)] and bodies[0]["max_tokens"] == 8
    assert bodies[1]["prompt"] == [7, 50] and bodies[1]["max_tokens"] == 3


def test_max_batch_caps_the_prompts_of_one_request():
    sizes = []

    def post(url, json, timeout):
        sizes.append(len(json["prompt"]) if isinstance(json["prompt"][0], list) else 1)
        return Response(payload=echo(json))

    gen = make(post, max_batch=4)
    assert len([f.result() for f in gen.submit([GenerationRequest([5, i], 8, (2,)) for i in range(10)])]) == 10
    assert sorted(sizes) == [2, 4, 4]


def test_a_bad_choice_fails_only_its_own_turn():
    def post(url, json, timeout):
        payload = echo(json)
        payload["choices"][1] = {"index": 1, "text": "no ids", "finish_reason": "stop"}
        return Response(payload=payload)

    futures = make(post).submit([GenerationRequest([5, i], 8, (2,)) for i in range(3)])
    assert futures[0].result().token_ids == [100, 2] and futures[2].result().token_ids == [102, 2]
    with pytest.raises(ServerError, match="without usable token_ids"):
        futures[1].result()


def test_a_batch_answer_with_the_wrong_number_of_choices_is_sent_again_in_parts_and_costs_no_turn():
    bodies = []

    def post(url, json, timeout):  # answers one choice whatever it was asked: right only for one prompt
        bodies.append(json["prompt"])
        return Response(payload=echo({"prompt": prompts_of(json)[0]}))

    futures = make(post).submit([GenerationRequest([5, i], 8, (2,)) for i in range(3)])
    assert [f.result().token_ids for f in futures] == [[100, 2], [101, 2], [102, 2]]
    assert len(bodies) == 1 + 2 + 2  # the batch, its halves [0, 1] and [2], then [0] and [1]


def test_answers_that_are_never_usable_fail_their_turns_naming_the_url_in_bounded_requests():
    bodies = []

    def post(url, json, timeout):
        bodies.append(json)
        return Response(payload={"choices": []})

    futures = make(post).submit([GenerationRequest([5, i], 8, (2,)) for i in range(3)])
    for f in futures:
        with pytest.raises(ServerError, match=r"127.0.0.1:1.*0 for 1 prompts"):
            f.result()
    assert len(bodies) == 1 + 2 + 2 + 3  # the batch, [0, 1] and [2], [0] and [1], each single prompt once more


def test_a_batch_that_fails_as_a_whole_is_split_and_sent_again_so_only_the_poisoned_prompt_fails():
    sizes = []

    def post(url, json, timeout):
        sizes.append(len(prompts_of(json)))
        if [5, 3] in prompts_of(json):  # a prompt the engine fails on, failing every request that carries it
            return Response(500, text="engine error")
        return Response(payload=echo(json))

    futures = make(post, retries=2).submit([GenerationRequest([5, i], 8, (2,)) for i in range(8)])
    assert [f.result().token_ids[0] for i, f in enumerate(futures) if i != 3] == [100, 101, 102, 104, 105, 106, 107]
    with pytest.raises(ServerError, match="HTTP 500: engine error"):
        futures[3].result()
    # 3 attempts of the 8; halving with one retry per failing part: [0-3] x2, [0, 1], [2, 3] x2, [2], [3] x2, [4-7]
    assert sorted(sizes) == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]  # the halves go at once: in any order


@pytest.mark.parametrize("fault", [Response(503, text="busy"), requests.ConnectionError("Connection aborted.")])
def test_a_transient_failure_of_a_batched_request_costs_no_turn(fault):
    sizes = []

    def post(url, json, timeout):
        sizes.append(len(prompts_of(json)))
        if len(sizes) <= 3:  # the batch's three attempts fail
            if isinstance(fault, Exception):
                raise fault
            return fault
        return Response(payload=echo(json))

    futures = make(post, retries=2).submit([GenerationRequest([5, i], 8, (2,)) for i in range(8)])
    assert [f.result().token_ids[0] for f in futures] == [100 + i for i in range(8)]
    assert sizes == [8, 8, 8, 4, 4]


def test_a_server_that_cannot_be_reached_fails_the_batch_without_sending_its_parts():
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    calls = []

    def post(url, json, timeout):
        calls.append(url)
        raise requests.ConnectionError(MaxRetryError(None, url, NewConnectionError(None, "Connection refused")))

    futures = make(post, retries=2).submit([GenerationRequest([5, i], 8, (2,)) for i in range(8)])
    for f in futures:
        with pytest.raises(ServerError, match="failed 3 times") as info:
            f.result()
        assert info.value.unreachable
    assert len(calls) == 3


def test_a_batch_refused_with_a_4xx_is_retried_one_prompt_at_a_time_so_only_the_bad_prompt_fails():
    bodies = []

    def post(url, json, timeout):
        bodies.append(json)
        prompts = json["prompt"] if isinstance(json["prompt"][0], list) else [json["prompt"]]
        if any(len(p) > 3 for p in prompts):
            return Response(400, text="prompt too long for max_model_len")
        return Response(payload=echo(json))

    reqs = [GenerationRequest([5, i], 8, (2,)) for i in range(3)] + [GenerationRequest([5, 6, 7, 8], 8, (2,))]
    futures = make(post).submit(reqs)
    assert [f.result().token_ids for f in futures[:3]] == [[100, 2], [101, 2], [102, 2]]
    with pytest.raises(ServerError, match="HTTP 400: prompt too long"):
        futures[3].result()
    assert len(bodies) == 1 + 4


def test_no_server_fails_within_seconds_naming_the_url_and_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # a port nobody listens on once closed
    asked = []

    def get(url, timeout):
        asked.append((url, timeout))
        return requests.get(url, timeout=timeout)

    with pytest.raises(ConfigError, match=rf"no vLLM server answers at http://127.0.0.1:{port}.*vllm-serve"):
        VLLMServerGenerator(f"http://127.0.0.1:{port}", connect_timeout=2, get=get)
    assert asked == [(f"http://127.0.0.1:{port}/v1/models", 2)]  # one try, bounded by connect_timeout, no retries


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
    with pytest.raises(ConfigError, match="max_batch=0"):
        make(lambda *a, **k: None, max_batch=0)


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


def test_each_generation_names_the_policy_its_request_named():
    """The model (or LoRA adapter) named when the request was SENT is recorded, also when it changes after."""
    gate, names = threading.Event(), []

    def post(url, json, timeout):
        names.append(json["model"])
        if json["model"] == "tiny":
            gate.wait(5)  # still in flight when the adapter changes
        return Response(payload=echo(json))

    gen = make(post)
    old = gen.submit([GenerationRequest([5, 1], 8, (2,))])
    time.sleep(0.1)
    gen.model = "trl-env-step-3"  # what sync_lora does
    new = gen.submit([GenerationRequest([5, 2], 8, (2,))])
    assert new[0].result().policy == "trl-env-step-3"
    gate.set()
    assert old[0].result().policy == "tiny" and names == ["tiny", "trl-env-step-3"]


def test_sampled_ids_are_read_from_the_token_id_logprob_tokens_when_the_server_sends_no_token_ids():
    choice = {"index": 0, "finish_reason": "length",
              "logprobs": {"token_logprobs": [-0.1, -0.2], "tokens": ["token_id:17", "token_id:0"]}}  # fmt: skip
    gen = make(lambda url, json, timeout: Response(payload={"choices": [choice]}))
    g = gen.submit([request(2)])[0].result()
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([17, 0], [-0.1, -0.2], FinishReason.LENGTH)


def test_logprob_tokens_that_are_not_token_ids_are_a_server_error_naming_the_setting():
    choice = {"index": 0, "finish_reason": "stop", "logprobs": {"token_logprobs": [-0.1], "tokens": ["hello"]}}
    gen = make(lambda url, json, timeout: Response(payload={"choices": [choice]}))
    with pytest.raises(ServerError, match="return_tokens_as_token_ids"):
        gen.submit([request(2)])[0].result()


def test_lora_adapters_are_loaded_into_and_unloaded_from_every_server():
    seen = []

    def post(url, json, timeout):
        seen.append((url, json))
        if json["lora_name"] == "taken":
            return Response(400, text="The lora adapter 'taken' has already been loaded.")
        return Response(text="Success")

    gen = make(post, urls=["http://a:1", "http://b:2"])
    gen.load_lora_adapter("trl-env-x-step-1", "/adapters/trl-env-x-step-1")
    gen.unload_lora_adapter("trl-env-x-step-0")
    body = {"lora_name": "trl-env-x-step-1", "lora_path": "/adapters/trl-env-x-step-1"}
    assert seen == [
        ("http://a:1/v1/load_lora_adapter", body),
        ("http://b:2/v1/load_lora_adapter", body),
        ("http://a:1/v1/unload_lora_adapter", {"lora_name": "trl-env-x-step-0"}),
        ("http://b:2/v1/unload_lora_adapter", {"lora_name": "trl-env-x-step-0"}),
    ]
    assert gen.model == "tiny"  # loading serves nothing by itself: requests name an adapter through `model`
    with pytest.raises(ServerError, match="HTTP 400.*already been loaded") as refused:
        gen.load_lora_adapter("taken", "/adapters/taken")
    assert refused.value.url == "http://a:1"
