"""trl_env.sandbox: escape attempts fail safely with the right status; normal code runs; output is capped.

Most tests go through all layers at once; the `kernel_*` tests turn the audit hook off to show that the
kernel layers (bwrap's namespaces, the `nobody` user, RLIMIT_NPROC) hold on their own. The adversarial suite
(attacks tried as a reward-maximising policy would) is tests/test_sandbox_adversarial.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
import time
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


# -- issue 36: what the trainer is told, what outlives it, what the kernel bounds --------------------------------


TRAINER = """
import sys
sys.path.insert(0, {src!r})
from trl_env.sandbox import PRELOAD, Sandbox
print("running", flush=True)
Sandbox(cpu_seconds=5, wall_seconds=120, preload=PRELOAD + ({marker!r},)).run("import time\\ntime.sleep(600)")
"""


def processes_with(marker: str) -> dict[int, str]:
    """Host processes whose command line holds ``marker`` (the sandbox's config names its preload list)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found[int(pid)] = cmdline.replace("\0", " ")[:100]
    return found


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_sandboxed_process_outlives_a_killed_trainer(sig):
    marker = f"trl_env_marker_{os.urandom(6).hex()}"  # not a module: its import fails quietly before the code runs
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(src=src, marker=marker)], stdout=subprocess.PIPE)
    started: dict[int, str] = {}
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == b"running\n"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("child.py" in c and "bwrap" not in c for c in started.values()):
            time.sleep(0.05)
            started = processes_with(marker)
        assert any("child.py" in c and "bwrap" not in c for c in started.values()), started
        time.sleep(0.3)  # the code is past its start-up (privileges dropped) and asleep
        trainer.send_signal(sig)
        trainer.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and processes_with(marker):
            time.sleep(0.05)
        assert processes_with(marker) == {}, f"outlived the trainer: {processes_with(marker)}"
    finally:
        trainer.kill()
        for pid in processes_with(marker):  # only processes this test started (their command line has its marker)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("exit_code", [137, 152, 159])
def test_an_exit_code_above_128_is_an_exit_code_not_a_signal(exit_code):
    result = run(f"import os\nos._exit({exit_code})", KERNEL_ONLY)
    assert (result.status, result.exit_code, result.refused) == (SandboxStatus.ERROR, exit_code, "")


def test_a_refusal_is_not_hidden_by_an_exit_code_the_code_chooses():
    result = run("try:\n    open('/etc/passwd')\nexcept OSError:\n    pass\nimport os\nos._exit(152)")
    assert result.status is SandboxStatus.REFUSED and result.exit_code == 152 and "/etc/passwd" in result.refused


def test_a_refusal_with_a_long_message_is_reported():
    result = run("try:\n    open('/etc/os-release' + '/' * 70000)\nexcept OSError:\n    pass")
    assert result.status is SandboxStatus.REFUSED and result.refused.startswith("open '/etc/os-release///")


@pytest.mark.parametrize("value", ["None", "()"])
def test_the_hooks_helpers_cannot_be_rewired_to_break_it(value):
    code = (
        f"import sys\ntry:\n    sys.modules['__main__'].allowed.__defaults__ = {value}\nexcept Exception:\n    pass\n"
    )
    result = run(code + "try:\n    open('/etc/passwd')\nexcept Exception:\n    pass")
    assert result.status is SandboxStatus.REFUSED, result


@pytest.mark.parametrize("module", ["_ctypes", "_xxsubinterpreters"])
def test_a_refused_extension_module_under_another_name_is_refused(module):
    code = (
        "import _imp, glob, importlib.util, sys\n"
        f"path = [g for p in sys.path for g in glob.glob(p + '/{module}.*')][0]\n"
        f"_imp.create_dynamic(importlib.util.spec_from_file_location('x.{module}', path))"
    )
    result = run(code)
    assert result.status is SandboxStatus.REFUSED and module in result.refused, result


def test_extension_modules_still_load_under_their_own_names():
    # lib-dynload (_json, math) and, with site_packages, a package's own (markupsafe._speedups, yaml's _yaml)
    code = "import math, _json, markupsafe._speedups, yaml\nprint(markupsafe.escape('<'), yaml.__with_libyaml__)"
    result = run(code, dataclasses.replace(FAST, site_packages=True))
    assert result.status is SandboxStatus.OK and result.stdout == "&lt; True\n", result.stderr[-2000:]


