"""The sandbox's seccomp filter: a classic BPF program, built here and loaded by bubblewrap (``bwrap --seccomp FD``).

A deny list: system calls no sandboxed Python program needs and that matter for escaping, for reaching other
processes or for holding memory outside the address space (device nodes and FIFOs, anonymous memory files, pidfds,
ptrace, keys, mounts, namespaces, BPF, io_uring, modules, SysV and POSIX IPC, ...) kill the whole process
(``SECCOMP_RET_KILL_PROCESS``, so the code cannot catch it and the parent sees SIGSYS); so does a socket of a family
outside ``SOCKET_FAMILIES``. ``clone3`` gets ENOSYS so that libc falls back to ``clone`` (itself stopped by
RLIMIT_NPROC=0). x86_64 only: elsewhere ``program()`` returns ``None`` and the sandbox runs without the filter,
saying so in ``SandboxResult.layers``. Reference: the kernel's Documentation/userspace-api/seccomp_filter.rst.
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
ENOSYS = 38
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...
_ARG0_LOW = 16  # offsetof(struct seccomp_data, args[0]), its low 32 bits on a little-endian machine

KILLED_X86_64 = {
    # files that are not files: device nodes and FIFOs (os.mknod, os.mkfifo: no audit event), anonymous memory
    # files outside every limit but RAM (os.memfd_create: none either)
    "mknod": 133, "mknodat": 259, "memfd_create": 319, "memfd_secret": 447,
    # other processes: pidfds reach any pid the code can name, ptrace and friends read and write their memory
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "process_madvise": 440, "kcmp": 312,
    # the kernel's keyrings, BPF, perf, io_uring (its own system-call path), userfaultfd
    "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
    # the file-system view and namespaces the sandbox set up
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "mount_setattr": 442, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "unshare": 272,
    "setns": 308, "name_to_handle_at": 303, "open_by_handle_at": 304, "fanotify_init": 300,
    # the machine itself (most need capabilities the sandbox does not have; refused regardless)
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "quotactl_fd": 443,
    "syslog": 103, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305,
    "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173, "modify_ldt": 154,
    "personality": 135, "uselib": 134, "vhangup": 153, "lookup_dcookie": 212, "move_pages": 279,
    "migrate_pages": 256,
    # memory held outside the address space (RLIMIT_AS counts only what is mapped; a detached SysV segment lives
    # on): SysV shared memory, message queues and semaphores, POSIX message queues
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
    "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241,
    "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
}  # fmt: skip
"""System calls that end the run (x86_64 numbers, from arch/x86/entry/syscalls/syscall_64.tbl)."""
ENOSYS_X86_64 = {"clone3": 435}
"""System calls that fail with ENOSYS, so that libc falls back to an older one."""
SOCKET_CALLS_X86_64 = {"socket": 41, "socketpair": 53}
"""System calls whose first argument is a socket family, checked against ``SOCKET_FAMILIES``."""
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
"""The only socket families the code may create: local sockets (asyncio's self-pipe, ``socketpair``) and IP, which
the network namespace covers. ``AF_NETLINK`` fails with EAFNOSUPPORT (glibc's resolver copes); any other family
(``AF_VSOCK``, which no network namespace covers, ``AF_PACKET``, ``AF_ALG``, ...) ends the run."""
AF_NETLINK = 16
EAFNOSUPPORT = 97


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter


def program(machine: str | None = None) -> bytes | None:
    """The filter as raw ``struct sock_filter`` entries for ``bwrap --seccomp``; ``None`` where there is none.

    Args:
        machine: ``platform.machine()`` of the machine that runs it; default: this one.
    """
    if (machine or platform.machine()) not in ("x86_64", "amd64"):
        return None
    insns = [
        _insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, RET_KILL_PROCESS),  # a 32-bit (int 0x80) system call: other numbers, so none at all
        _insn(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _insn(_JGE_K, 0, 1, X32_SYSCALL_BIT),
        _insn(_RET_K, 0, 0, RET_KILL_PROCESS),  # the x32 ABI: the same calls under other numbers
    ]
    for numbers, action in ((KILLED_X86_64, RET_KILL_PROCESS), (ENOSYS_X86_64, RET_ERRNO | ENOSYS)):
        for nr in sorted(numbers.values()):
            insns += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, action)]
    families = sorted(SOCKET_FAMILIES.values())
    # socket/socketpair: load the family (the call number is no longer needed: every path below returns)
    checks = [_insn(_LD_W_ABS, 0, 0, _ARG0_LOW)]
    for family in families:
        checks += [_insn(_JEQ_K, 0, 1, family), _insn(_RET_K, 0, 0, RET_ALLOW)]
    checks += [_insn(_JEQ_K, 0, 1, AF_NETLINK), _insn(_RET_K, 0, 0, RET_ERRNO | EAFNOSUPPORT)]
    checks.append(_insn(_RET_K, 0, 0, RET_KILL_PROCESS))
    calls = sorted(SOCKET_CALLS_X86_64.values())
    for i, nr in enumerate(calls):  # jump over the other calls' tests and the final allow, into the checks
        insns.append(_insn(_JEQ_K, len(calls) - i, 0, nr))
    insns.append(_insn(_RET_K, 0, 0, RET_ALLOW))
    insns += checks
    return b"".join(insns)
