"""Transcripts: every episode as one JSON line, written at once under a file lock (processes may share a file)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Any

from trl_env.rollout.records import Rollout


def write_transcripts(
    path: str | os.PathLike[str],
    rollouts: Sequence[Rollout],
    *,
    step: int | None = None,
    tokenizer: Any = None,
    process_index: int = 0,
    mode: str = "train",
) -> None:
    """Append one JSON line per episode to ``path``.

    A line holds the step, the process index, the mode (``train``/``eval``), seed, ending, reward, error, info,
    the turns (text, action, delta, reward) and, when ``tokenizer`` is given, the decoded ``conversation`` (the
    last training row: its context and completion) and, for an episode of several rows (``history="deployed"``),
    ``rows``: every row decoded, in turn order. The lines of one call are written at once under an exclusive file
    lock, so processes sharing the file never interleave.
    """
    lines = []
    for r in rollouts:
        record = {
            "step": step,
            "process_index": process_index,
            "mode": mode,
            "seed": r.seed,
            "ending": r.ending.value,
            "reward": r.reward,
            "error": r.error,
            "info": r.info,
            "turns": [
                {k: getattr(t, k) for k in ("text", "reasoning", "action", "delta", "reward", "num_model_tokens")}
                | {"finish_reason": t.finish_reason.value}
                for t in r.turns
            ],
        }
        if tokenizer is not None:
            texts = [tokenizer.decode(row.prompt_ids + row.completion_ids, skip_special_tokens=False) for row in r.rows]
            record["conversation"] = texts[-1]
            if len(texts) > 1:  # history="deployed": each training row, as the sampler saw it
                record["rows"] = texts
        lines.append(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f, _locked(f):
        f.write("".join(lines))


@contextlib.contextmanager
def _locked(f: IO[str]) -> Iterator[None]:
    """An exclusive advisory lock on an open file, where the platform has one (POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover  # Windows: appends of one write are not split in practice
        yield
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
        yield
        f.flush()
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
