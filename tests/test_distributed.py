"""Two processes (torchrun, CPU/gloo): a failure in process 0's first row ends only its episode; whole-run metrics.

In process, and against two data-parallel vLLM CPU servers (docs/scaling.md's CPU recipe).
"""

from __future__ import annotations

import json

import pytest
from helpers import NO_TORCHRUN, run_two_processes
from vllm_server import make_vllm_server_fixture

pytestmark = pytest.mark.slow  # torchrun processes


def check_whole_run_metrics(result: dict) -> None:
    assert result["num_processes"] == 2
    steps = [h for h in result["log_history"] if "env/error_env_exception_rate" in h]
    assert len(steps) == 2  # training completed both steps
    for h in steps:
        # one failed row out of 8 (4 per process): process 0 alone would say 0.25
        assert h["env/error_env_exception_rate"] == pytest.approx(1 / 8)
        assert h["env/ending_error_rate"] == pytest.approx(1 / 8)


@pytest.mark.skipif(NO_TORCHRUN, reason="no torchrun")
def test_two_process_grpo_survives_a_reset_failure_in_process_0_row_0_and_logs_the_whole_runs_error_rate(tmp_path):
    check_whole_run_metrics(run_two_processes(tmp_path))


vllm_second_server = make_vllm_server_fixture(name="vllm_second_server", scope="module", lora=False)


def requests_served(base_url: str) -> float:
    """Completion requests a vLLM server finished (its Prometheus counter ``vllm:request_success_total``)."""
    import requests

    lines = requests.get(f"{base_url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total"))


@pytest.mark.skipif(NO_TORCHRUN, reason="no torchrun")
def test_scale_out_recipe_two_processes_against_two_data_parallel_vllm_servers(
    tmp_path, vllm_server, vllm_second_server
):
    """docs/scaling.md's CPU recipe: torchrun, 2 processes, each sampling from the same 2 vLLM servers."""
    servers = [vllm_server, vllm_second_server]
    before = [requests_served(s.base_url) for s in servers]
    result = run_two_processes(tmp_path, vllm_server.model_dir, ",".join(s.base_url for s in servers))
    served = [requests_served(s.base_url) - b for s, b in zip(servers, before, strict=True)]
    check_whole_run_metrics(result)
    assert all(n > 0 for n in served), served  # both servers sampled turns of the run


@pytest.mark.skipif(NO_TORCHRUN, reason="no torchrun")
def test_two_process_turn_credit_uses_each_group_across_both_processes(tmp_path, monkeypatch):
    """EpisodeGRPOTrainer, credit="discounted", groups of 8 split 4 + 4 over two processes, one failed episode:
    each process trains on the advantages of the whole group (computed here from both processes' episodes)."""
    from trl_env.train.credit import EpisodeCredit, get_estimator

    monkeypatch.setenv("TRL_ENV_TEST_CREDIT", "discounted")
    result = run_two_processes(tmp_path)
    assert result["num_processes"] == 2
    ranks = [json.loads((tmp_path / f"log.json.rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 2  # two steps each
    estimator = get_estimator("discounted", scale_rewards="group")
    for step in zip(*ranks, strict=True):
        credits = [EpisodeCredit(**c) for rank in step for c in rank["credits"]]
        assert len(credits) == 8 and sum(c.failed for c in credits) == 1
        expected = estimator(credits)  # the whole group, both processes' episodes
        local_only = estimator(credits[:4])  # what process 0 alone would compute
        assert expected[1:4] != local_only[1:4]
        for rank, rank_step in enumerate(step):
            for i, (tokens, row) in enumerate(zip(rank_step["tokens"], rank_step["advantages"], strict=True)):
                advantages, k = expected[rank * 4 + i], 0
                for t, (model_tokens, env_tokens) in enumerate(tokens):
                    want = 0.0 if advantages is None else advantages[t]
                    assert row[k : k + model_tokens] == pytest.approx([want] * model_tokens, abs=1e-5)
                    assert not any(row[k + model_tokens : k + model_tokens + env_tokens])
                    k += model_tokens + env_tokens
                assert not any(row[k:])