def test_cpu_time_is_counted_for_a_run_stopped_at_the_wall_clock():
    result = run("while True:\n    pass", dataclasses.replace(FAST, cpu_seconds=10, wall_seconds=1.5))
    assert result.status is SandboxStatus.TIMEOUT and result.cpu_s > 0.2, result  # was 0.004 (bwrap killed unreaped)


SHM = "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmget(0, 2**20, 0o1600))"


@pytest.mark.parametrize(
    "code",
    [
        SHM,
        "import ctypes\nprint(ctypes.CDLL(None).msgget(0, 0o1600))",
        "import ctypes\nprint(ctypes.CDLL(None).mq_open(b'/q', 0o102, 0o600, None))",
    ],
    ids=["shmget", "msgget", "mq_open"],
)
def test_kernel_alone_refuses_memory_outside_the_address_space(code, kernel_layers):
    if "seccomp" not in kernel_layers:
        pytest.skip("no seccomp filter on this architecture")
    result = run(code, KERNEL_ONLY)
    assert result.status is SandboxStatus.REFUSED and "seccomp" in result.refused, result


@pytest.mark.parametrize("family", [40, 38, 17], ids=["AF_VSOCK", "AF_ALG", "AF_PACKET"])
def test_kernel_alone_refuses_socket_families_outside_the_threat_model(family, kernel_layers):
    if "seccomp" not in kernel_layers:
        pytest.skip("no seccomp filter on this architecture")
    result = run(f"import socket\nsocket.socket({family}, socket.SOCK_DGRAM)", KERNEL_ONLY)
    assert result.status is SandboxStatus.REFUSED and "seccomp" in result.refused, result


def test_kernel_alone_allows_unix_and_inet_sockets_and_fails_netlink(kernel_layers):
    code = (
        "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))\nsocket.socket().close()\n"
        "try:\n    socket.socket(16, socket.SOCK_DGRAM, 15)\nexcept OSError as e:\n    print(e.errno)"
    )
    result = run(code, KERNEL_ONLY)
    assert result.status is SandboxStatus.OK and result.stdout.startswith("b'x'\n"), result
    if "seccomp" in kernel_layers:
        assert result.stdout == "b'x'\n97\n"  # EAFNOSUPPORT


def run_filter(program: bytes, nr: int, arg0: int = 0, arch: int = 0xC000003E) -> int:
    """What a classic BPF seccomp program returns for one system call (the few instructions seccomp.py emits)."""
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}  # struct seccomp_data: nr, arch, args[0] (low half)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc, pc = data[k], pc + 1
        elif code in (0x15, 0x35):  # BPF_JEQ, BPF_JGE (| BPF_K)
            pc += 1 + (jt if (acc == k if code == 0x15 else acc >= k) else jf)
        else:
            assert code == 0x06, code  # BPF_RET | BPF_K
            return k


def test_the_filter_allows_only_the_threat_models_socket_families_on_every_architecture_it_covers():
    from trl_env.sandbox import seccomp

    kill, allow = seccomp.RET_KILL_PROCESS, seccomp.RET_ALLOW
    for machine in ("x86_64", "amd64"):
        program = seccomp.program(machine)
        assert program is not None
        for call in (41, 53):  # socket, socketpair
            for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6
                assert run_filter(program, call, family) == allow
            assert run_filter(program, call, 16) == seccomp.RET_ERRNO | 97  # AF_NETLINK: EAFNOSUPPORT
            for family in (40, 17, 38, 3, 4, 5, 44, (1 << 32) | 40):  # AF_VSOCK, AF_PACKET, AF_ALG, AX25, IPX, ...
                assert run_filter(program, call, family) == kill  # (the kernel reads an int: the low half decides)
        for nr in (29, 30, 67, 68, 69, 240, 319):  # shmget, shmat, shmdt, msgget, msgsnd, mq_open, memfd_create
            assert run_filter(program, nr) == kill
        for nr in (0, 1, 2, 9, 60, 231, 42, 44, 45):  # read, write, open, mmap, exit, exit_group, connect, sendto, ...
            assert run_filter(program, nr) == allow
        assert run_filter(program, 41, 1, arch=0x40000003) == kill  # a 32-bit call
        assert run_filter(program, 0x40000000 + 41, 1) == kill  # x32
    assert seccomp.program("aarch64") is None  # no filter there: said in layers and in the threat model
