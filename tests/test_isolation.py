"""isolated(env_factory): env code in worker processes; a crash, segfault, exit, hang or blow-up ends one episode."""

from __future__ import annotations

import os

import pytest
from helpers import CrashEnv, GuessEnv, InfoEnv, ScriptedGenerator

from trl_env import Budgets, ConfigError, Ending, batch_rollout
from trl_env.rollout.isolation import isolated

BUDGETS = Budgets(max_turns=2, max_new_tokens=4, max_completion_tokens=40)


def generator(tokenizer):
    return ScriptedGenerator(range(100, 200), tokenizer.convert_tokens_to_ids("<|im_end|>"), p_stop=1.0)


def run(tokenizer, factory, seeds, **kwargs):
    return batch_rollout(seeds, factory, _processor(), tokenizer, generator(tokenizer), budgets=BUDGETS, **kwargs)


def _processor():
    from trl_env import ChatMLProcessor

    return ChatMLProcessor()


def test_crashes_exits_and_errors_in_env_code_end_only_their_episode(tokenizer):
    seeds = ["ok", "segv", "ok", "exit", "raise", "memory", "ok"]
    rollouts = run(tokenizer, isolated(CrashEnv, memory_mb=1024), seeds, env_timeout=60)
    by_seed = dict(zip(seeds, rollouts, strict=False))
    assert [r.ending for r, s in zip(rollouts, seeds, strict=True) if s == "ok"] == [Ending.ENV_DONE] * 3
    assert all(r.reward == 1.0 for r, s in zip(rollouts, seeds, strict=True) if s == "ok")
    assert "killed by SIGSEGV" in by_seed["segv"].error and by_seed["segv"].info["error_kind"] == "env_exception"
    assert "exited with status 3" in by_seed["exit"].error
    assert "ValueError: boom in step" in by_seed["raise"].error
    assert "MemoryError" in by_seed["memory"].error
    assert all(r.ending is Ending.ERROR for s, r in by_seed.items() if s != "ok")


@pytest.mark.slow
def test_a_hung_env_is_abandoned_at_its_timeout_and_its_worker_killed(tokenizer):
    import time

    started = time.monotonic()
    rollouts = run(tokenizer, isolated(CrashEnv), ["hang", "ok"], env_timeout=15)  # a worker starts in a few s
    assert time.monotonic() - started < 60  # the hang sleeps 120 s
    assert rollouts[0].info["error_kind"] == "env_timeout" and rollouts[1].ending is Ending.ENV_DONE


def test_each_env_runs_in_its_own_process_and_working_directory(tokenizer):
    before = set(os.listdir("."))
    rollouts = run(tokenizer, isolated(CrashEnv, pool_size=0), ["write", "write"])
    workdirs = [tokenizer.decode(r.prompt_ids).split("user\n")[1].split("<|im_end|>")[0] for r in rollouts]
    assert len(set(workdirs)) == 2 and all(os.path.basename(d).startswith("trl_env_env_") for d in workdirs)
    assert set(os.listdir(".")) == before  # nothing written into the trainer's working directory


def test_isolated_envs_give_the_same_rollouts_as_in_process_ones(tokenizer):
    seeds = [str(n) for n in range(8)]
    local = run(tokenizer, GuessEnv, seeds)
    remote = run(tokenizer, isolated(GuessEnv), seeds)
    assert [(r.prompt_ids, r.completion_ids, r.reward, r.ending) for r in local] == [
        (r.prompt_ids, r.completion_ids, r.reward, r.ending) for r in remote
    ]


def test_a_factory_that_cannot_reach_a_process_fails_early_with_the_fix():
    with pytest.raises(ConfigError, match="must pickle.*not a lambda"):
        isolated(lambda: CrashEnv())


@pytest.mark.slow
def test_grpo_trains_with_envs_in_worker_processes_and_a_segfault_costs_one_row(tmp_path, model, tokenizer):
    from tests.helpers import train_grpo
    from trl_env import make_rollout_func

    rollout_func = make_rollout_func(
        CrashEnv, _processor(), max_turns=2, max_new_tokens=4, env_executor="process", parse_truncated_turns=True
    )
    history = train_grpo(tmp_path, model, tokenizer, rollout_func, ["ok", "segv"], max_completion_length=16)
    logged = [h for h in history if "env/ending_error_rate" in h]
    assert [h["env/ending_error_rate"] for h in logged] == [0.5, 0.5]  # the segfaulting group, and only it


