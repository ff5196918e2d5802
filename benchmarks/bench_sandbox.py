"""The sandbox's cost per run: the current source against the sandbox at another revision, interleaved, in one run.

``Sandbox().run(code)`` starts a fresh interpreter inside bubblewrap (namespaces, seccomp, rlimits, the audit
hook; since issue 36 also a monitor as PID 1) for every call, so its fixed cost is what a reward function pays per
completion. This script times ``Sandbox().run("pass")`` (the fixed cost) and a small realistic snippet (a Python
loop summing 10**5 ints, printed) for two sandboxes side by side: the current source (``src/`` of this working
tree) and the one at ``--against REV`` (default 37d30fd, the sandbox before issue 36's hardening), whose
``src/trl_env`` is extracted with ``git archive`` into a temporary folder.

Each variant runs in its own worker process, in which ``trl_env`` is a bare package whose ``__path__`` is that
variant's ``src/trl_env`` (its ``__init__`` is not run, so nothing but the sandbox and ``trl_env.errors`` is
imported, and each sandbox finds its own ``child.py`` next to its module). The workers take turns, one run at a
time: per repetition every snippet (shuffled order) runs once in each variant (shuffled order), so a ratio
new/old compares two runs made back to back under the same load. The first round warms up and is dropped.
Wall time is measured around ``run``; CPU time is the worker's own plus its waited-for children's (bwrap and
everything inside it), per run.

    python benchmarks/bench_sandbox.py                 # ~1 min: 20 interleaved runs per variant and snippet
    python benchmarks/bench_sandbox.py --against HEAD~3 --runs 50

Needs what the sandbox needs: Linux, bubblewrap (``pip install -e ".[sandbox]"``), root or user namespaces.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

SNIPPETS = {
    "pass": ("pass", ""),
    "sum loop 10**5": ("s = 0\nfor i in range(10**5):\n    s += i\nprint(s)", f"{sum(range(10**5))}\n"),
}
"""name -> (code, the stdout it must print)."""

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ the worker


def worker(package_dir: str) -> None:
    """Serve runs from stdin: one snippet name per line in, one JSON line per run out (``--worker DIR``)."""
    package = types.ModuleType("trl_env")
    package.__path__ = [package_dir]  # a bare package: trl_env/__init__.py (and its heavy imports) never runs
    sys.modules["trl_env"] = package
    from trl_env.sandbox import Sandbox  # noqa: PLC0415  (after the bare package is in place)

    sandbox = Sandbox()
    out = sys.stdout
    out.write(json.dumps({"ready": True, "module": sys.modules["trl_env.sandbox"].__file__}) + "\n")
    out.flush()
    for line in sys.stdin:
        code, expected = SNIPPETS[line.strip()]
        cpu0, children0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        try:
            result = sandbox.run(code)
        except Exception as e:  # noqa: BLE001  # reported to the parent (SandboxUnavailableError above all)
            out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
            out.flush()
            return
        wall = time.perf_counter() - t0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        cpu = time.process_time() - cpu0 + children
        reply: dict[str, object] = {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000}
        if result.status.value != "ok" or result.stdout != expected:
            reply["error"] = (
                f"{result.status.value} exit {result.exit_code}: {result.stdout[-200:]!r} {result.stderr[-500:]!r}"
            )
        out.write(json.dumps(reply) + "\n")
        out.flush()


class Worker:
    """A worker process for one variant's ``src/trl_env``."""

    def __init__(self, package_dir: Path) -> None:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(package_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        self.module = self._reply()["module"]

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a sandbox worker exited ({self.proc.wait()}); its stderr is above")
        reply = json.loads(line)
        if "error" in reply:
            raise SystemExit(f"sandbox run failed: {reply['error']}")
        return reply

    def run(self, snippet: str) -> dict:
        self.proc.stdin.write(snippet + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ------------------------------------------------------------------------------------------ the parent


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def extract(rev: str, into: Path) -> Path:
    """``src/trl_env`` at ``rev`` (the whole package, so the sandbox's own imports resolve), under ``into``."""
    if subprocess.run(["git", "cat-file", "-e", f"{rev}:src/trl_env/sandbox"], cwd=REPO).returncode:
        raise SystemExit(f"{rev} has no src/trl_env/sandbox/")
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "src/trl_env"], cwd=REPO, check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src" / "trl_env"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import random  # noqa: PLC0415
    import statistics  # noqa: PLC0415

    from _common import base_parser, machine_notes, markdown_table, out_dir, plt, save_json  # noqa: PLC0415

    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--against", default="37d30fd", help="git revision of the other sandbox (default 37d30fd)")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per variant and snippet (default 20)")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs or args.reps or 20
    rev = git("rev-parse", "--short", f"{args.against}^{{commit}}")
    head = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", "src/trl_env/sandbox"))
    new, old = f"current ({head}{' + edits' if dirty else ''})", f"{rev} (--against)"
    notes = machine_notes()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="trl-env-bench-sandbox-") as tmp:
        workers = {new: Worker(REPO / "src" / "trl_env"), old: Worker(extract(rev, Path(tmp)))}
        times: dict[tuple[str, str], list[dict]] = {(s, v): [] for s in SNIPPETS for v in workers}
        started = time.perf_counter()
        try:
            for rep in range(runs + 1):  # round 0 warms up (page cache, the workers' first fork) and is dropped
                snippets = list(SNIPPETS)
                rng.shuffle(snippets)
                for snippet in snippets:
                    variants = list(workers)
                    rng.shuffle(variants)
                    for variant in variants:
                        reply = workers[variant].run(snippet)
                        if rep:
                            times[snippet, variant].append(reply)
        finally:
            for w in workers.values():
                w.close()
        took = time.perf_counter() - started
    rows, data = [], []
    for snippet in SNIPPETS:
        ratios = [n["wall_ms"] / o["wall_ms"] for n, o in zip(times[snippet, new], times[snippet, old], strict=True)]
        cpu_ratios = [n["cpu_ms"] / o["cpu_ms"] for n, o in zip(times[snippet, new], times[snippet, old], strict=True)]
        for variant in (old, new):
            wall = [r["wall_ms"] for r in times[snippet, variant]]
            cpu = [r["cpu_ms"] for r in times[snippet, variant]]
            ratio = "-" if variant == old else (
                f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f}); "
                f"CPU {statistics.median(cpu_ratios):.2f}"
            )  # fmt: skip
            rows.append([snippet, variant, len(wall), f"{min(wall):.1f}", f"**{statistics.median(wall):.1f}**",
                         f"{max(wall):.1f}", f"{statistics.median(cpu):.1f}", ratio])  # fmt: skip
            data.append({"snippet": snippet, "variant": variant, "wall_ms": wall, "cpu_ms": cpu,
                         "ratios_new_old": ratios if variant == new else None})  # fmt: skip
    print(f"Sandbox().run(code), {runs} interleaved runs per variant and snippet after a warm-up round, "
          f"{took:.0f} s in all; {notes}")  # fmt: skip
    print(f"current: {workers[new].module}\n{rev}: {workers[old].module} (extracted with git archive)\n")
    print(markdown_table(["snippet", "sandbox", "runs", "min ms", "median ms", "max ms", "CPU ms (median)",
                          "new / old wall: median of paired ratios (min-max)"], rows))  # fmt: skip
    out = out_dir(args)
    save_json(out / "bench_sandbox.json", {"args": vars(args), "against": rev, "head": head, "dirty": dirty,
                                           "machine": notes, "seconds": took, "results": data})  # fmt: skip
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(SNIPPETS), figsize=(8, 3.5))
    for ax, snippet in zip(axes, SNIPPETS, strict=True):
        values = [[r["wall_ms"] for r in times[snippet, v]] for v in (old, new)]
        ax.boxplot(values, showfliers=False)
        for i, vals in enumerate(values, start=1):
            ax.scatter(
                [i + rng.uniform(-0.12, 0.12) for _ in vals], vals, s=8, alpha=0.6, color=["#888", "#2a7"][i - 1]
            )
        ax.set_xticks([1, 2], [old.split(" ")[0], new.split(" (")[0]])
        ax.set_title(f"run({snippet!r})" if snippet == "pass" else snippet, fontsize=9)
        ax.set_ylabel("ms per run")
    fig.suptitle(f"Sandbox.run: {rev} vs current, {runs} interleaved runs each", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "bench_sandbox.png", dpi=120)


if __name__ == "__main__":
    main()
