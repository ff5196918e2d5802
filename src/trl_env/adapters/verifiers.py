"""verifiers 0.4 environments as agent programs: a taskset and its harness, run the way verifiers runs them.

``VerifiersProgram`` is an ``AgentProgram`` (trl_env.agents.run). Each episode, verifiers builds the ``Env`` the
config names (``load_environment``), enters ``Env.serving()`` (its own interception server) and plays one
``RunSlot`` of the task the episode's seed names (``Env.run_slot``): the harness program (e.g. verifiers' ``null``
chat loop, a PEP 723 script run with ``uv``) calls verifiers' interception server, which forwards each model call to
the episode's ``AgentRun.base_url`` with its ``AgentRun.api_key``. The reward is what the environment's own rubric
recorded (``Trace.reward``: its ``@vf.reward`` functions, judges and ``record_reward`` calls).

verifiers runs in a worker process of its own (verifiers_worker.py), under the interpreter that has it installed:
verifiers 0.4 pins ``mcp==2.0.0`` and ``openai<3``, which OpenEnv's ``fastmcp`` 3 cannot import and trl-env's other
extras do not pin, so it often lives in a venv of its own (``.venv-verifiers``, made by scripts/install.sh). The
worker also keeps verifiers' servers, event loop and harness processes out of the trainer's process.

Tested with verifiers 0.4.0 (docs/verifiers.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trl_env.agents.run import AgentRun
from trl_env.errors import ConfigError, EnvError

if TYPE_CHECKING:
    import datasets  # type: ignore[import-untyped,unused-ignore]

__all__ = ["INSTALL_HINT", "TESTED_VERSION", "VerifiersProgram"]

TESTED_VERSION = "0.4.0"
"""The verifiers version this adapter is tested with (its worker protocol uses verifiers' 0.4 ``v1`` API)."""
INSTALL_HINT = (
    "pip install 'trl-env[verifiers]' (verifiers==0.4.0 and uv) into a venv without OpenEnv, or run "
    "`bash scripts/install.sh`, which makes .venv-verifiers, and pass python='.venv-verifiers/bin/python' "
    "(or set TRL_ENV_VERIFIERS_PYTHON)"
)
"""How to install verifiers for this adapter; every ConfigError about a missing verifiers or ``uv`` says it."""
WORKER = Path(__file__).with_name("verifiers_worker.py")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class VerifiersProgram:
    """A verifiers 0.4 environment as an agent program: one verifiers episode per trl-env episode.

    The episode's seed names its task: the task's position in the taskset (``"3"``), or its ``TaskData.name`` or
    ``id``. ``dataset(n)`` builds a ``prompt`` column of positions to train on (at most ``tasks``, the taskset's
    size: asking for more is a ``ConfigError``, not episodes that fail).

    Example::

        program = VerifiersProgram.from_taskset("my_taskset", harness="null")   # an installed taskset package
        dataset = program.dataset(64)
        # trl-env's AgentEnv (trl_env.agents) runs `program` once per episode against the trainer's gateway
    """

    def __init__(
        self,
        env: Mapping[str, Any],
        *,
        python: str | os.PathLike[str] | None = None,
        sampling: Mapping[str, Any] | None = None,
        import_paths: Sequence[str | os.PathLike[str]] = (),
        episodes: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        """Start the verifiers worker and have it build the environment ``env`` describes (fail early).

        Args:
            env: verifiers' own ``EnvConfig`` as a dict (the shape of its TOML and ``--env.*`` flags), e.g.
                ``{"taskset": {"id": "my_taskset"}, "agent": {"harness": {"id": "null"}, "runtime":
                {"type": "subprocess"}}}``; a ``"seat"`` key stands for the env's one seat, whatever its name.
            python: The interpreter with verifiers installed (default: ``TRL_ENV_VERIFIERS_PYTHON``, else this one).
                ``uv`` is looked for beside it first, then on ``PATH``.
            sampling: verifiers ``Sampling`` fields (the trainer's gateway applies the policy's own sampling to
                every call by default).
            import_paths: Folders put on the worker's ``PYTHONPATH`` (where taskset packages not installed live).
            episodes: A JSONL file each finished episode's verifiers record (``Episode``, traces included) is
                appended to.
            start_timeout_s: How long importing verifiers and building the environment may take.

        Raises:
            ConfigError: the interpreter lacks verifiers or ``uv``, or verifiers cannot build the environment.
        """
        self.python = str(python or os.environ.get("TRL_ENV_VERIFIERS_PYTHON") or sys.executable)
        self.run_config = {"env": dict(env), "sampling": dict(sampling or {})}
        self.episodes = Path(episodes) if episodes is not None else None
        self.start_timeout_s = start_timeout_s
        found_python = shutil.which(self.python)
        if found_python is None:
            raise ConfigError(f"python={self.python!r} is not an interpreter here: {INSTALL_HINT}")
        # absolute (symlinks kept: a venv's python is one): its folder goes on PATH for `uv`, and verifiers runs
        # harness programs in other folders, where a relative .venv-verifiers/bin finds no uv (verifiers then tries
        # to download it)
        self.python = os.path.abspath(found_python)
        found = subprocess.run(
            [self.python, "-c", "import importlib.util as u, sys; sys.exit(not u.find_spec('verifiers'))"]
        )
        if found.returncode:
            raise ConfigError(f"verifiers is not installed for {self.python}: {INSTALL_HINT}")
        bin_dir = str(Path(self.python).parent)
        self.path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
        if shutil.which("uv", path=self.path) is None:
            raise ConfigError(
                f"verifiers runs its harness programs with `uv`, found neither beside {self.python} nor "
                f"on PATH: {INSTALL_HINT}"
            )
        paths = [str(Path(p).resolve()) for p in import_paths]
        self.pythonpath = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Future[dict[str, Any]]] = {}  # the running worker's episodes, by request id
        self._proc: subprocess.Popen[str] | None = None
        self._log = Path(tempfile.mkstemp(prefix="trl-env-verifiers-", suffix=".log")[1])
        self.tasks: int | None = None
        """How many tasks the taskset holds (its worker counts them), None when unbounded or above 100,000."""
        self._start()

    @classmethod
    def from_taskset(
        cls,
        taskset: str | Mapping[str, Any],
        *,
        harness: str | Mapping[str, Any] = "null",
        runtime: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        **options: Any,
    ) -> VerifiersProgram:
        """The taskset's environment (its own ``Env``, else verifiers' ``SingleAgentEnv``) with one seat.

        ``taskset``: an installed taskset package id, or its ``TasksetConfig`` fields as a dict (with ``id``).
        ``harness``: the harness id, or its config as a dict; ``null`` is verifiers' plain chat loop. ``runtime``:
        where the harness runs (default ``{"type": "subprocess"}``, on this machine; verifiers' own default is a
        remote Prime sandbox). ``options`` go to ``VerifiersProgram``.
        """
        seat: dict[str, Any] = {
            "harness": {"id": harness} if isinstance(harness, str) else dict(harness),
            "runtime": dict(runtime) if runtime is not None else {"type": "subprocess"},
        }
        if max_turns is not None:
            seat["max_turns"] = max_turns
        config = {"id": taskset} if isinstance(taskset, str) else dict(taskset)
        return cls({"taskset": config, "seat": seat}, **options)

    def dataset(self, limit: int | None = None, *, start: int = 0) -> datasets.Dataset:
        """A dataset whose ``prompt`` column holds task positions ``start .. start+limit-1`` (the episode seeds).

        Args:
            limit: How many tasks; None: every task from ``start`` on (the taskset must be bounded).
            start: The first task's position.

        Raises:
            ConfigError: the taskset holds fewer tasks than asked for (each missing one would be a failed episode;
                the trainer goes over a smaller dataset again each epoch), or ``limit`` is None and the taskset's
                size is unknown (unbounded).
        """
        import datasets  # type: ignore[import-untyped,unused-ignore]

        if start < 0 or (limit is not None and limit < 1):
            raise ConfigError(f"dataset(limit={limit}, start={start}): limit must be >= 1 and start >= 0")
        if limit is None:
            if self.tasks is None:
                raise ConfigError(
                    "dataset(): this taskset is unbounded (or holds more than 100,000 tasks), so 'every task' is "
                    "not a size: pass the number of tasks to train on, dataset(N)"
                )
            limit = self.tasks - start
        if self.tasks is not None and start + limit > self.tasks:
            at = f", start={start}" if start else ""
            raise ConfigError(
                f"dataset({limit}{at}) asks for tasks {start}..{start + limit - 1}, but the taskset "
                f"{self.run_config['env'].get('taskset')} has {self.tasks} tasks (positions 0..{self.tasks - 1}): "
                f"every seed past them would be a failed episode. Ask for dataset({max(0, self.tasks - start)}{at}) "
                "or dataset() (every task): the trainer goes over the dataset again each epoch (GRPOConfig "
                "max_steps / num_train_epochs), and plays each prompt num_generations times"
            )
        return datasets.Dataset.from_dict({"prompt": [str(i) for i in range(start, start + limit)]})

    async def __call__(self, run: AgentRun) -> float:
        """Play one verifiers episode of the task ``run.seed`` names; return its rubric's reward.

        Raises:
            EnvError: the verifiers episode failed (a harness, provider, task or env error; the message holds
                verifiers' own account of it) or the worker died, so trl-env leaves it out of the learning signal.
        """
        request = {"seed": str(run.seed), "base_url": run.base_url, "api_key": run.api_key, "model": run.model}
        answer = await asyncio.wrap_future(self._submit(request))
        if self.episodes is not None and answer.get("episode") is not None:
            with self._lock, self.episodes.open("a", encoding="utf-8") as f:
                f.write(json.dumps(answer["episode"]) + "\n")
        if "error" in answer:
            raise EnvError(answer["error"])
        return float(answer["reward"])

    def close(self) -> None:
        """Stop the worker (its running episodes end with it)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the worker finishes on end of input
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # ------------------------------------------------------------------------------------------------ the worker

    def _start(self) -> None:
        env = {**os.environ, "PATH": self.path, "PYTHONPATH": self.pythonpath, "PYTHONUNBUFFERED": "1"}
        with open(self._log, "ab") as log:
            # -P: the worker's folder is not put first on sys.path, where this module would shadow verifiers (-P needs
            # Python 3.11, as verifiers 0.4 does)
            argv = [self.python, "-P", str(WORKER), json.dumps(self.run_config)]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        ready: Future[str] = Future()
        threading.Thread(target=lambda: ready.set_result(proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
        try:
            first = json.loads(ready.result(timeout=self.start_timeout_s) or "{}")
        except Exception as e:  # noqa: BLE001  # a timeout or a garbled line: the log says why
            proc.kill()
            raise ConfigError(f"the verifiers worker did not start ({e!r}); its log:\n{_tail(self._log)}") from e
        if not first.get("ready"):
            proc.wait()
            told = first.get("fatal") or f"it exited with code {proc.returncode}; its log:\n{_tail(self._log)}"
            raise ConfigError(f"verifiers could not build the environment {self.run_config['env']}: {told}")
        self._proc, self._pending = proc, {}
        self.tasks = first.get("tasks")
        threading.Thread(target=self._read, args=(proc, self._pending), daemon=True, name="trl-env-verifiers").start()

    def _submit(self, request: dict[str, Any]) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            key = next(self._ids)
            self._pending[key] = future
            proc.stdin.write(json.dumps({"id": key, **request}) + "\n")
            proc.stdin.flush()
        return future

    def _read(self, proc: subprocess.Popen[str], pending: dict[int, Future[dict[str, Any]]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = pending.pop(answer["id"], None)
            if future is not None:
                future.set_result(answer)
        proc.wait()
        with self._lock:  # the worker ended: its episodes cannot finish
            lost = [pending.pop(key) for key in list(pending)]
        for future in lost:
            future.set_exception(
                EnvError(f"the verifiers worker exited (code {proc.returncode}); its log:\n{_tail(self._log)}")
            )
