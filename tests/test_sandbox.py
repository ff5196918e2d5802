"""trl_env.sandbox: escape attempts fail safely with the right status; normal code runs; output is capped.

Most tests go through all layers at once; the `kernel_*` tests turn the audit hook off to show that the
kernel layers (bwrap's namespaces, the `nobody` user, RLIMIT_NPROC) hold on their own. The adversarial suite
(attacks tried as a reward-maximising policy would) is tests/test_sandbox_adversarial.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from trl_env.sandbox import Sandbox, SandboxResult, SandboxStatus

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")

FAST = Sandbox(cpu_seconds=1, wall_seconds=10, memory_bytes=128 * 2**20, max_output_bytes=1000)
KERNEL_ONLY = dataclasses.replace(FAST, audit_hook=False)


def run(code: str, sandbox: Sandbox = FAST) -> SandboxResult:
    return sandbox.run(code)


@pytest.fixture(scope="module")
def kernel_layers() -> tuple[str, ...]:
    return KERNEL_ONLY.run("pass").layers


@pytest.fixture
def listener():
    """A TCP server on the test's own loopback; the sandbox must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    yield server
    server.close()


def assert_nobody_connected(server: socket.socket) -> None:
    with pytest.raises(TimeoutError):
        server.accept()


# -- normal code ------------------------------------------------------------------------------------------


def test_normal_code_runs_and_its_output_comes_back():
    result = run("import math, json\nprint(pow(3, 100, 101), math.gcd(12, 18))\nprint(json.dumps([1]))")
    assert result.status is SandboxStatus.OK and result.ok
    assert result.stdout == "1 6\n[1]\n" and result.stderr == "" and result.exit_code == 0
    assert 0 < result.elapsed_s < FAST.wall_seconds and "rlimits" in result.layers and "audit" in result.layers


def test_code_may_write_and_read_files_in_its_own_directory():
    result = run(
        "open('a.txt', 'w').write('hi')\nimport os\nos.mkdir('d')\nprint(open('a.txt').read(), os.listdir('.'))"
    )
    assert result.status is SandboxStatus.OK and result.stdout.startswith("hi [")


def test_an_exception_is_an_error_with_the_users_traceback_only():
    result = run("x = 1\n1 / 0")
    assert result.status is SandboxStatus.ERROR and result.exit_code == 1
    assert 'File "main.py", line 2' in result.stderr and result.stderr.rstrip().endswith("division by zero")
    assert "child.py" not in result.stderr  # the sandbox's own frames (sandbox/child.py) are hidden


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [("import sys; sys.exit(3)", SandboxStatus.ERROR, 3), ("import sys; sys.exit(0)", SandboxStatus.OK, 0)],
)
def test_exit_codes_are_reported(code, status, exit_code):
    result = run(code)
    assert (result.status, result.exit_code) == (status, exit_code)


@pytest.mark.parametrize("code", ["def (", "print(1)\x00", "print('\udcff')", "raise SystemExit('bye')", "\\" * 10])
def test_bad_code_never_raises(code):
    result = run(code)
    assert isinstance(result, SandboxResult) and result.status in (SandboxStatus.OK, SandboxStatus.ERROR)


def test_result_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        run("pass").stdout = "x"  # type: ignore[misc]  # the point of the test


def test_runs_from_several_threads_at_once_stay_separate():
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run(f"print({i} * {i})"), range(8)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
    assert len({r.workdir for r in results}) == 8


# -- the temporary directory --------------------------------------------------------------------------------


def test_code_runs_in_a_fresh_temporary_directory_that_is_removed_afterwards():
    result = run("import os\nprint(os.getcwd())\nopen('left.txt', 'w').write('x' * 1000)")
    assert result.ok and result.stdout.strip() == result.workdir
    assert not os.path.exists(result.workdir)


def test_directory_is_removed_even_after_a_timeout_and_locked_subdirectories():
    result = run("import os\nos.makedirs('a/b')\nos.chmod('a', 0)\nwhile True: pass")
    assert result.status is SandboxStatus.TIMEOUT and not os.path.exists(result.workdir)


# -- writes outside the temporary directory -------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "open({target!r}, 'w').write('escaped')",
        "open({target!r}, 'a').write('escaped')",
        "import os\nos.close(os.open({target!r}, os.O_WRONLY | os.O_CREAT))",
        "import os\nopen('x', 'w').write('escaped')\nos.rename('x', {target!r})",
        "import os\nos.mkdir('d')\nopen('d/../../' + os.path.basename({target!r}), 'w').write('escaped')",
        "import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('escaped')",
        "import os\nos.chdir(os.path.dirname({target!r}))\nopen({target!r}, 'w')",
    ],
    ids=["open-w", "open-a", "os.open", "rename", "dotdot", "symlink", "chdir"],
)
def test_writes_outside_the_directory_are_refused(tmp_path, code):
    target = str(tmp_path / "escaped.txt")
    result = run(code.format(target=target))
    assert result.status is SandboxStatus.REFUSED, result.stderr
    assert result.refused and "PermissionError: sandbox:" in result.stderr
    assert not os.path.exists(target) and os.listdir(tmp_path) == []


def test_writes_to_world_writable_tmp_are_refused():
    path = f"/tmp/trl_env_sandbox_escape_{os.getpid()}"
    result = run(f"open({path!r}, 'w').write('escaped')")
    assert result.status is SandboxStatus.REFUSED and not os.path.exists(path)


def test_reads_outside_the_directory_and_the_interpreter_are_refused():
    result = run("print(open('/etc/hostname').read())")
    assert result.status is SandboxStatus.REFUSED and result.stdout == ""


