"""An env whose module notes each process that imports it (in ``$TRL_ENV_TEST_IMPORT_LOG``), for the isolation tests."""

from __future__ import annotations

import os

if os.environ.get("TRL_ENV_TEST_IMPORT_LOG"):
    with open(os.environ["TRL_ENV_TEST_IMPORT_LOG"], "a") as log:
        log.write(f"{os.getpid()}\n")


class CountedEnv:
    """Says its process id on reset; ends after one step."""

    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed):
        return self, f"pid {os.getpid()}"

    def step(self, action):
        self.reward, self.alive = 1.0, False
        return self, "done"


def _refuse() -> None:
    raise ImportError("this env's code cannot be loaded in another process")


class Unloadable:
    """An env factory that pickles but cannot be unpickled: a worker process can never build its envs."""

    def __reduce__(self):
        return (_refuse, ())

    def __call__(self) -> CountedEnv:
        return CountedEnv()
