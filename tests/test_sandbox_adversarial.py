"""trl_env.sandbox against an adversary: every attack in tests/sandbox_attacks.py, concurrently, next to victims.

A policy trained to maximise reward searches for whatever the sandbox lets it do. Each attack runs with the audit
hook on (the real configuration) and off (the kernel layers alone must hold); sibling sandboxes sleep meanwhile and
must survive. As root in-process; as an ordinary user through a system interpreter under `setpriv`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import sandbox_attacks

from trl_env.sandbox import Sandbox

pytestmark = [
    pytest.mark.slow,  # attack programs, each in a fresh sandbox
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only"),
]
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def assert_all_contained(outcomes, damage) -> None:
    escaped = [f"{o.name} (hook {'on' if o.audit_hook else 'off'}): {o.why}" for o in outcomes if not o.contained]
    assert not escaped and not damage, "\n".join(escaped + damage)


def test_the_suite_has_at_least_50_attacks_across_every_category():
    categories = {a.category for a in sandbox_attacks.ATTACKS}
    assert len(sandbox_attacks.ATTACKS) >= 50 and len({a.name for a in sandbox_attacks.ATTACKS}) == len(
        sandbox_attacks.ATTACKS
    )
    assert categories >= {"reads", "writes", "network", "processes", "native", "disable", "resources", "signals"}
    assert categories >= {"siblings", "root-side"}


def test_every_attack_is_contained_with_and_without_the_audit_hook():
    outcomes, damage = sandbox_attacks.run_suite(sandbox_attacks.attack_sandbox(Sandbox))
    assert_all_contained(outcomes, damage)
    by_name = {(o.name, o.audit_hook): o for o in outcomes}
    # what the kernel refuses is reported by the parent (SIGSYS), whatever the code does
    kernel_refused = ("mkfifo", "mknod-device", "memfd", "pidfd-siblings", "ctypes-mount", "ctypes-bpf")
    for name in (*kernel_refused, "sysv-shm-320m", "sysv-msg-queue", "posix-mq", "vsock"):
        assert by_name[name, False].status == "refused" and "seccomp" in by_name[name, False].refused, name
    # the hook's refusals are reported even when the code hides them (closed, replaced or flooded status channel)
    hidden = ("close-status-fd", "replace-status-fd", "flood-status-fd", "gc-hook-rewire", "setprofile-event")
    for name in (*hidden, "long-refusal-line", "hook-helper-defaults-none", "ctypes-other-name", "fake-end-memory"):
        assert by_name[name, True].status == "refused", name
    assert by_name["disk-fill", False].status == "ok" and by_name["sleep-forever", False].status == "timeout"
    # an exit code is the code's exit code, whatever number it picks (bwrap would pass it on as 128 + a signal)
    assert {by_name["exit-159", hook].status for hook in (True, False)} == {"error"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an ordinary user")
def test_every_attack_is_contained_as_an_ordinary_user():
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or subprocess.run([python, "-c", "import json"], capture_output=True).returncode:
        pytest.skip("no system python3 that an ordinary user can run")
    from trl_env.sandbox import find_bwrap

    here = tempfile.mkdtemp(prefix="trl_env_attack_user_")  # readable by the ordinary user (pytest's tmp is not)
    try:
        os.chmod(here, 0o755)
        shutil.copytree(os.path.join(SRC, "trl_env", "sandbox"), os.path.join(here, "trl_env", "sandbox"))
        shutil.copy(os.path.join(SRC, "trl_env", "errors.py"), os.path.join(here, "trl_env", "errors.py"))
        shutil.copy(sandbox_attacks.__file__, here)
        subprocess.run(["chmod", "-R", "a+rX", here], check=True)
        uid = 43210  # no such user: an ordinary uid with nothing of its own
        proc = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I", "sandbox_attacks.py",
             os.path.join(here), find_bwrap(None)],
            cwd=here, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if "Operation not permitted" in proc.stderr and "bwrap" in proc.stderr:
            pytest.skip(f"no unprivileged user namespaces here: {proc.stderr[-300:]}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        assert report["uid"] == uid
        outcomes = [sandbox_attacks.Outcome(**o) for o in report["outcomes"]]
        assert len(outcomes) == 2 * len(sandbox_attacks.ATTACKS)
        assert_all_contained(outcomes, report["damage"])
    finally:
        shutil.rmtree(here, ignore_errors=True)
