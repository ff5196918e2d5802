"""``bench_agents``' view of the machine: its busy and idle CPU, the server's engine steps, and pinning to cores."""

from __future__ import annotations

import os

import requests


def machine_cpu() -> tuple[float, float]:
    """The machine's CPU seconds so far, all cores: (busy, idle): the server's, this process's, its workers', any other
    load's. Busy near wall x cores means the paths compete for the cores: extra CPU on one then costs wall time."""
    import psutil

    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0), idle


def pin_cores(base_url: str) -> str:
    """Pin the server listening at ``base_url`` (its process tree, every thread) to core 0 and this process (every
    thread; later threads and forks inherit it) to the other cores; return what was pinned.

    A stand-in for a GPU server, whose generation does not run on the trainer's cores: on a shared box the paths'
    wall times otherwise include the server and the trainer taking CPU from each other (``machine busy CPU s``).
    A server given with ``--url`` stays pinned after the run (a fresh one ends with it).
    """
    import psutil

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"--pin needs 2 cores or more; this process may use {cores}")
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
              and c.status == psutil.CONN_LISTEN}  # fmt: skip
    server = psutil.Process(pid)
    pinned = 0
    for proc in [server, *server.children(recursive=True)]:
        for thread in proc.threads():
            os.sched_setaffinity(thread.id, {cores[0]})
            pinned += 1
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), set(cores[1:]))
    return f"server (pid {pid}, {pinned} threads) on core {cores[0]}; the benchmark on cores {cores[1:]}"


def engine_steps(base_url: str) -> float:
    """The server's engine steps so far (vLLM's ``iteration_tokens_total`` count, ``/metrics``); 0 without one."""
    if not base_url:
        return 0.0
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:iteration_tokens_total_count"))  # fmt: skip
