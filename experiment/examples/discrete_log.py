"""Level 3, tool use: find x with g^x = h (mod p), running Python in a sandbox before answering.

The seed's own example, re-imagined. The env draws a prime p, a primitive root g and a secret x from its
seed (so every copy of a GRPO group gets the same problem). Each turn the model may run Python written as
<code>...</code> (or a ```python block): it runs in `trl_env.sandbox.Sandbox` (a process inside bubblewrap:
its own namespaces, seccomp, CPU/memory/disk limits, no network, output capped), never in the trainer, and its output or
the tool error is the next observation. <answer>x</answer> ends the episode. Reward: 1.0 for a correct x
(any x with g^x = h mod p); otherwise 0.1 for an integer answer plus 0.2 if some code ran cleanly; minus
0.1 for each turn with neither tag.

Hardware: a CPU for the smoke run; to learn, a GPU and a 0.5B+ instruct model (a 135M model rarely writes
working code). Needs bubblewrap (`pip install -e ".[sandbox]"`). See docs/examples.md.
Run:      python experiment/examples/discrete_log.py --model tiny --steps 2     # smoke run, seconds
          python experiment/examples/discrete_log.py --model Qwen/Qwen2.5-0.5B-Instruct \\
              --vllm-server http://127.0.0.1:8000    # after `trl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct`
"""

from __future__ import annotations

import os
import random
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

from trl_env import Action, ChatMLProcessor, Delta, Env, Seed
from trl_env.sandbox import Sandbox, SandboxResult, SandboxStatus

PRIMES = [n for n in range(101, 1000) if all(n % d for d in range(2, int(n**0.5) + 1))]  # p is drawn from these
MAX_TURNS = 3
SANDBOX = Sandbox(cpu_seconds=2, wall_seconds=5, memory_bytes=256 * 2**20, max_output_bytes=1000)
SYSTEM_PROMPT = (
    "You solve discrete logarithms. You may run Python: write <code>...</code> and you will see what it "
    "prints (no network, no files outside its folder, 2 s of CPU). When you know x, reply <answer>x</answer>."
)
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
CODE = re.compile(r"<code>(.*?)(?:</code>|\Z)|```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def primitive_root(p: int, rng: random.Random) -> int:
    """A random generator of the multiplicative group mod the prime ``p``."""
    factors = {d for d in range(2, p) if (p - 1) % d == 0 and all(d % q for q in range(2, d))}
    while True:
        g = rng.randint(2, p - 2)
        if all(pow(g, (p - 1) // q, p) != 1 for q in factors):
            return g


def tool_observation(result: SandboxResult, sandbox: Sandbox = SANDBOX) -> str:
    """What the model sees after its code ran: the output, or a tool error saying what went wrong."""
    out = result.stdout.strip() + ("\n[output truncated]" if result.truncated else "")
    if result.status is SandboxStatus.OK:
        return "Tool output:\n" + (out or "(nothing printed: print the values you need)")
    reason = {
        SandboxStatus.TIMEOUT: f"the code ran past its limit ({sandbox.cpu_seconds} s CPU, {sandbox.wall_seconds} s)",
        SandboxStatus.MEMORY: f"the code ran out of memory ({sandbox.memory_bytes >> 20} MiB)",
        SandboxStatus.REFUSED: f"{result.refused} is not allowed (no network, subprocesses or outside files)",
        SandboxStatus.KILLED: f"the process was killed by signal {-result.exit_code}",
    }.get(result.status)
    if reason is None:  # ERROR: the last lines of the traceback, or the exit code
        reason = "\n".join(result.stderr.strip().splitlines()[-4:]) or f"exit code {result.exit_code}"
    return f"Tool error ({result.status.value}): {reason}" + (f"\nOutput before the error:\n{out}" if out else "")


class DiscreteLogEnv(Env):
    """Find x with g^x = h (mod p); Python runs in a sandbox as a tool."""

    def __init__(self, sandbox: Sandbox = SANDBOX, max_turns: int = MAX_TURNS) -> None:
        self.sandbox, self.max_turns = sandbox, max_turns
        self.reward, self.alive = 0.0, True
        self.p = self.g = self.h = self.secret = self.turns = 0
        self.ran_ok, self.penalty = False, 0.0

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        rng = random.Random(seed)
        self.p = rng.choice(PRIMES)
        self.g = primitive_root(self.p, rng)
        self.secret = rng.randint(2, self.p - 2)
        self.h = pow(self.g, self.secret, self.p)
        self.reward, self.alive, self.turns, self.ran_ok, self.penalty = 0.0, True, 0, False, 0.0
        return self, f"Find an integer x with {self.g}^x = {self.h} (mod {self.p}). You have {self.max_turns} turns."

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.turns += 1
        answers = ANSWER.findall(action)
        if answers:  # an answer ends the episode (code in the same turn is not run)
            self.alive, answer = False, answers[-1]
            well_formed = re.fullmatch(r"[+-]?\d{1,9}", answer) is not None
            correct = well_formed and pow(self.g, int(answer), self.p) == self.h
            self.reward = 1.0 - self.penalty if correct else self._partial(well_formed=well_formed)
            return self, "Correct!" if correct else f"Wrong: {self.g}^{self.secret} = {self.h} (mod {self.p})."
        code = CODE.search(action)
        if code is not None:
            result = self.sandbox.run(code.group(1) if code.group(1) is not None else code.group(2))
            self.ran_ok = self.ran_ok or result.ok
            observation = tool_observation(result, self.sandbox)
        else:
            self.penalty += 0.1
            observation = "Write <code>...</code> to run Python, or <answer>x</answer> to answer."
        self.alive = self.turns < self.max_turns
        self.reward = self._partial(well_formed=False)
        left = self.max_turns - self.turns
        return self, f"{observation}\n{left} turn{'s' * (left != 1)} left." if self.alive else observation

    def _partial(self, *, well_formed: bool) -> float:
        return 0.1 * well_formed + 0.2 * self.ran_ok - self.penalty


def main(argv: list[str] | None = None) -> dict[str, float]:
    from training import example_parser, train  # experiment/training.py: the shared GRPO run and its report

    args = example_parser(__doc__, name="discrete_log", steps=30).parse_args(argv)
    smoke = args.model == "tiny"  # a random model: short turns keep the smoke run to seconds
    return train(
        "discrete_log",
        args,
        DiscreteLogEnv,
        ChatMLProcessor(system_prompt=SYSTEM_PROMPT),
        seed_format="dlog-{i}",
        max_completion_length=96 if smoke else 512,
        learning_rate=1e-5,
        max_turns=MAX_TURNS,
        max_new_tokens=24 if smoke else 160,
        parse_truncated_turns=True,  # a cut turn still runs its (unclosed) code block
    )


if __name__ == "__main__":
    main()