def test_kernel_alone_stops_writes_to_a_directory_nobody_owns(tmp_path, kernel_layers):
    if "setuid" not in kernel_layers:
        pytest.skip("not running as root: the code runs as this user, the audit hook is the only guard")
    target = str(tmp_path / "escaped.txt")
    result = run(f"open({target!r}, 'w').write('escaped')", KERNEL_ONLY)
    # the directory is not even in the sandbox's file-system view (mount namespace); where it is, nobody cannot write
    assert result.status is SandboxStatus.ERROR
    assert "No such file or directory" in result.stderr or "Permission denied" in result.stderr
    assert not os.path.exists(target)


# -- network ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/')",
    ],
    ids=["create_connection", "socket", "dns", "urllib"],
)
def test_network_connections_fail(listener, code):
    result = run(code.format(port=listener.getsockname()[1]))
    # urllib may not even import as `nobody` (the interpreter's files unreadable): an error, never a connection
    assert result.status in (SandboxStatus.REFUSED, SandboxStatus.ERROR) and not result.ok
    if "import socket" in code:
        assert result.status is SandboxStatus.REFUSED and result.refused.startswith("socket.")
    assert_nobody_connected(listener)


def test_kernel_alone_has_no_network(listener, kernel_layers):
    if "netns" not in kernel_layers:
        pytest.skip("no CAP_SYS_ADMIN: no network namespace, the audit hook is the only guard")
    port = listener.getsockname()[1]
    result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", KERNEL_ONLY)
    # the sandbox's own loopback (bwrap brings it up): nothing listens there, the trainer's is out of reach
    assert result.status is SandboxStatus.ERROR
    assert "unreachable" in result.stderr or "Connection refused" in result.stderr
    assert_nobody_connected(listener)


# -- processes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import os\nos.system('touch {marker}')",
        "import os\nos.posix_spawn('/usr/bin/touch', ['touch', '{marker}'], {{}})",
        "import os\nos.execv('/usr/bin/touch', ['touch', '{marker}'])",
        "import os\nos.kill(os.getppid(), 9)",
    ],
    ids=["fork-bomb", "system", "posix_spawn", "exec", "kill-parent"],
)
def test_new_processes_and_signals_are_refused(tmp_path, code):
    marker = tmp_path / "spawned"
    result = run(code.format(marker=marker))
    assert result.status is SandboxStatus.REFUSED, result.stderr
    assert not marker.exists()


def test_subprocess_cannot_start_anything(tmp_path):
    marker = tmp_path / "spawned"
    result = run(f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])")
    # refused at `import _posixsubprocess`; as `nobody` the module may not even be readable (an ImportError)
    assert result.status in (SandboxStatus.REFUSED, SandboxStatus.ERROR) and not marker.exists()


def test_kernel_alone_bounds_forks(kernel_layers):
    if "setuid" not in kernel_layers and os.geteuid() == 0:
        pytest.skip("root without a user switch: RLIMIT_NPROC does not apply, the audit hook is the only guard")
    result = run("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('forked')", KERNEL_ONLY)
    assert result.status is SandboxStatus.ERROR and "Resource temporarily unavailable" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import ctypes",
        "import gc\nhook = next(f for f in gc.get_objects() if getattr(f, '__name__', '') == 'hook')\n"
        "hook.__defaults__ = ()",  # the hook is a closure of child.make_hook
        "import sys\nsys._getframe(1).f_globals['allowed'].__defaults__ = ()",  # a helper of the hook
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (99, 99))",
    ],
    ids=["ctypes", "rewire-hook", "rewire-helper", "raise-limits"],
)
def test_ways_around_the_hook_are_refused(code):
    assert run(code).status is SandboxStatus.REFUSED


# -- memory, time and output ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["x = bytearray(10**10)", "chunks = []\nwhile True:\n    chunks.append(b'x' * 2**20)"])
def test_unbounded_memory_is_stopped(code):
    result = run(code)
    assert result.status is SandboxStatus.MEMORY and "MemoryError" in result.stderr


def test_an_infinite_loop_is_stopped_by_the_cpu_limit():
    result = run("while True:\n    pass")
    assert result.status is SandboxStatus.TIMEOUT and result.elapsed_s < FAST.wall_seconds + 1


def test_sleeping_forever_is_stopped_by_the_wall_clock_limit():
    sandbox = dataclasses.replace(FAST, wall_seconds=1)
    result = run("import time\nprint('started')\ntime.sleep(60)", sandbox)
    assert result.status is SandboxStatus.TIMEOUT and result.exit_code < 0 and result.elapsed_s < 3
    assert result.stdout == "started\n"  # unbuffered: what was printed before the kill is kept


def processes_of(result: SandboxResult) -> list[str]:
    """Host processes still running this sandbox's code (their command line names its unique work directory)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if result.workdir in cmdline:
            found.append(f"{pid}: {cmdline.replace(chr(0), ' ')[:120]}")
    return found


@pytest.mark.parametrize(
    "code",
    [
        "import time\ntime.sleep(60)",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)",
    ],
)
def test_a_run_stopped_by_the_wall_clock_leaves_no_process_behind(code):
    result = run(code, dataclasses.replace(FAST, wall_seconds=1))
    assert result.status is SandboxStatus.TIMEOUT
    assert processes_of(result) == []  # the code, in a session of its own and no longer root, outlived bwrap before


def test_output_is_capped():
    result = run("print('x' * 100_000)\nimport sys\nprint('e' * 5000, file=sys.stderr)")
    assert result.status is SandboxStatus.OK and result.truncated
    assert result.stdout == "x" * FAST.max_output_bytes and len(result.stderr) == FAST.max_output_bytes


def test_endless_output_is_capped_and_stopped():
    result = run("while True:\n    print('y' * 1000)")
    assert result.status is SandboxStatus.TIMEOUT and result.truncated
    assert len(result.stdout) == FAST.max_output_bytes
