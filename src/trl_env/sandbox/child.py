"""The sandbox's child program, run inside bubblewrap as ``python -I -S child.py CONFIG_JSON`` (see ``Sandbox.run``).

It runs as ``__main__`` in a bare interpreter (``-I``: not even this file's directory is on ``sys.path``), so
it imports only the standard library, never ``trl_env`` (and never ``ctypes``); imported as a module it does nothing.

Order matters: read the code, import PRELOAD, fork. PID 1 stays as the monitor (``monitor``: never changes its
credentials, waits for the code, kills it at the deadline, reports its real wait status and CPU time on a socket).
The fork drops to ``nobody`` (as root), sets the rlimits, installs the audit hook and runs the code. The namespaces,
the file-system view and the seccomp filter are bwrap's, already in force.
The hook is an early refusal by name, not the boundary: it only uses its default arguments (captured builtins,
immutable tables), refuses changes to any function's ``__code__``/``__defaults__`` and the tracing, profiling
and gc walks that reach it; if its own check fails (a tampered helper), that is a refusal too. It checks paths
lexically; symlinks, hard links and ".." in write paths are refused; extension modules load only from the
interpreter's directories on ``sys.path``, under their own names.
Status goes to ``channel``; a refusal the code tries to hide by tampering with that fd ends the run.
"""

import _imp
import gc
import json
import linecache
import os
import resource
import signal
import sys
import time
import traceback


def main() -> None:
    """Run ``main.py`` in the configured working directory under the configured layers (config in ``argv[1]``)."""
    cfg = json.loads(sys.argv[1])
    chan, work = cfg["channel"], cfg["workdir"]

    pipe = os.fstat(chan)
    report = make_report(chan, (pipe.st_dev, pipe.st_ino))

    with open(os.path.join(work, "main.py"), encoding="utf-8", errors="replace") as f:
        source = f.read()
    layers = []
    for name in cfg["preload"]:
        try:
            __import__(name)
        except Exception:
            pass
    # Cache this file's lines while it is surely readable: a frame of this program shown later (a warning's
    # stacklevel, the code's own print_stack) is then never opened under the hook, which would refuse it.
    linecache.getlines(__file__)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # the monitor waits for it with a deadline
    # Out of the collector's sight: its walks at exit would otherwise copy every page shared with the monitor
    # (about 50 ms a run).
    gc.freeze()
    pid = os.fork()
    if pid:
        monitor(pid, cfg["deadline"], cfg["report"], (chan, 1, 2))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    os.close(cfg["report"])
    os.chdir(work)
    if cfg["uid"] is not None and drop_privileges(cfg["uid"], cfg["gid"]):
        layers.append("setuid")
    set_rlimits(cfg["rlimits"])
    layers.append("rlimits")
    if cfg["audit"]:
        sys.addaudithook(make_hook(work, report))
        layers.append("audit")
    report("layers " + ",".join(layers))
    run_code(source, report)


def monitor(pid, deadline, out, close) -> None:
    """PID 1 of the sandbox: wait for the code's process ``pid``, kill it at ``deadline``, report how it ended.

    It never changes its credentials, so bubblewrap's parent-death signal stays armed: if the trainer dies, bwrap
    dies, this process gets SIGKILL and the kernel ends every process of the namespace. It writes the code's real
    wait status and CPU time on ``out`` (a socket the code's process closed), then exits. ``deadline`` is on
    ``time.monotonic()``'s clock, which the sandbox shares with the trainer.
    """
    for fd in close:  # the trainer sees the end of the code's output when the code ends
        os.close(fd)
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0)
            break
        signal.sigtimedwait({signal.SIGCHLD}, left)
    os.write(out, f"exit {status} {usage.ru_utime!r} {usage.ru_stime!r}\n".encode())
    os._exit(0)


def make_report(chan, pipe, _write=os.write, _fstat=os.fstat, _exit=os._exit, _Exception=Exception):
    """``report(line, refusal=False)`` writes a status line on the channel, the pipe ``(st_dev, st_ino)``.

    If the code closed or replaced the channel's fd, a refusal cannot be reported: the process ends at once with
    exit code 125 (``REFUSED_EXIT``), which the parent reads as a refusal. A refusal line starts with a newline,
    so a partial line the code wrote cannot swallow it.
    """

    def report(line, refusal=False):
        try:
            st = _fstat(chan)
            if (st.st_dev, st.st_ino) != pipe:
                raise OSError("the status channel was replaced")
            _write(chan, (("\n" if refusal else "") + line + "\n").encode("utf-8", "replace"))
        except _Exception:
            if refusal:
                _exit(125)

    return report


