"""Attacks on trl_env.sandbox as a reward-maximising policy would try them, and the host-side checks that judge them.

Plain Python (no pytest): tests/test_sandbox_adversarial.py runs it in-process as root, and as an ordinary user
through ``python tests/sandbox_attacks.py SRC_DIR BWRAP`` (a system interpreter, prints one JSON report).
Each attack prints ``ESCAPED: ...`` when it gets what it wanted inside the sandbox; the host checks catch
what the attack could not see itself (files written or chmodded on the host, connections, killed siblings).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PRELUDE = """import os, sys
def escaped(what):
    print("ESCAPED: " + str(what)[:300])
def attempt(f):
    try:
        return f()
    except BaseException as e:
        print("blocked:", type(e).__name__, str(e)[:200])
"""
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
SPAWN_PATHS = "'/usr/bin/touch', ['touch', '@HOST@/spawned']"


@dataclass(frozen=True)
class Attack:
    name: str
    category: str
    code: str
    hidden_refusal: bool = False
    """A refusal the code tries to hide: with the audit hook on, the status must still be ``refused``."""
    forged: tuple[str, ...] = ()
    """Statuses the code tries to make the parent report without earning them: the run must never end with one."""


A = Attack
ATTACKS = [
    # siblings first, so that they overlap the victims
    A("kill-all-visible", "siblings", "import signal\nattempt(lambda: os.kill(-1, signal.SIGKILL))\nprint('done')"),
    A("kill-pid-scan", "siblings", "n = 0\nfor p in range(2, 40000):\n    try:\n        os.kill(p, 9); n += 1\n"
      "    except Exception:\n        pass\nif n:\n    escaped(f'signalled {n} processes')"),
    A("pidfd-siblings", "siblings", "import signal\nfor p in range(2, 40000):\n    try:\n"
      "        fd = os.pidfd_open(p)\n"
      "    except ProcessLookupError:\n        continue\n    signal.pidfd_send_signal(fd, signal.SIGKILL)\n"
      "    escaped(f'pidfd kill {p}')"),
    A("swap-sibling-main", "siblings", "import glob\nfor d in glob.glob('/tmp/trl_env_sandbox_*'):\n"
      "    if d != os.getcwd():\n        attempt(lambda: os.remove(d + '/main.py'))\n"
      "        attempt(lambda: os.symlink('@SECRET@', d + '/main.py'))\n        escaped('sees sibling ' + d)"),
    A("proc-of-siblings", "siblings", "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
      "if set(pids) - {'1', str(os.getpid())}:\n    escaped(f'sees other processes {pids}')"),  # 1: its monitor
    A("kill-trainer", "signals", "attempt(lambda: os.kill(@TRAINER@, 9))"),
    A("kill-ppid", "signals", "attempt(lambda: os.kill(os.getppid(), 9))\nattempt(lambda: os.killpg(0, 9))\n"
      "print('ok')"),
    A("ptrace-trainer", "processes", LIBC + "r = libc.ptrace(16, @TRAINER@, 0, 0)\nif r == 0:\n"
      "    escaped('attached')"),
    # reads
    A("read-secret", "reads", "s = attempt(lambda: open('@SECRET@').read())\nif s:\n    escaped(s)"),
    A("read-secret-symlink", "reads", "attempt(lambda: os.symlink('@SECRET@', 'l'))\n"
      "s = attempt(lambda: open('l').read())\nif s:\n    escaped(s)"),
    A("read-secret-hardlink", "reads", "attempt(lambda: os.link('@SECRET@', 'h'))\n"
      "s = attempt(lambda: open('h').read())\nif s:\n    escaped(s)"),
    A("read-etc", "reads", "for p in ('/etc/passwd', '/etc/shadow', '/etc/hostname'):\n"
      "    s = attempt(lambda: open(p).read())\n    if s:\n        escaped(p)"),
    A("read-proc-root", "reads", "for p in ('/proc/1/root/etc/passwd', '/proc/self/root/etc/passwd', "
      "'/proc/1/root@SECRET@'):\n    s = attempt(lambda: open(p).read())\n    if s:\n        escaped(p)"),
    A("read-environ-canary", "reads", "for p in os.listdir('/proc'):\n    if p.isdigit():\n"
      "        s = attempt(lambda: open(f'/proc/{p}/environ').read())\n        if s and '@CANARY@' in s:\n"
      "            escaped('trainer environment')"),
    A("read-raw-disk", "reads", "for d in ('/dev/vda', '/dev/sda', '/dev/nvme0n1', '/dev/mem', '/dev/kmem'):\n"
      "    s = attempt(lambda: open(d, 'rb').read(512))\n    if s:\n        escaped(d)"),
    A("list-host-dirs", "reads", "for d in ('/root', '/home', '@HOST@', '/sys', '/etc', os.path.dirname(sys.prefix)):\n"
      "    s = attempt(lambda: os.listdir(d)) if d != '/' else None\n"
      "    if s and s not in (['.pyenv'], [os.path.basename(sys.prefix)]):\n"
      "        escaped(d + ' ' + str(s[:5]))"),
    A("read-open-by-handle", "reads", LIBC + "r = libc.syscall(304, -100, 0, 0)\nprint('open_by_handle_at', r)"),
    # writes
    A("write-host-dir", "writes", "attempt(lambda: open('@HOST@/escaped', 'w').write('x'))"),
    A("write-host-tmp", "writes", "attempt(lambda: open('/tmp/@TOKEN@', 'w').write('x'))"),
    A("write-dev-shm", "writes", "attempt(lambda: open('/dev/shm/@TOKEN@', 'w').write('x'))\n"
      "import os\nif os.path.exists('/dev/shm/@TOKEN@'):\n    escaped('wrote /dev/shm outside the size limit')"),
    A("write-root-fs", "writes", "for p in ('/@TOKEN@', '/usr/@TOKEN@', '/.trl_env_sandbox/@TOKEN@', "
      "'/var/tmp/@TOKEN@'):\n"
      "    attempt(lambda: open(p, 'w').write('x'))\n    if os.path.exists(p):\n        escaped(p)"),
    A("chmod-host", "writes", "attempt(lambda: os.chmod('@PROBE@', 0o777))\nattempt(lambda: os.chmod('/usr', 0o777))"),
    A("write-proc-sys", "writes", "for p in ('/proc/sys/kernel/hostname', '/proc/sysrq-trigger', "
      "'/proc/self/oom_score_adj'):\n"
      "    attempt(lambda: open(p, 'w').write('1'))"),
    A("write-child-program", "writes", "attempt(lambda: open('/.trl_env_sandbox/child.py', 'a').write('#'))"),
    A("setuid-plant", "writes", "import shutil\nattempt(lambda: shutil.copy('/usr/bin/env', 'env'))\n"
      "attempt(lambda: os.chmod('env', 0o4755))"),
    # root-side handling of the work directory
    A("rename-workdir-symlink-root", "root-side", "w = os.getcwd()\nos.chdir('/')\n"
      "attempt(lambda: os.rename(w, w + '.moved'))\nattempt(lambda: os.symlink('@PROBE@', w))"),
    A("symlink-in-workdir", "root-side", "attempt(lambda: os.symlink('@PROBE@', 'link'))\n"
      "attempt(lambda: os.symlink('@PROBE@/a', 'dirlink'))\nattempt(lambda: os.makedirs('a/b'))\n"
      "attempt(lambda: os.chmod('a', 0))"),
    A("main-py-symlink", "root-side", "attempt(lambda: os.remove('main.py'))\n"
      "attempt(lambda: os.symlink('@SECRET@', 'main.py'))\n1 / 0"),
    A("leave-files-behind", "root-side", "for i in range(50):\n"
      "    attempt(lambda: open(f'f{i}', 'w').write('x' * 1000))"),
    # files that are not files
    A("mkfifo", "native", "attempt(lambda: os.mkfifo('fifo'))\nif os.path.exists('fifo'):\n    escaped('made a FIFO')"),
    A("mknod-device", "native", "import stat\nattempt(lambda: os.mknod('n', stat.S_IFIFO | 0o666))\n"
      "if os.path.exists('n'):\n    escaped('made a node')"),
    A("memfd", "resources", "fd = os.memfd_create('x')\nos.write(fd, b'x' * 2**23)\n"
      "escaped('memory in a memfd, outside RLIMIT_AS')"),
    # network
    A("tcp-trainer", "network", "import socket\n"
      "attempt(lambda: socket.create_connection(('127.0.0.1', @PORT@), timeout=1))"),
    A("udp-trainer", "network", "import socket\ns = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))\n"
      "attempt(lambda: s.sendto(b'x', ('127.0.0.1', @PORT@)))"),
    A("dns", "network", "import socket\nr = attempt(lambda: socket.getaddrinfo('pypi.org', 443))\nif r:\n"
      "    escaped(r)"),
    A("outside-ip", "network", "import socket\nattempt(lambda: socket.create_connection(('1.1.1.1', 53), timeout=1))"),
    A("unix-socket-path", "network", "import socket\ns = attempt(lambda: socket.socket(socket.AF_UNIX))\n"
      "attempt(lambda: s.connect('@UNIX@'))"),
    A("unix-socket-abstract", "network", "import socket\ns = attempt(lambda: socket.socket(socket.AF_UNIX))\n"
      "attempt(lambda: s.connect('\\0@TOKEN@'))"),
    A("raw-packet-socket", "network", "import socket\n"
      "attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))"),
    # processes
    A("fork", "processes", "attempt(os.fork)"),
    A("os-system", "processes", "attempt(lambda: os.system('touch @HOST@/spawned'))"),
    A("posix-spawn", "processes", "attempt(lambda: os.posix_spawn(" + SPAWN_PATHS + ", {}))"),
    A("exec-shell", "processes", "attempt(lambda: os.execv('/bin/sh', ['sh', '-c', "
      "'touch @HOST@/spawned; echo ESCAPED: $(cat @SECRET@)']))"),
    A("thread", "processes", "import threading\nattempt(lambda: threading.Thread(target=print).start())"),
    A("posixsubprocess", "processes", "import _posixsubprocess\nprint('imported')"),
    A("unshare-userns", "processes", "r = attempt(lambda: os.unshare(0x10000000))\nprint('unshare', r)"
      if sys.version_info >= (3, 12) else LIBC + "print('unshare', libc.unshare(0x10000000))"),
    A("setuid-root", "processes", "attempt(lambda: os.setuid(0))\nif os.getuid() == 0 and os.geteuid() == 0:\n"
      "    s = attempt(lambda: open('@SECRET@').read())\n    if s:\n        escaped(s)"),
    # native code
    A("ctypes-import", "native", LIBC + "print('ctypes imported')"),
    A("ctypes-subclasses", "native", "c = [k for k in object.__subclasses__() if k.__module__.startswith('_ctypes')]\n"
      "if c:\n    escaped(f'ctypes classes reachable: {c[:3]}')"),
    A("ctypes-mount", "native", LIBC + "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))"),
    A("ctypes-keyctl", "native", LIBC + "print(libc.syscall(250, 0, -3, 0))"),
    A("ctypes-bpf", "native", LIBC + "print(libc.syscall(321, 0, 0, 0))"),
    A("proc-self-mem", "native", "f = attempt(lambda: open('/proc/self/mem', 'r+b'))\nprint(f)"),
    # disabling the protections
    A("gc-hook-rewire", "disable", "import gc\n"
      "h = attempt(lambda: [f for f in gc.get_objects() if getattr(f, '__name__', '') == 'hook'])\n"
      "if h:\n    attempt(lambda: setattr(h[0], '__defaults__', ()))\n"
      "s = attempt(lambda: open('@SECRET@').read())\nif s:\n    escaped(s)"),
    A("setprofile-event", "disable",
      "import sys, gc\nhooks = attempt(lambda: [f for f in gc.get_objects() if getattr(f, '__name__', '') == 'hook'])\n"
      "for h in hooks or ():\n    h.__dict__['__cantrace__'] = True\n"
      "def prof(frame, event, arg):\n    if frame.f_code.co_name == 'hook':\n        frame.f_locals['event'] = 'x'\n"
      "attempt(lambda: sys.setprofile(prof))\nattempt(lambda: open('@HOST@/escaped', 'w').write('x'))\n"
      "s = attempt(lambda: open('@SECRET@').read())\nif s:\n    escaped(s)"),
    A("settrace-event", "disable", "import sys\ndef tr(frame, event, arg):\n    return tr\n"
      "attempt(lambda: sys.settrace(tr))\ns = attempt(lambda: open('@SECRET@').read())\nif s:\n    escaped(s)"),
    A("raise-limits", "disable", "import resource\n"
      "attempt(lambda: resource.setrlimit(resource.RLIMIT_AS, (2**40, 2**40)))\n"
      "if resource.getrlimit(resource.RLIMIT_AS)[1] > 2**32:\n    escaped('raised RLIMIT_AS')"),
    A("close-status-fd", "disable", "import json\nchan = json.loads(sys.argv[1])['channel']\nos.close(chan)\n"
      "try:\n    open('/etc/passwd')\nexcept Exception:\n    pass\nprint('hid it')", hidden_refusal=True),
    # dup2 fails (EBADF) when the channel's fd number is past RLIMIT_NOFILE (a trainer with many fds open): the
    # attacker goes on to the refusal either way
    A("replace-status-fd", "disable", "import json\nchan = json.loads(sys.argv[1])['channel']\n"
      "f = open('/dev/null', 'w')\ntry:\n    os.dup2(f.fileno(), chan)\nexcept OSError as e:\n"
      "    print('could not replace the channel:', e)\ntry:\n    open('/etc/passwd')\nexcept Exception:\n    pass",
      hidden_refusal=True),
    A("flood-status-fd", "disable", "import json\nchan = json.loads(sys.argv[1])['channel']\n"
      "for _ in range(64):\n    os.write(chan, b'end ok ' * 1000)\nos.write(chan, b'partial')\ntry:\n"
      "    open('/etc/passwd')\nexcept Exception:\n    pass", hidden_refusal=True),
    # resources
    A("memory-bomb", "resources", "x = attempt(lambda: bytearray(2**31))\nif x:\n    escaped('2 GiB')"),
    A("cpu-ignore-sigxcpu", "resources", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
      "while True:\n    pass"),
    A("disk-fill", "resources", "n = 0\ntry:\n    while True:\n        with open(f'fill{n}', 'wb') as f:\n"
      "            f.write(b'x' * 2**20)\n        n += 1\nexcept OSError as e:\n    print(n, e)\n"
      "if n > @DISK_MB@ + 1:\n"
      "    escaped(f'{n} MiB written')"),
    A("many-fds", "resources", "fds = []\ntry:\n    while True:\n        fds.append(open('/dev/null'))\n"
      "except OSError as e:\n    print(len(fds), e)\nif len(fds) > 100:\n    escaped(len(fds))"),
    A("output-flood", "resources", "while True:\n    print('y' * 10000)"),
    A("sleep-forever", "resources", "import time\ntime.sleep(3600)"),
    # memory outside the address space (RLIMIT_AS counts only what is mapped): SysV shared memory and message
    # queues, POSIX message queues; the sandbox's limit is 256 MiB
    A("sysv-shm-320m", "resources", LIBC + "libc.shmat.restype = ctypes.c_void_p\nheld = 0\n"
      "for _ in range(5):\n    i = libc.shmget(0, 2**26, 0o1600)\n    a = libc.shmat(i, None, 0) if i >= 0 else None\n"
      "    if a in (None, 2**64 - 1):\n        break\n    ctypes.memset(a, 1, 2**26)\n"
      "    libc.shmdt(ctypes.c_void_p(a))\n    held += 64\n"
      "if held > 256:\n    escaped(f'{held} MiB of SysV shared memory held, detached, beyond RLIMIT_AS')"),
    A("sysv-msg-queue", "resources", LIBC + "q = libc.msgget(0, 0o1600)\nmsg = ctypes.create_string_buffer(8 + 8000)\n"
      "ctypes.memset(msg, 1, 8)\nif q >= 0 and libc.msgsnd(q, msg, 8000, 0o4000) == 0:\n"
      "    escaped('a SysV message queue holds kernel memory outside RLIMIT_AS')"),
    A("posix-mq", "resources", LIBC + "q = libc.mq_open(b'/q', 0o102, 0o600, None)\nif q >= 0:\n"
      "    escaped('a POSIX message queue holds kernel memory outside RLIMIT_AS')"),
    # socket families the network namespace does not cover (AF_VSOCK reaches the hypervisor's host), or that reach
    # kernel-wide state (netlink's uevents, audit), or add kernel surface (AF_ALG crypto, packet sockets)
    A("vsock", "network", "import socket\ns = attempt(lambda: socket.socket(40, socket.SOCK_STREAM))\n"
      "if s:\n    escaped('an AF_VSOCK socket')\n"
      "    attempt(lambda: s.connect((2, 22)))"),
    A("netlink-uevent", "network", "import socket\ns = attempt(lambda: socket.socket(16, socket.SOCK_DGRAM, 15))\n"
      "if s:\n    escaped('a netlink socket')"),
    A("af-alg", "network", "import socket\ns = attempt(lambda: socket.socket(38, socket.SOCK_SEQPACKET))\n"
      "if s:\n    escaped('an AF_ALG socket')"),
    # switching the audit hook off quietly: refused modules loaded under another name, the hook's own helpers
    A("subinterpreter-other-name", "disable", "import _imp, importlib.util, glob\n"
      "f = [g for p in sys.path for g in glob.glob(p + '/_xxsubinterpreters.*')]\nif f:\n"
      "    m = _imp.create_dynamic(importlib.util.spec_from_file_location('x._xxsubinterpreters', f[0]))\n"
      "    m.run_string(m.create(), 'open(\"/etc/passwd\")')\n"
      "else:  # built in (not a file): refused by name\n    attempt(lambda: open('/etc/passwd'))", hidden_refusal=True),
    A("ctypes-other-name", "disable", "import _imp, importlib.util, glob\n"
      "f = [g for p in sys.path for g in glob.glob(p + '/_ctypes.*')]\n"
      "m = _imp.create_dynamic(importlib.util.spec_from_file_location('x._ctypes', f[0]))\n"
      "print('loaded', m)  # native memory access with no audit event: the load itself is the refusal",
      hidden_refusal=True),
    A("hook-helper-defaults-none", "disable",
      "attempt(lambda: setattr(sys.modules['__main__'].allowed, '__defaults__', None))\n"
      "attempt(lambda: open('/etc/passwd'))", hidden_refusal=True),
    # forging the status the trainer is told
    A("long-refusal-line", "disable", "attempt(lambda: open('/etc/os-release' + '/' * 70000))",
      hidden_refusal=True),
    A("refused-then-exit-152", "disable", "attempt(lambda: open('/etc/passwd'))\nos._exit(152)",
      hidden_refusal=True, forged=("timeout",)),
    A("exit-159", "disable", "os._exit(159)", forged=("refused", "killed", "timeout")),
    A("exit-137", "disable", "os._exit(137)", forged=("refused", "killed", "timeout")),
    A("fake-end-memory", "disable", "import json\nchan = json.loads(sys.argv[1])['channel']\n"
      "attempt(lambda: open('/etc/passwd'))\nattempt(lambda: os.write(chan, b'\\nend memory\\n'))\nos._exit(0)",
      hidden_refusal=True),
]  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    name: str
    category: str
    audit_hook: bool
    status: str
    refused: str
    contained: bool
    why: str


class Host:
    """What the attacks aim at on the host: a secret, a directory tree, listeners; and the checks after."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="trl_env_attack_host_")
        os.chmod(self.dir, 0o755)
        self.token = "trl_env_attack_" + os.urandom(6).hex()  # a name the attacks try to create outside
        self.secret_text = "SECRET-" + os.urandom(8).hex()
        self.secret = os.path.join(self.dir, "secret.txt")
        with open(self.secret, "w") as f:
            f.write(self.secret_text)
        os.chmod(self.secret, 0o600)  # readable by the trainer's user only
        self.probe = os.path.join(self.dir, "probe")
        os.makedirs(os.path.join(self.probe, "a", "b"))
        self.modes = self._modes()
        self.canary = "CANARY-" + os.urandom(8).hex()
        os.environ["TRL_ENV_ATTACK_CANARY"] = self.canary
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.tcp.setblocking(False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.tcp.getsockname()[1]))
        self.udp.setblocking(False)
        self.unix_path = os.path.join(self.dir, "s.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.token)
        for s in (self.unix, self.abstract):
            s.listen()
            s.setblocking(False)

    def _modes(self) -> dict[str, int]:
        return {root: os.lstat(root).st_mode for root, _, _ in os.walk(self.probe)} | {"/": os.lstat("/").st_mode}

    def code(self, attack: Attack, disk_mb: int) -> str:
        values = {"@SECRET@": self.secret, "@HOST@": self.dir, "@PROBE@": self.probe, "@TOKEN@": self.token,
                  "@PORT@": str(self.tcp.getsockname()[1]), "@UNIX@": self.unix_path, "@CANARY@": self.canary,
                  "@TRAINER@": str(os.getpid()), "@DISK_MB@": str(disk_mb)}  # fmt: skip
        code = PRELUDE + attack.code
        for key, value in values.items():
            code = code.replace(key, value)
        return code

    def damage(self) -> list[str]:
        """What the attacks did to the host, as seen from the host."""
        found = []
        extra = sorted(set(os.listdir(self.dir)) - {"secret.txt", "probe", "s.sock"})
        if extra:
            found.append(f"files made on the host: {extra}")
        if self._modes() != self.modes:
            found.append("modes changed under the probe tree or of /")
        for path in (f"/tmp/{self.token}", f"/dev/shm/{self.token}", f"/var/tmp/{self.token}"):
            if os.path.exists(path):
                found.append(f"wrote {path}")
        for s in (self.tcp, self.unix, self.abstract):
            try:
                s.accept()
                found.append(f"a connection reached {s.getsockname()!r}")
            except BlockingIOError:
                pass
        try:
            self.udp.recv(10)
            found.append("a datagram reached the trainer's loopback")
        except BlockingIOError:
            pass
        return found

    def close(self) -> None:
        for s in (self.tcp, self.udp, self.unix, self.abstract):
            s.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def judge(attack: Attack, hook: bool, result, host: Host) -> Outcome:
    text = result.stdout + result.stderr
    why = []
    if "ESCAPED" in result.stdout:
        why.append(next(line for line in result.stdout.splitlines() if "ESCAPED" in line))
    if host.secret_text in text or host.canary in text:
        why.append("the secret reached the output")
    if attack.hidden_refusal and hook and result.status.value != "refused":
        why.append(
            f"refusal hidden: status {result.status.value} (exit {result.exit_code}, stderr {result.stderr[-300:]!r})"
        )
    if result.status.value in attack.forged:
        why.append(f"forged status {result.status.value} (exit {result.exit_code}, refused {result.refused!r})")
    if os.path.exists(result.workdir):
        why.append(f"work dir left on the host: {result.workdir}")
    return Outcome(attack.name, attack.category, hook, result.status.value, result.refused, not why, "; ".join(why))


def run_suite(sandbox, hooks=(True, False), victims: int = 4, threads: int = 6) -> tuple[list[Outcome], list[str]]:
    """Run every attack under ``sandbox`` (audit hook on and off) next to sleeping victim sandboxes.

    Returns:
        One outcome per (attack, hook), and the damage found on the host afterwards (victims killed included).
    """
    host = Host()
    try:
        variants = [dataclasses.replace(sandbox, audit_hook=h) for h in hooks]
        victim = dataclasses.replace(sandbox, wall_seconds=60, cpu_seconds=5)
        jobs = [(a, v) for a in ATTACKS for v in variants]
        with ThreadPoolExecutor(victims) as vpool, ThreadPoolExecutor(threads) as pool:
            waiting = [vpool.submit(victim.run, "import time\ntime.sleep(@S@)\nprint('alive')".replace("@S@", "8"))
                       for _ in range(victims)]  # fmt: skip
            time.sleep(1.0)  # the victims are up before the siblings attacks start
            results = list(
                pool.map(lambda job: job[1].run(host.code(job[0], getattr(job[1], "disk_bytes", 64 << 20) >> 20)), jobs)
            )
            victim_results = [w.result() for w in waiting]
        outcomes = [judge(a, v.audit_hook, r, host) for (a, v), r in zip(jobs, results, strict=True)]
        damage = host.damage()
        dead = [r for r in victim_results if r.stdout != "alive\n"]
        if dead:
            damage.append(f"{len(dead)} sibling sandboxes killed: {[(r.status.value, r.exit_code) for r in dead]}")
        return outcomes, damage
    finally:
        host.close()


def attack_sandbox(sandbox_class, **kwargs):
    """The sandbox the suite attacks: ``discrete_log.py``'s limits, smaller where it only costs time."""
    return sandbox_class(cpu_seconds=1, wall_seconds=4, memory_bytes=256 * 2**20, max_output_bytes=1000, **kwargs)


def main(argv: list[str]) -> None:
    """``sandbox_attacks.py SRC_DIR [BWRAP]``: run the suite with trl_env's sandbox from SRC_DIR; print JSON."""
    import types

    package = types.ModuleType("trl_env")  # the sandbox and errors modules only: no torch, no requests
    package.__path__ = [os.path.join(argv[0], "trl_env")]
    sys.modules["trl_env"] = package
    from trl_env.sandbox import Sandbox

    fields = {f.name for f in dataclasses.fields(Sandbox)}
    extra = {"python": sys.executable} | ({"bwrap": argv[1]} if len(argv) > 1 and "bwrap" in fields else {})
    started = time.monotonic()
    outcomes, damage = run_suite(attack_sandbox(Sandbox, **extra))
    print(json.dumps({"uid": os.getuid(), "seconds": time.monotonic() - started, "damage": damage,
                      "outcomes": [dataclasses.asdict(o) for o in outcomes]}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
