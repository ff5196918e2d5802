"""A module's vLLM server fixture launched as the session server is shares that server (one cold start of 50-90 s on
2 cores instead of one per module), and hands it to each module in a fresh server's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from vllm_server import SESSION_EXTRA_ARGS, make_vllm_server_fixture, reset_server, shares_session_server


def test_a_launch_shares_the_session_server_when_each_of_its_flags_is_one_of_the_session_servers():
    assert SESSION_EXTRA_ARGS[:2] == ("--max-loras", "3")  # what AsyncGRPOTrainer's max_staleness=1 needs
    assert shares_session_server(True, {"extra_args": list(SESSION_EXTRA_ARGS)})
    assert shares_session_server(True, {"extra_args": ("--max-loras", 3)})  # the CLI sees the same text
    assert shares_session_server(True, {"extra_args": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]})
    assert shares_session_server(True, {})
    assert not shares_session_server(False, {"extra_args": SESSION_EXTRA_ARGS})  # no LoRA: another engine
    assert not shares_session_server(True, {"extra_args": ["--max-loras", "4"]})
    assert not shares_session_server(True, {"extra_args": ["--tool-call-parser", "mistral"]})
    assert not shares_session_server(True, {"extra_args": ["--no-enable-prefix-caching"]})
    assert not shares_session_server(True, {"extra_args": ["--max-logprobs", "-1"]})  # BASE_ARGS has it: not extra
    assert not shares_session_server(True, {"extra_args": SESSION_EXTRA_ARGS, "inproc_model": False})
    assert not shares_session_server(True, {"extra_args": SESSION_EXTRA_ARGS, "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}})


shared_server = make_vllm_server_fixture(name="shared_server", scope="module", extra_args=["--max-loras", "3"])


def post(server, path: str, body: dict) -> int:
    request = urllib.request.Request(
        server.base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def served(server) -> list[str]:
    with urllib.request.urlopen(server.base_url + "/v1/models", timeout=30) as r:
        return [card["id"] for card in json.loads(r.read())["data"]]


def test_a_shared_server_is_the_session_server_and_reset_gives_back_a_fresh_ones_state(
    vllm_server, shared_server, vllm_tiny_model, tmp_path
):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    assert shared_server is vllm_server
    assert served(shared_server) == [shared_server.model]  # the fixture starts the module with no adapter loaded
    adapter = tmp_path / "trl-policy-v1"
    base = AutoModelForCausalLM.from_pretrained(vllm_tiny_model)
    get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter)
    load = {"lora_name": "trl-policy-v1", "lora_path": str(adapter)}
    assert post(shared_server, "/v1/load_lora_adapter", load) == 200
    assert post(shared_server, "/v1/load_lora_adapter", load) == 400  # a name loads once: what the reset is for
    assert post(shared_server, "/pause?mode=keep", {}) == 200  # as a test that failed inside a weight sync leaves it

    assert reset_server(shared_server) == ["trl-policy-v1"]
    assert served(shared_server) == [shared_server.model]
    with urllib.request.urlopen(shared_server.base_url + "/is_paused", timeout=30) as r:
        assert json.loads(r.read()) == {"is_paused": False}
    assert post(shared_server, "/v1/load_lora_adapter", load) == 200  # the next module can publish its -v1
    # the fixture's teardown unloads it again (test_vllm_server_smoke checks the session server serves only its model)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_started_by_a_process_killed_with_sigkill_does_not_outlive_it(tmp_path):
    """``dies_with_parent`` (how ``start_vllm_server`` launches the server): a stand-in server (``sleep``) started by a
    parent process that is then SIGKILLed (as an OOM kill ends a test run or a driver) gets SIGTERM and ends; before
    it, the server was left running, orphaned. Only the processes this test started are signalled, by their ids."""
    code = (
        "import subprocess, sys, time; sys.path.insert(0, sys.argv[1]); from vllm_server import dies_with_parent; "
        "p = subprocess.Popen(dies_with_parent(['sleep', '120']), start_new_session=True); print(p.pid, flush=True); "
        "time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)  # the launcher has set its death signal and exec'd sleep
        assert _alive(child), "the stand-in server did not start"
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the server outlived the process that started it"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)  # the stand-in this test started


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