def drop_privileges(uid, gid) -> bool:
    """Become ``uid``/``gid`` with no supplementary groups; whether it worked."""
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        return True
    except OSError:
        return False


def set_rlimits(rlimits) -> None:
    """Lower each ``(resource, soft, hard)`` limit, never above the current hard limit."""
    for res, soft, hard in rlimits:
        _, cur = resource.getrlimit(res)
        if cur != resource.RLIM_INFINITY:
            hard = min(hard, cur)
        try:
            resource.setrlimit(res, (min(soft, hard), hard))
        except (OSError, ValueError):
            pass


def text(path, _type=type, _str=str, _bytes=bytes):
    """A path as ``str`` (bytes decoded as the OS does), or ``None`` for anything else."""
    if _type(path) is _bytes:
        return _bytes.decode(path, "utf-8", "surrogateescape")
    return path if _type(path) is _str else None


def norm(path, _getcwd=os.getcwd, _str=str):
    """``path`` made absolute and normalised lexically (``.`` and ``..`` resolved, no symlinks followed)."""
    if not _str.startswith(path, "/"):
        path = _getcwd() + "/" + path
    parts = []
    for part in _str.split(path, "/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def allowed(path, roots, write, _text=text, _norm=norm, _str=str):
    """Whether ``path`` lies under one of ``roots``; a write path may not contain ``..``."""
    path = _text(path)
    if path is None or (write and ".." in _str.split(path, "/")):
        return False
    path = _norm(path)
    for root in roots:
        if path == root or _str.startswith(path, root + "/"):
            return True
    return False


PATH_EVENTS = frozenset(
    {
        "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.utime",
        "os.chflags", "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr", "os.chdir",
    }
)  # fmt: skip
READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.listxattr", "os.getxattr"})
REFUSED_EVENTS = frozenset(
    {
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "subprocess.Popen",
        "pty.spawn", "os.startfile", "os.symlink", "os.link", "os.mkfifo", "os.mknod", "os.killpg",
        "resource.setrlimit", "resource.prlimit", "sys.remote_exec", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    }
)  # fmt: skip
REFUSED_PREFIXES = ("socket.", "ctypes.", "_ctypes.", "sys.monitoring.")
REFUSED_IMPORTS = frozenset(
    {
        "ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi", "_testmultiphase",
        "_xxsubinterpreters", "_xxinterpchannels", "_posixshmem", "_interpreters", "_interpchannels",
        "_interpqueues", "_xxinterpqueues", "_testsinglephase", "_testbuffer", "_testimportmultiple", "_testclinic",
        "_ctypes_test", "_xxtestfuzz",
    }
)  # fmt: skip
"""Modules refused by the last part of their name, however they are imported or loaded (``x._ctypes`` too)."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def read_roots(work):
    """What the code may read: its working directory, the interpreter's files, a few devices and the zone info."""
    fixed = {"/usr/share/zoneinfo", "/dev/null", "/dev/zero", "/dev/urandom"}
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted({work} | fixed | prefixes | {p for p in sys.path if p.startswith("/")}))


def extension_roots(work):
    """Where extension modules may load from: the interpreter's directories on ``sys.path``, not the workdir."""
    return tuple(sorted({p for p in sys.path if p.startswith("/") and not allowed(p, (work,), False)}))


def own_extension(name, path, roots, suffixes, _text=text, _str=str):
    """Whether ``path`` is the extension module ``name`` under its own name: ``ROOT/a/b/c.SUFFIX`` for ``a.b.c``."""
    path = _text(path)
    if path is None or ".." in _str.split(path, "/"):
        return False
    rel = "/".join(_str.split(name, "."))
    for root in roots:
        for suffix in suffixes:
            if path == root + "/" + rel + suffix:
                return True
    return False


