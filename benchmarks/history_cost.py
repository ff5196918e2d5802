"""Client time per episode of history="deployed" against "sampled", and against "deployed" as of a git revision.

Offline, CPU: 8 episodes, one env worker, an instant sampler (each turn's ids precomputed, already resolved), the real
Qwen 2.5 tokenizer and template (ChatML replies) and Qwen 3's (replies that reason: a thought and a digit), and Qwen 3
with native tool calls (a ``ToolEnv`` with one tool; every reply thinks and makes one call, every answer is its
result). "before":
``src/trl_env/render/history.py`` at ``--before`` (default 7b6fd20, before issue 32 item 4) loaded as a module and put in the engine's place.
Client time = process CPU time of ``batch_rollout``, best of ``--repeat``. Run:
``python benchmarks/history_figures.py --cost 10 40 100 [--before REV] [--repeat 3]``.

``--opcodes``: instead, Python opcodes per episode (every thread), which no load changes.

``--against REV``: instead, the whole of ``src/`` at ``REV`` (``git archive``) against the working tree, side by side
in one run: for each template and length, one child process per side (``PYTHONPATH`` = that side's ``src``), run
alternately, each timing sampled and deployed runs alternately and keeping the best of ``--repeat`` of each.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import itertools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from trl_env import FinishReason, Generation
from trl_env.adapters.tool_env import ToolEnv
from trl_env.backends.base import resolved
from trl_env.render.processors import get_processor
from trl_env.render.tools.processor import ToolProcessor
from trl_env.rollout import Budgets, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

EPISODES = 8
ROOT = Path(__file__).resolve().parents[1]


class InstantSampler:
    """The same reply for every request, its ids computed once: what it costs is the library's, not the sampler's."""

    continuous = False
    context_limit = None

    def __init__(self, tokenizer, text: str) -> None:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        self.generation = Generation(ids, [-0.5] * len(ids), FinishReason.STOP)

    def submit(self, requests):
        return [resolved(self.generation) for _ in requests]


class GuessEnv:
    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Game {seed}: guess the hidden number, one digit per turn."

    def step(self, action):
        self.turn += 1
        return (
            self,
            f"Turn {self.turn}: {action.strip()} is wrong, the hint is {'higher' if self.turn % 2 else 'lower'}.",
        )


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def tool_env():
    return ToolEnv([add])


def history_before(rev: str):
    """``DeployedHistory`` as ``src/trl_env/render/history.py`` was at ``rev``, adapted to the engine's calls."""
    source = subprocess.run(["git", "show", f"{rev}:src/trl_env/render/history.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "history_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("trl_env.rollout.history_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from trl_env.render.conversation import Conversation

    class Before(module.DeployedHistory):
        def extend(self, previous, messages):  # today's engine calls extend; before, it called encode
            return Conversation(messages, "", self.encode(messages))

    return Before


def client_seconds(tokenizer, processor, reply: str, turns: int, history: str, repeat: int, env=GuessEnv) -> float:
    budgets = Budgets(max_turns=turns, max_new_tokens=256, max_completion_tokens=10**6)
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        rollouts = batch_rollout([str(i) for i in range(EPISODES)], env, processor, tokenizer,
                                 InstantSampler(tokenizer, reply), budgets=budgets, history=history,
                                 env_workers=1)  # fmt: skip
        best = min(best, time.process_time() - started)
        assert all(len(r.turns) == turns for r in rollouts), [len(r.turns) for r in rollouts]
    return best / EPISODES


def opcodes(tokenizer, processor, reply: str, turns: int, history: str, env=GuessEnv) -> float:
    """Python opcodes per episode of ``batch_rollout``, every thread (``sys.settrace``): what no load changes.

    The per-call work of C code (the tokenizer's Rust encode) is not counted: read it beside the times.
    """
    counter = itertools.count()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        return count

    def count(frame, event, arg):
        if event == "opcode":
            next(counter)  # atomic under the GIL
        return count

    budgets = Budgets(max_turns=turns, max_new_tokens=256, max_completion_tokens=10**6)
    threading.settrace(trace)
    sys.settrace(trace)
    try:
        batch_rollout([str(i) for i in range(EPISODES)], env, processor, tokenizer,
                      InstantSampler(tokenizer, reply), budgets=budgets, history=history, env_workers=1)  # fmt: skip
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return next(counter) / EPISODES


def count_opcodes(turns_list: list[int]) -> None:
    """``--opcodes``: Python opcodes per episode, sampled and deployed, after a warm-up batch of each."""
    print(f"Python opcodes per episode ({EPISODES} episodes, 1 env worker, every thread; warm: a batch of each before)")
    print(f"{'template':28} {'turns':>5} {'sampled':>9} {'deployed':>9} {'ratio':>6}")
    for label, name, proc, reply in CASES:
        tokenizer, processor, env, text = setup(name, proc, reply)
        for warm in ("sampled", "deployed"):
            client_seconds(tokenizer, processor, text, 2, warm, 1, env)
        for turns in turns_list:
            got = {h: opcodes(tokenizer, processor, text, turns, h, env) for h in ("sampled", "deployed")}
            print(f"{label:28} {turns:5d} {got['sampled']:9.0f} {got['deployed']:9.0f} "
                  f"{got['deployed'] / got['sampled']:5.2f}x", flush=True)  # fmt: skip


CASES = (("Qwen 2.5 (ChatML)", "pypi:qwen2_5", "qwen2_5", "7"),
         ("Qwen 3, replies that reason", "pypi:qwen3", "qwen3",
          "<think>\nThe middle of what is left is the next guess, so 7.\n</think>\n\n7"),
         ("Qwen 3, a tool call per turn", "pypi:qwen3", "qwen3+tools",
          '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'))  # fmt: skip


def setup(name: str, proc: str, reply: str):
    """A case's tokenizer, processor, env factory and reply text (with the stop string that ends it)."""
    tokenizer = load_tokenizer(name)
    if proc.endswith("+tools"):
        processor = ToolProcessor.from_tokenizer(tokenizer, [add], system_prompt="Use the tools.")
        return tokenizer, processor, tool_env, reply + "<|im_end|>"
    processor = get_processor(proc)
    return tokenizer, processor, GuessEnv, reply + processor.stop_strings[0]


def cell(case: int, turns: int, repeat: int) -> dict[str, float]:
    """Client seconds per episode of sampled and deployed, runs alternating, best of ``repeat`` each (in a child)."""
    _, name, proc, reply = CASES[case]
    tokenizer, processor, env, text = setup(name, proc, reply)
    for warm in ("sampled", "deployed"):
        client_seconds(tokenizer, processor, text, 2, warm, 1, env)
    best = {"sampled": float("inf"), "deployed": float("inf")}
    for _ in range(repeat):
        for history in best:
            best[history] = min(best[history], client_seconds(tokenizer, processor, text, turns, history, 1, env))
    return best


def against(rev: str, turns_list: list[int], repeat: int) -> None:
    """``src/`` at ``rev`` against the working tree's, side by side (see the module docstring)."""
    tar = subprocess.run(["git", "archive", "--format=tar", rev, "src"], cwd=ROOT, check=True, capture_output=True)
    old = Path(tempfile.mkdtemp())
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(old, filter="data")
    sides = {rev: old / "src", "now": ROOT / "src"}

    def run(src: Path, case: int, turns: int) -> dict[str, float]:
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT / 'tests'}"}
        out = subprocess.run([sys.executable, __file__, "--cell", str(case), str(turns), str(repeat)], env=env,
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        return json.loads(out.strip().splitlines()[-1])

    print(f"client ms per episode ({EPISODES} episodes, 1 env worker, best of {repeat}); src at {rev} vs now")
    print(f"{'template':28} {'turns':>5} | {'sampled':>8} {'deployed':>8} {'ratio':>6} | {'sampled':>8} {'deployed':>8} "
          f"{'ratio':>6}")  # fmt: skip
    for case, (label, *_) in enumerate(CASES):
        for turns in turns_list:
            got = {side: run(src, case, turns) for side, src in sides.items()}
            cols = [f"{got[s]['sampled'] * 1e3:8.1f} {got[s]['deployed'] * 1e3:8.1f} "
                    f"{got[s]['deployed'] / got[s]['sampled']:5.2f}x" for s in sides]  # fmt: skip
            print(f"{label:28} {turns:5d} | {cols[0]} | {cols[1]}", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("turns", nargs="*", type=int, default=[10, 40, 100])
    parser.add_argument("--before", default="7b6fd20")
    parser.add_argument("--against", default=None, help="a git revision whose whole src/ is measured beside now")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--opcodes", action="store_true", help="count Python opcodes per episode instead of time")
    args = parser.parse_args(argv)
    if args.opcodes:
        return count_opcodes(args.turns)
    if args.against is not None:
        return against(args.against, args.turns, args.repeat)
    import trl_env.rollout.engine as engine

    now, before = engine.DeployedHistory, history_before(args.before)
    cases = CASES
    print(f"client ms per episode ({EPISODES} episodes, 1 env worker); deployed before = {args.before}")
    print(f"{'template':28} {'turns':>5} {'sampled':>8} {'before':>8} {'now':>8} {'before/s':>8} {'now/s':>6}")
    for label, name, proc, reply in cases:
        tokenizer, processor, env, text = setup(name, proc, reply)
        for warm in ("sampled", "deployed"):  # the engine's tokenizer copy and the template's compilation, once
            client_seconds(tokenizer, processor, text, 2, warm, 1, env)
        for turns in args.turns:
            sampled = client_seconds(tokenizer, processor, text, turns, "sampled", args.repeat, env)
            new = client_seconds(tokenizer, processor, text, turns, "deployed", args.repeat, env)
            engine.DeployedHistory = before  # last: its whole renderings churn the heap the next runs allocate in
            try:
                old = client_seconds(tokenizer, processor, text, turns, "deployed", args.repeat, env)
            finally:
                engine.DeployedHistory = now
            print(f"{label:28} {turns:5d} {sampled * 1e3:8.1f} {old * 1e3:8.1f} {new * 1e3:8.1f} "
                  f"{old / sampled:7.1f}x {new / sampled:5.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__" and sys.argv[1:2] == ["--cell"]:  # a child of --against
    print(json.dumps(cell(*map(int, sys.argv[2:5]))))
