"""Episode failures said in words: the first error of each kind with its message, and steps that failed whole.

A failed episode ends only itself (``Ending.ERROR``, out of the learning signal), which keeps one bad env from ending
a run, but also lets a misconfigured run (a chat template that cannot render the request, budgets that leave no
room) train on nothing with only a metric to show for it. ``FailureLog`` says what failed, once per kind and then
at doubling counts; ``config_failure`` names a step in which every episode failed for one configuration reason,
which the trainers stop on (``stop_on_config_failure``); ``cut_at_first_turn`` one whose every episode the token
budget cut at its first turn (said, not stopped on, except for agent programs: none got an answer). ``trl-env
eval`` prints the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from trl_env.backends.base import FinishReason
from trl_env.errors import ConfigError
from trl_env.rollout.records import Ending, Rollout

__all__ = ["CONFIG_KINDS", "ConfigFailureError", "FailureLog", "config_failure", "cut_at_first_turn"]

logger = logging.getLogger("trl_env")

CONFIG_KINDS = ("processor_error", "prompt_error")
"""Error kinds (``trl_env.errors.ERROR_KINDS``) that fail every episode alike when the set-up is wrong: a processor
or chat template that cannot render what the env asks for, a dataset row that cannot become a seed."""

HINT_STRICT = "run with strict=True to raise the first such error with its traceback"


class ConfigFailureError(ConfigError):
    """Every episode of a step failed for one configuration reason; training would go on with nothing to learn."""


def first_line(error: str, limit: int = 400) -> str:
    """The message part of ``Rollout.error`` (it ends with the last lines of the traceback), at most ``limit``."""
    message = error.split("\nTraceback", 1)[0].strip().splitlines()
    text = " ".join(line.strip() for line in message[:4])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_failure(rollouts: Sequence[Rollout]) -> str | None:
    """Why every episode of ``rollouts`` failed for one configuration reason, in words with the fix; else ``None``.

    The reasons: every episode failed with one kind of ``CONFIG_KINDS`` (the first message is quoted), every agent
    program's episode ended at its first call, cut by the token budget (no program got an answer: the fix is
    ``parse_truncated_turns=True``), or every opening prompt left no room within the budgets.
    """
    if not rollouts:
        return None
    n = len(rollouts)
    kinds = {r.info.get("error_kind") if r.ending is Ending.ERROR else None for r in rollouts}
    if len(kinds) == 1 and (kind := kinds.pop()) in CONFIG_KINDS:
        return (
            f"every episode of this step ({n}) failed with {kind}: {first_line(rollouts[0].error)} "
            f"({HINT_STRICT}; docs/troubleshooting.md)"
        )
    if all(_is_agent(r) for r in rollouts) and cut_at_first_turn(rollouts) is not None:
        tokens = max(r.turns[0].num_model_tokens for r in rollouts)
        return (
            f"every agent episode of this step ({n}) ended at its first model call, cut by the token budget at "
            f"{tokens} tokens, so no program got an answer: pass parse_truncated_turns=True (a cut call is answered "
            "with finish_reason='length', as the API does) or raise max_new_tokens"
        )
    if all(r.ending is Ending.LENGTH and not r.turns and "prompt_too_long" in r.info for r in rollouts):
        sizes = sorted(int(r.info["prompt_too_long"]) for r in rollouts)
        return (
            f"every episode of this step ({n}) ended before its first turn: the opening prompt ({sizes[0]} to "
            f"{sizes[-1]} tokens) leaves no room within the budgets; raise max_context or max_completion_tokens, "
            "or shorten the env's first observation and the system prompt"
        )
    return None


def _is_agent(rollout: Rollout) -> bool:
    """Whether ``rollout`` is an agent program's episode (``AgentEnv`` reports its calls in its info)."""
    env_info = rollout.info.get("env")
    return isinstance(env_info, dict) and "agent_calls" in env_info


def cut_at_first_turn(rollouts: Sequence[Rollout]) -> str | None:
    """In words, when every episode was cut by the token budget at its first model turn and ended there; else None.

    The env never saw an action, so every reward is the reset's and the step has nothing to learn from. Said, not
    stopped on: an untrained policy (a random test model) can be cut on every turn of a run with sane settings.
    """
    cut = [
        r.ending is Ending.LENGTH
        and len(r.turns) == 1
        and r.turns[0].finish_reason is FinishReason.LENGTH
        and r.turns[0].action is None
        for r in rollouts
    ]
    if not rollouts or not all(cut):
        return None
    tokens = max(r.turns[0].num_model_tokens for r in rollouts)
    return (
        f"every episode of this step ({len(rollouts)}) was cut by the token budget at its first model turn ({tokens} "
        "tokens) and ended there, so the env never saw an action: raise max_new_tokens, or pass "
        "parse_truncated_turns=True to give a cut turn to the env as its action"
    )


class FailureLog:
    """Says in words why episodes failed, rate-limited: each error kind's first message, then its count at 2, 4, 8...

    Call it once per step with the step's rollouts. With ``stop_on_config_failure`` (the default) a step that
    ``config_failure`` names raises ``ConfigFailureError``; otherwise it is said, as a step ``cut_at_first_turn``
    names is (the first time, then at doubling counts).
    """

    def __init__(
        self,
        *,
        stop_on_config_failure: bool = True,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """``say`` receives each message (default: a warning on the ``trl_env`` logger)."""
        self.stop_on_config_failure = stop_on_config_failure
        self.say = say or logger.warning
        self.failed: dict[str, int] = {}
        """Episodes failed so far, per error kind (and ``config`` for steps ``config_failure`` names)."""
        self.firsts: dict[str, str] = {}
        """The first error message of each kind."""

    def __call__(self, rollouts: Sequence[Rollout], *, step: int | None = None) -> None:
        """Say what failed in this step's ``rollouts``; stop on a configuration failure.

        Raises:
            ConfigFailureError: every episode of the step failed for one configuration reason, and
                ``stop_on_config_failure`` is set.
        """
        where = "" if step is None else f" at step {step}"
        by_kind: dict[str, list[Rollout]] = {}
        for r in rollouts:
            if r.ending is Ending.ERROR:
                by_kind.setdefault(str(r.info.get("error_kind", "env_exception")), []).append(r)
        for kind, failed in sorted(by_kind.items()):
            before = self.failed.get(kind, 0)
            after = self.failed[kind] = before + len(failed)
            if not before:
                self.firsts[kind] = first_line(failed[0].error)
                self.say(
                    f"trl-env: {len(failed)} of {len(rollouts)} episodes failed{where} with {kind} (out of the "
                    f"learning signal): {self.firsts[kind]} ({HINT_STRICT})"
                )
            elif _doubled(before, after):
                first = self.firsts[kind]
                self.say(f"trl-env: {after} episodes have failed with {kind} so far{where}; the first: {first}")
        reason = config_failure(rollouts)
        if reason is not None and self.stop_on_config_failure:
            raise ConfigFailureError(
                f"trl-env stopped training{where}: {reason}. To train on regardless, pass stop_on_config_failure=False."
            )
        for key, said in (("config", reason), ("cut_at_first_turn", cut_at_first_turn(rollouts))):
            if said is not None:
                before = self.failed.get(key, 0)
                self.failed[key] = before + 1
                if not before or _doubled(before, before + 1):
                    self.say(f"trl-env{where}: {said}")


def _doubled(before: int, after: int) -> bool:
    """Whether a power of two lies in ``(before, after]``: said at counts 2, 4, 8, ... only."""
    return before.bit_length() < after.bit_length()
