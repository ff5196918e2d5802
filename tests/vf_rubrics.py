"""The rubrics and data of the verifiers environments built for tests/test_verifiers.py, without verifiers.

vf_reply_tasks.py and vf_dialogue_tasks.py (imported by the verifiers worker, in .venv-verifiers) score with these;
the test (in .venv, which has no verifiers) recomputes the rewards with them from what the server answered.
"""

from __future__ import annotations

QUESTIONS = ("What is 2+2?", "Name a colour.", "Say hello.")
WORDS = ("apple", "river", "stone", "cloud")
TURNS = 3


def reply_score(reply: str) -> float:
    """A number in [0, 1) that changes with any character of the reply."""
    return (sum(map(ord, reply)) % 97) / 97


def dialogue_score(replies: list[str]) -> float:
    """How many replies say their word, plus a term that changes with every character said."""
    said = sum(word in reply for word, reply in zip(WORDS, replies, strict=False))
    return said + (sum(ord(c) for reply in replies for c in reply) % 89) / 89
