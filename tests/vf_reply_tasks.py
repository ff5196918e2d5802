"""A verifiers 0.4 taskset built for tests/test_verifiers.py: one question per task, scored by its own rubric.

verifiers loads a taskset by importing the package its id names (``TasksetConfig(id="vf_reply_tasks")``), so this
module is that package: it exports its ``Taskset`` subclass through ``__all__``. The reward depends on every
character of the reply, so a test can recompute it from the replies the server gave (read off verifiers' own record
of the episode).
"""

from __future__ import annotations

import verifiers.v1 as vf
from vf_rubrics import QUESTIONS
from vf_rubrics import reply_score as score_reply


class ReplyTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def reply_score(self, task, trace) -> float:
        return score_reply(trace.last_reply)


class ReplyTaskset(vf.Taskset[ReplyTask, vf.TasksetConfig]):
    def load(self):
        for i, question in enumerate(QUESTIONS):
            yield ReplyTask(vf.TaskData(name=f"q{i}", prompt=question), self.config.task)


__all__ = ["ReplyTaskset"]
