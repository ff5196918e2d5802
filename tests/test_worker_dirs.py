"""Worker directories (``trl_env_worker_*``) are removed when the trainer dies without cleaning up: by ``os._exit`` or
SIGKILL (issue 46 item 3): the workers' zygote removes them when it sees the trainer gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import os, sys, threading, time
sys.path.insert(0, {tests!r})
from helpers import CrashEnv
from trl_env.rollout.isolation import isolated
if __name__ == "__main__":
    factory = isolated(CrashEnv, pool_size=2)
    idle, busy = factory(), factory()
    idle.reset("write")  # a file in its working directory
    busy.reset("hang")
    idle.close()  # given back: idle in the pool
    threading.Thread(target=busy.step, args=("x",), daemon=True).start()  # a call under way
    time.sleep(0.5)
    print("ready", flush=True)
    if sys.argv[1] == "exit":
        os._exit(0)
    time.sleep(300)
"""


@pytest.mark.parametrize("death", ["exit", "kill"])
def test_worker_directories_are_removed_when_the_trainer_dies_without_cleaning_up(tmp_path, death):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "TMPDIR": str(tmp)}
    trainer = subprocess.Popen([sys.executable, str(script), death], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert trainer.stdout.readline().strip() == "ready"
        assert len(list(tmp.glob("trl_env_worker_*"))) == 2
        if death == "kill":
            trainer.send_signal(signal.SIGKILL)  # the process this test started, nothing else
        trainer.wait(60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    deadline = time.monotonic() + 30
    while list(tmp.glob("trl_env_worker_*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(tmp.glob("trl_env_worker_*")) == []