def make_hook(work, report):
    """The audit hook for code running in ``work``: it refuses the event, after reporting it on the channel."""

    def check(
        event,
        args,
        _allowed=allowed,
        _reads=read_roots(work),  # noqa: B008 (evaluated once, at definition, on purpose)
        _work=(work,),
        _writes=(work, "/dev/null"),
        _paths=PATH_EVENTS,
        _read_events=READ_EVENTS,
        _refused=REFUSED_EVENTS,
        _prefixes=REFUSED_PREFIXES,
        _imports=REFUSED_IMPORTS,
        _own_extension=own_extension,
        _ext_roots=extension_roots(work),  # noqa: B008 (evaluated once, at definition, on purpose)
        _suffixes=tuple(_imp.extension_suffixes()),  # noqa: B008 (evaluated once, at definition, on purpose)
        _wflags=WRITE_FLAGS,
        _pid=os.getpid(),  # noqa: B008 (evaluated once, at definition, on purpose; so are the two below)
        _type=type,
        _int=int,
        _str=str,
        _fn=type(norm),  # noqa: B008
        _mine=globals(),  # noqa: B008 (this module's globals: those of every function defined here)
    ):
        """The refused operation's description, or ``None`` if the event is allowed."""
        what = None
        if event == "open":
            path, mode, flags = args
            if _type(path) is _int:
                pass  # an fd that is already open
            elif mode is None:  # os.open: it may return a directory fd for a later dir_fd= call
                if not _allowed(path, _work, True):
                    what = f"os.open({path!r})"
            elif flags & _wflags:
                if not _allowed(path, _writes, True):
                    what = f"open {path!r} for writing"
            elif not _allowed(path, _reads, False):
                what = f"open {path!r} for reading"
        elif event in _paths:
            for path in args[:2] if event == "os.rename" else args[:1]:
                if _type(path) is not _int and not _allowed(path, _work, True):
                    what = f"{event}({path!r})"
        elif event in _read_events:
            path = args[0] if args else None
            if path is not None and _type(path) is not _int and not _allowed(path, _reads, False):
                what = f"{event}({path!r})"
        elif event == "import":
            name = "".join((args[0],))  # join: an exact str, whatever __eq__/__hash__ a subclass has
            if _str.rpartition(name, ".")[2] in _imports:
                what = f"import {name}"
            elif args[1] is not None and not _own_extension(name, args[1], _ext_roots, _suffixes):
                what = f"loading {args[1]!r} as the extension module {name}, not its own name in the interpreter's"
                what += " directories"
        elif event == "os.kill":
            if args[0] != _pid:
                what = f"os.kill({args[0]}, {args[1]})"
        elif event in ("object.__setattr__", "object.__delattr__"):  # the hook's functions are not to be rewired
            if _type(args[0]) is _fn and args[0].__globals__ is _mine:
                what = f"setting {args[1]} of a sandbox function"
        elif event in _refused or _str.startswith(event, _prefixes):
            what = event
        return what

    def hook(event, args, _check=check, _report=report, _Refusal=PermissionError, _exit=os._exit):
        try:
            what = _check(event, args)
        except BaseException:  # its helpers were tampered with, or an argument is not what it should be
            what = f"{event} (the audit hook's own check failed)"
        if what is not None:
            try:
                _report("refused " + what, True)
            except BaseException:
                _exit(125)  # REFUSED_EXIT: the refusal cannot be reported otherwise
            raise _Refusal(f"sandbox: {what} refused (no network, subprocesses or files outside the working directory)")

    return hook


def run_code(source, report) -> None:
    """Run ``source`` as ``main.py``; on an error, print its traceback without this program's frames and exit 1."""
    own_file = __file__  # this program's frames carry this file name; they are dropped from the traceback
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as e:
        del namespace, source  # the model's objects: nothing of them outlives the error
        report("end memory" if isinstance(e, MemoryError) else "end error")
        shown = traceback.TracebackException(type(e), e, e.__traceback__, lookup_lines=False)
        todo: list[traceback.TracebackException | None] = [shown]
        while todo:  # drop this program's frames (the exec and the hook) from the traceback and its chain
            t = todo.pop()
            if t is not None:
                t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != own_file])
                todo += [t.__cause__, t.__context__]
        sys.stderr.write("".join(shown.format()))
        sys.exit(1)
    report("end ok")


if __name__ == "__main__":
    main()
