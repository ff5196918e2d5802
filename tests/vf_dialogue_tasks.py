"""A multi-turn verifiers 0.4 environment built for tests/test_verifiers.py: the env plays the user.

Like verifiers' bundled TextArena env, its ``Env.run(task, agents)`` opens an interaction with the one seat and
answers each reply with the next instruction ("Say: <word>") for ``TURNS`` turns; its rubric
(``trace.record_reward``) scores every reply. verifiers loads it by importing this module (taskset id
``vf_dialogue_tasks``), which exports the taskset and the env through ``__all__``.
"""

from __future__ import annotations

import verifiers.v1 as vf
from vf_rubrics import TURNS, WORDS, dialogue_score


class DialogueEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class DialogueEnv(vf.Env[DialogueEnvConfig]):
    async def run(self, task, agents):
        replies: list[str] = []
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                replies.append(segment.last_reply)
                if len(replies) == TURNS:
                    break
                segment = await interaction.turn(f"Say: {WORDS[len(replies)]}")
        interaction.trace.info["replies"] = replies
        interaction.trace.record_reward("dialogue", dialogue_score(replies))


class DialogueTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(name="say-words", prompt=f"Say: {WORDS[0]}"), self.config.task)


__all__ = ["DialogueEnv", "DialogueEnvConfig", "DialogueTaskset"]
