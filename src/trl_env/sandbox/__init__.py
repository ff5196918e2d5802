"""A small sandbox for model-written Python: ``Sandbox(...).run(code) -> SandboxResult``, never in-process.

Each run gets a fresh interpreter (``python -I -S``) in its own session and temporary directory, under
kernel limits (rlimits; a network namespace and the ``nobody`` user when running as root) and a PEP 578
audit hook. Linux only. The audit hook is a tripwire, not a security boundary (PEP 578 says as much);
what each layer stops is listed in docs/examples.md. For hostile code at scale, use a container or VM.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from typing import IO

PRELOAD = (
    "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "encodings.idna", "fractions",
    "functools", "heapq", "itertools", "json", "math", "operator", "random", "re", "socket", "statistics", "string",
    "textwrap", "time", "typing",
)  # fmt: skip
"""Modules imported before privileges drop, since as ``nobody`` the interpreter's own files may be unreadable
(``socket`` and the ``idna`` codec so that a network attempt is refused by name, not failing to import).
Never ``subprocess``: its ``_posixsubprocess.fork_exec`` raises no audit event, so it stays behind the
``import`` check."""

_CHANNEL_BYTES = 1 << 16  # the child's status lines: layers, refusals, how the code ended
CHILD_PATH = os.path.join(os.path.dirname(__file__), "child.py")
"""The child program (``child.py``), run by path in the fresh interpreter; it imports only the standard library."""


class SandboxStatus(str, Enum):
    """How a sandboxed run ended."""

    OK = "ok"
    """The code ran to the end (or called ``sys.exit(0)``)."""
    ERROR = "error"
    """An uncaught exception (the traceback is in ``stderr``) or a non-zero exit code."""
    TIMEOUT = "timeout"
    """It used up its CPU time or wall-clock time and was killed."""
    MEMORY = "memory"
    """It hit the memory limit (an uncaught ``MemoryError``)."""
    KILLED = "killed"
    """A signal ended it (e.g. a segfault, or the kernel's OOM killer)."""
    REFUSED = "refused"
    """It tried something the sandbox forbids (write outside its directory, network, subprocess...)."""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did."""

    status: SandboxStatus
    stdout: str
    """Standard output, cut at ``max_output_bytes`` (see ``truncated``)."""
    stderr: str
    """Standard error (tracebacks, refusals), cut at ``max_output_bytes``."""
    exit_code: int
    """The process's exit code; negative: killed by that signal (as ``Popen.returncode``)."""
    elapsed_s: float
    """Wall-clock seconds, interpreter start-up included."""
    cpu_s: float = 0.0
    """User + system CPU seconds of the process."""
    truncated: bool = False
    """Whether stdout or stderr was longer than ``max_output_bytes`` (the rest was discarded)."""
    refused: str = ""
    """The first operation the sandbox refused, e.g. ``"open '/etc/x' for writing"``; empty if none."""
    layers: tuple[str, ...] = ()
    """The isolation layers that were in force: ``rlimits``, ``netns``, ``setuid``, ``audit``."""
    workdir: str = ""
    """The temporary working directory the code ran in (already removed)."""

    @property
    def ok(self) -> bool:
        """Whether the code ran to the end without error."""
        return self.status is SandboxStatus.OK


@dataclass(frozen=True)
class Sandbox:
    r"""Limits and isolation for running untrusted Python; ``run(code)`` starts one fresh process per call.

    ``run`` never raises because of the code it runs: syntax errors, exceptions, loops, memory hogs
    and forbidden operations all come back as a ``SandboxResult`` with their ``SandboxStatus``.
    Safe to call from several threads at once (no ``preexec_fn``: the child sets its own limits).

    Example::

        result = Sandbox(cpu_seconds=2).run("print(pow(3, 100, 101))")
        result.status, result.stdout  # (<SandboxStatus.OK: 'ok'>, '1\n')
    """

    cpu_seconds: int = 5
    """CPU-time limit in whole seconds (RLIMIT_CPU): SIGXCPU then, SIGKILL one second later."""
    wall_seconds: float = 10.0
    """Wall-clock limit; then the process group is killed (catches ``sleep`` and blocking reads)."""
    memory_bytes: int = 256 * 2**20
    """Address-space limit (RLIMIT_AS); allocations beyond it raise ``MemoryError``."""
    max_output_bytes: int = 8192
    """Bytes of stdout and of stderr kept each; the rest is read and discarded."""
    max_file_bytes: int = 16 * 2**20
    """Largest file the code may write (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    isolate_network: bool = True
    """Give the process an empty network namespace when the kernel allows it (needs CAP_SYS_ADMIN)."""
    drop_privileges: bool = True
    """When running as root, switch the process to ``nobody`` (so RLIMIT_NPROC and file permissions apply)."""
    audit_hook: bool = True
    """Install the audit hook; turn off only to test the kernel layers on their own."""
    site_packages: bool = False
    """Let the code import the installed packages (without ``-S``); by default only the standard library."""
    preload: tuple[str, ...] = PRELOAD
    """Modules imported before the code runs (see ``PRELOAD``)."""
    python: str = sys.executable
    """The interpreter to run."""

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh temporary directory, removed afterwards.

        Args:
            code: Python source; its stdout and stderr are captured.

        Returns:
            The result; see ``SandboxStatus`` for the order in which an ending is classified.

        Raises:
            OSError: only if the interpreter cannot be started at all (e.g. no processes left).
        """
        workdir = tempfile.mkdtemp(prefix="trl_env_sandbox_")
        try:
            return self._run_in(workdir, code)
        finally:
            _remove_tree(workdir)

    def _child_config(
        self, workdir: str, channel: int, uid: int | None, gid: int | None, cpu: int
    ) -> dict[str, object]:
        """What the child process reads from its command line: where it runs, its limits, its layers."""
        return {
            "workdir": workdir,
            "channel": channel,
            "netns": self.isolate_network,
            "uid": uid,
            "gid": gid,
            "audit": self.audit_hook,
            "preload": list(self.preload),
            "rlimits": [  # (resource, soft, hard); RLIMIT_NPROC 0: no new processes or threads (not for root)
                (_rlimit("RLIMIT_CPU"), cpu, cpu + 1),
                (_rlimit("RLIMIT_AS"), self.memory_bytes, self.memory_bytes),
                (_rlimit("RLIMIT_FSIZE"), self.max_file_bytes, self.max_file_bytes),
                (_rlimit("RLIMIT_NOFILE"), self.max_open_files, self.max_open_files),
                (_rlimit("RLIMIT_CORE"), 0, 0),
                (_rlimit("RLIMIT_NPROC"), 0, 0),
            ],
        }

    def _run_in(self, workdir: str, code: str) -> SandboxResult:
        uid = gid = None
        if self.drop_privileges and os.geteuid() == 0:
            uid, gid = _nobody()
            os.chown(workdir, uid, gid)
        main = os.path.join(workdir, "main.py")
        with open(main, "wb") as f:
            f.write(code.encode("utf-8", "replace"))
        cpu = max(1, int(self.cpu_seconds))
        chan_r, chan_w = os.pipe()
        config = self._child_config(workdir, chan_w, uid, gid, cpu)
        argv = [self.python, "-I", "-B", "-u", "-X", "utf8"] + ([] if self.site_packages else ["-S"])
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        started = time.monotonic()
        deadline = started + self.wall_seconds
        try:
            proc = subprocess.Popen(
                [*argv, CHILD_PATH, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                pass_fds=(chan_w,),
                start_new_session=True,  # its own process group, killed as a whole
            )
        except BaseException:
            os.close(chan_r)
            raise
        finally:
            os.close(chan_w)
        with os.fdopen(chan_r, "rb") as channel, proc:  # closes the pipes at the end
            assert proc.stdout is not None and proc.stderr is not None
            try:
                caps = {proc.stdout: self.max_output_bytes, proc.stderr: self.max_output_bytes, channel: _CHANNEL_BYTES}
                kept, overflowed, timed_out = _collect(caps, deadline)
                if not timed_out:
                    timed_out = not _wait_exit(proc.pid, deadline)
            finally:  # even if this thread is interrupted: no process outlives run()
                _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.monotonic() - started
        cpu_s = usage.ru_utime + usage.ru_stime
        lines = kept[channel].decode("utf-8", "replace").splitlines()
        layers = next((tuple(x[7:].split(",")) for x in lines if x.startswith("layers ")), ())
        refused = next((x[8:] for x in lines if x.startswith("refused ")), "")
        ended = next((x[4:] for x in reversed(lines) if x.startswith("end ")), "")
        rc = proc.returncode
        return SandboxResult(
            status=_status(
                rc, timed_out=timed_out or (rc == -signal.SIGKILL and cpu_s >= cpu), ended=ended, refused=refused
            ),
            stdout=kept[proc.stdout].decode("utf-8", "replace"),
            stderr=kept[proc.stderr].decode("utf-8", "replace"),
            exit_code=rc,
            elapsed_s=elapsed,
            cpu_s=cpu_s,
            truncated=bool(overflowed & {proc.stdout, proc.stderr}),
            refused=refused,
            layers=layers,
            workdir=workdir,
        )


def _status(rc: int, *, timed_out: bool, ended: str, refused: str) -> SandboxStatus:
    """How a run ended, from its exit code and what the child reported on its channel."""
    if timed_out or rc == -signal.SIGXCPU:
        return SandboxStatus.TIMEOUT
    if ended == "memory":
        return SandboxStatus.MEMORY
    if refused:
        return SandboxStatus.REFUSED
    if rc < 0:
        return SandboxStatus.KILLED
    return SandboxStatus.OK if rc == 0 else SandboxStatus.ERROR


def _collect(caps: dict[IO[bytes], int], deadline: float) -> tuple[dict[IO[bytes], bytearray], set[IO[bytes]], bool]:
    """Read every stream to EOF or the deadline, keeping the first ``caps[stream]`` bytes of each.

    Returns:
        The kept bytes per stream, the streams that had more than their cap, whether the deadline passed.
    """
    kept: dict[IO[bytes], bytearray] = {stream: bytearray() for stream in caps}
    overflowed: set[IO[bytes]] = set()
    with selectors.DefaultSelector() as selector:
        for stream in caps:
            selector.register(stream, selectors.EVENT_READ, data=stream)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return kept, overflowed, True
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                source: IO[bytes] = key.data
                buffer, cap = kept[source], caps[source]
                if len(buffer) + len(data) > cap:  # keep reading (and discarding) so the child never blocks
                    overflowed.add(source)
                    data = data[: max(0, cap - len(buffer))]
                buffer += data
    return kept, overflowed, False


def _wait_exit(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` has exited (without reaping it) or the deadline passes; True if it exited."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _rlimit(name: str) -> int:
    return int(getattr(resource, name))


def _remove_tree(path: str) -> None:
    """Remove ``path`` even where the code took permissions away from its own directories."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)