def test_env_info_crosses_the_process_boundary(tokenizer):
    (rollout,) = run(tokenizer, isolated(InfoEnv), ["a"])
    assert rollout.info["env"] == {"phase": "over", "moves": 2, "won": True}


def test_a_killed_worker_leaves_no_working_directory_behind(tokenizer):
    import glob
    import tempfile

    def leftovers():
        return {
            p for prefix in ("trl_env_worker_", "trl_env_env_") for p in glob.glob(f"{tempfile.gettempdir()}/{prefix}*")
        }

    before = leftovers()
    rollouts = run(tokenizer, isolated(CrashEnv, pool_size=0), ["write", "segv", "exit", "ok"])
    assert [r.ending for r in rollouts] == [Ending.ENV_DONE, Ending.ERROR, Ending.ERROR, Ending.ENV_DONE]
    assert leftovers() == before


def test_workers_fork_from_one_process_that_imported_the_env_code_once(tokenizer, tmp_path, monkeypatch):
    """Starting a worker costs a fork, not an interpreter start plus the env's imports (seconds with torch in them)."""
    import counted_env

    log = tmp_path / "imports"
    monkeypatch.setenv("TRL_ENV_TEST_IMPORT_LOG", str(log))
    rollouts = run(tokenizer, isolated(counted_env.CountedEnv, pool_size=0), [str(n) for n in range(6)])
    workers = {int(tokenizer.decode(r.prompt_ids).split("pid ")[1].split("<")[0]) for r in rollouts}
    assert len(workers) == 6 and all(r.reward == 1.0 for r in rollouts)
    importers = {int(line) for line in log.read_text().split()} - {os.getpid()}
    assert len(importers) == 1 and not importers & workers, (importers, workers)


def test_a_busy_worker_ends_with_the_trainer_process(tmp_path):
    """The trainer killed (SIGKILL: no clean-up runs) while an env call hangs: its worker does not linger."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "trainer.py"
    script.write_text(
        "import sys, threading, time\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from helpers import CrashEnv\n"
        "from trl_env.rollout.isolation import isolated\n"
        "if __name__ == '__main__':\n"
        "    env = isolated(CrashEnv)()\n"
        "    _, delta = env.reset('hang')\n"
        "    threading.Thread(target=env.step, args=('x',), daemon=True).start()\n"
        "    time.sleep(1)\n"
        "    print(delta.split('pid ')[1], flush=True)\n"
        "    time.sleep(300)\n"
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(trainer.stdout.readline())
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(worker)


def test_env_code_that_cannot_load_fails_every_episode_with_its_cause_once_and_leaves_nothing_behind(
    tokenizer, monkeypatch
):
    import glob
    import tempfile

    import counted_env

    from trl_env.rollout import isolation

    started = []
    real_init = isolation._Zygote.__init__
    monkeypatch.setattr(isolation._Zygote, "__init__", lambda self, *a: (started.append(1), real_init(self, *a))[1])
    before = set(glob.glob(f"{tempfile.gettempdir()}/trl_env_worker_*"))
    factory = isolated(counted_env.Unloadable())
    rollouts = run(tokenizer, factory, ["a", "b", "c"]) + run(tokenizer, factory, ["d"])
    cause = "did not load in a new process: ImportError: this env's code cannot be loaded in another process"
    assert all(r.ending is Ending.ERROR and cause in r.error for r in rollouts), [r.error for r in rollouts]
    assert len(started) == 1  # one failed load, not one new process per episode
    assert set(glob.glob(f"{tempfile.gettempdir()}/trl_env_worker_*")) == before


def test_stopped_workers_are_not_kept_alive_by_their_exit_hooks(tokenizer):
    import gc

    from trl_env.rollout.isolation import _Worker

    def workers():
        gc.collect()
        return sum(isinstance(o, _Worker) for o in gc.get_objects())

    before = workers()
    run(tokenizer, isolated(CrashEnv, pool_size=0), ["ok"] * 4)  # pool_size=0: each worker stops after its episode
    assert workers() == before
