"""Shared pieces of the benchmarks: the tiny model, a real vLLM CPU server, toy envs, statistics, tables, plots.

Not a test module and not part of the package: the scripts next to it import it as ``_common``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(REPO_ROOT / "tests"))  # tests/vllm_server.py: start/stop a real vLLM CPU server

import vllm_server as _vllm  # noqa: E402  (needs the sys.path entry above)

# --------------------------------------------------------------------------------------------- envs


class BenchEnv:
    """A text env that lives ``turns`` steps; optionally sleeps 50-150 ms per step (an env doing real work).

    The sleep of each step depends only on (seed, turn), so every scheduling variant sees the same
    env latencies. ``reward`` counts steps, so nothing depends on what the random model says.
    """

    def __init__(self, turns: int = 4, sleep_ms: tuple[float, float] | None = None) -> None:
        self.reward, self.alive, self.turn, self.turns, self.sleep_ms = 0.0, True, 0, turns, sleep_ms
        self.rng = random.Random(0)

    def reset(self, seed: str) -> tuple[BenchEnv, str]:
        self.rng = random.Random(seed)
        return self, f"Episode {seed}. Say anything; this game lasts {self.turns} turns."

    def step(self, action: str) -> tuple[BenchEnv, str]:
        if self.sleep_ms is not None:
            time.sleep(self.rng.uniform(*self.sleep_ms) / 1000.0)
        self.turn += 1
        self.reward += 1.0
        self.alive = self.turn < self.turns
        return self, f"Turn {self.turn} noted. Next."


class EnvFactory:
    """A picklable, callable ``env_factory`` for ``BenchEnv`` (a class instance, so its name shows in errors)."""

    def __init__(self, turns: int = 4, sleep_ms: tuple[float, float] | None = None) -> None:
        self.turns, self.sleep_ms = turns, sleep_ms
        self.__qualname__ = "BenchEnv"

    def __call__(self) -> BenchEnv:
        return BenchEnv(self.turns, self.sleep_ms)


# -------------------------------------------------------------------------------------- the server


def vllm_available() -> bool:
    """Whether ``.venv-vllm`` (or ``TRL_ENV_VLLM_VENV``) is installed."""
    return _vllm.vllm_python() is not None


def tiny_model_dir() -> str:
    """The tiny Qwen2 model + tokenizer of ``trl_env.testing``, saved once per machine (a cache folder)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_env" / "bench-tiny"
    if all((root / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")):
        return str(root)  # saved before (importing trl_env.testing costs ~2.5 s)
    from trl_env.testing import save_tiny_model

    return save_tiny_model(root)


#: Server environments. "1": one unbound OpenMP thread. "bound": the test fixture's default, one OpenMP
#: thread per core, pinned (VLLM_CPU_OMP_THREADS_BIND=0-1). On the shared 2-core box the pinned threads spin
#: at OpenMP barriers whenever another process holds a core: 64 x 32 tokens took 0.38 s (median of 16, range
#: 0.29-0.64) with "1" against 0.86-1.35 s (range 0.47-2.89) with "bound", interleaved (see the README).
SERVER_OMP = {"1": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}, "bound": {}}


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--base-url`` (use a running server) and ``--server-omp`` (how a fresh one runs)."""
    parser.add_argument("--base-url", default=None, help="use this running vLLM server instead of starting one")
    parser.add_argument(
        "--server-omp", choices=sorted(SERVER_OMP), default="1",
        help="OpenMP threads of a fresh server: '1' (default; steadiest on a shared box) or 'bound' (one per core)",
    )  # fmt: skip


@contextlib.contextmanager
def vllm_server(
    base_url: str | None, *, extra_args: Sequence[str] = (), omp: str = "1", log_path: str | None = None
) -> Iterator[tuple[str, str]]:
    """Yield ``(base_url, model_dir)``: the given server (its model folder from ``/v1/models``), or a fresh one.

    A fresh server serves the tiny model with the flags of ``tests/vllm_server.py`` plus ``extra_args``,
    and the OpenMP set-up ``SERVER_OMP[omp]``.
    """
    if base_url:
        import requests

        card = requests.get(f"{base_url.rstrip('/')}/v1/models", timeout=10).json()["data"][0]
        yield base_url.rstrip("/"), str(card["root"])
        return
    if not vllm_available():
        raise SystemExit(_vllm.INSTALL_HINT)
    model_dir = tiny_model_dir()
    t0 = time.perf_counter()
    with _vllm.start_vllm_server(model_dir, extra_args=list(extra_args), env=SERVER_OMP[omp], log_path=log_path) as (
        url,
        _pid,
    ):
        print(f"[server] vLLM CPU server healthy after {time.perf_counter() - t0:.0f} s at {url}", file=sys.stderr)
        yield url, model_dir


def server_config(base_url: str) -> dict[str, Any]:
    """A few facts about the running server (from ``/server_info`` in dev mode), for the results."""
    import requests

    out: dict[str, Any] = {}
    try:
        info = requests.get(f"{base_url}/server_info?config_format=json", timeout=10).json()["vllm_config"]
        if isinstance(info, str):
            info = json.loads(info)
        out["max_num_seqs"] = info["scheduler_config"]["max_num_seqs"]
        out["max_num_batched_tokens"] = info["scheduler_config"]["max_num_batched_tokens"]
        out["enable_prefix_caching"] = info["cache_config"]["enable_prefix_caching"]
        out["executor"] = info["parallel_config"]["distributed_executor_backend"]
    except Exception as e:  # noqa: BLE001  # informative only
        out["error"] = f"{type(e).__name__}: {e}"
    try:
        out["vllm_version"] = requests.get(f"{base_url}/version", timeout=10).json()["version"]
    except Exception:  # noqa: BLE001
        pass
    return out


# ------------------------------------------------------------------------------------ measurements


def machine_notes() -> str:
    """One line about the machine and its load, for the results."""
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "?"
    return f"{cores} cores ({model}), Python {platform.python_version()}, load average at start: {load}"


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and spread ((max-min)/median) of repeated measurements."""
    med = statistics.median(values)
    return dict(median=med, min=min(values), max=max(values), spread=(max(values) - min(values)) / med if med else 0.0)


def fmt_range(values: Sequence[float], digits: int = 2) -> str:
    """``median (min-max)``."""
    s = summary(values)
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def base_parser(description: str) -> argparse.ArgumentParser:
    """Options shared by the scripts: ``--quick``, ``--out``, ``--reps``, ``--seed``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke test (CI)")
    parser.add_argument("--out", default=None, help=f"folder for the PNG and JSON (default {RESULTS_DIR})")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions after the warm-up")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    return parser


def out_dir(args: argparse.Namespace) -> Path:
    """The results folder: ``--out``, else ``benchmarks/results`` (``--quick`` writes to a temp folder)."""
    if args.out:
        path = Path(args.out)
    elif args.quick:
        path = Path(tempfile.mkdtemp(prefix="trl-env-bench-"))
    else:
        path = RESULTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON."""
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def plt():
    """matplotlib.pyplot with a non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
