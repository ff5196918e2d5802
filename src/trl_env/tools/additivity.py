"""Measure the seed's assumption tok(a + b) == tok(a) + tok(b) for a tokenizer and processor, and template drift.

``check_additivity`` replays conversations the way the engine builds its token history (the ids of
``init_system_input``, then per turn the reply's ids = tok(reply + end-of-turn) and the ids of
``append_user_input``) and counts: boundaries where tokenising the joined text differs from
joining the tokens; turn prompts whose history differs from ``apply_chat_template`` of the same
conversation (templates that drop earlier reasoning always do); and turns where the processor's
appended text differs from what the template writes for the newest turn (a wrong processor).
``RolloutCheck`` runs the same comparison on live rollouts and warns once.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_env.render.processors.base import FamilyProcessor
from trl_env.render.processors.derived import first_difference, history_stop, render

_WORDS = (
    "the a guess number higher lower correct try again answer is my your move left right up down step "
    "think so then because 42 7 1000 3.14 -5 café naïve 日本語 → ✓ 😀 ß é — … x y z"
).split()


@dataclass(frozen=True)
class Conversation:
    """A conversation to replay: the env's texts and the model's replies between them."""

    user: tuple[str, ...]
    """The first observation, then the env's answer after each reply."""
    replies: tuple[str, ...]
    """The model's text per turn, without the end-of-turn token; one fewer than ``user``."""


@dataclass(frozen=True)
class Mismatch:
    """Where two token sequences first differ, with decoded context."""

    kind: str
    """``"reply join"``, ``"env join"``, ``"history"``, ``"text"`` or ``"increment"``."""
    conversation: int
    turn: int
    """1-based user turn (the prompt of model turn ``turn``)."""
    position: int
    """Index of the first differing token (for ``"text"`` and ``"increment"``: character)."""
    engine: str
    """The engine's side around ``position``: token pieces, or text."""
    reference: str
    """The same span of the reference: tok(a + b), the template's ids, or the template's text."""

    def __str__(self) -> str:
        return (
            f"{self.kind} mismatch, conversation {self.conversation}, turn {self.turn}, at {self.position}: "
            f"engine {self.engine} vs reference {self.reference}"
        )


@dataclass(frozen=True)
class AdditivityReport:
    """Counts and first examples from ``check_additivity``."""

    conversations: int
    joins: int
    """Joins of each kind checked (one of each per model turn)."""
    reply_join_mismatches: int
    """prompt | reply + end-of-turn: tok(a + b) != tok(a) + tok(b). The engine never re-tokenises here."""
    env_join_mismatches: int
    """reply + end-of-turn | appended env text: the join the engine relies on."""
    prompts: int
    """Turn prompts compared with the template (one per model turn)."""
    history_drifts: int
    """Turn prompts whose ids differ from the template's ids for the same conversation."""
    text_drifts: int
    """Of those, prompts whose text differs too (the template rewrote earlier turns, not just re-tokenised)."""
    increment_mismatches: int
    """Turns whose opening or appended env text differs from the template's text for that turn."""
    first: dict[str, Mismatch] = field(default_factory=dict)
    """The first mismatch of each kind."""

    @property
    def env_join_mismatch_rate(self) -> float:
        """Share of env joins where tok(a + b) != tok(a) + tok(b): the seed's assumption, where the engine needs it."""
        return self.env_join_mismatches / max(1, self.joins)

    @property
    def reply_join_mismatch_rate(self) -> float:
        """Share of prompt | reply joins where re-tokenising the text would change the ids."""
        return self.reply_join_mismatches / max(1, self.joins)

    @property
    def history_drift_rate(self) -> float:
        """Share of turn prompts whose ids differ from the template's rendering of the conversation."""
        return self.history_drifts / max(1, self.prompts)

    @property
    def text_drift_rate(self) -> float:
        """Share of turn prompts whose text differs from the template's rendering."""
        return self.text_drifts / max(1, self.prompts)

    @property
    def increment_mismatch_rate(self) -> float:
        """Share of turn prompts whose newest text differs from the template's."""
        return self.increment_mismatches / max(1, self.prompts)

    def summary(self) -> str:
        """A few lines for humans: the rates and the first mismatch of each kind."""
        lines = [
            f"{self.conversations} conversations, {self.prompts} turn prompts, {self.joins} joins of each kind",
            f"env join mismatch    {self.env_join_mismatch_rate:7.2%}  tok(a + b) != tok(a) + tok(b), reply+eot | env",
            f"reply join mismatch  {self.reply_join_mismatch_rate:7.2%}  the same at prompt | reply+eot",
            f"history drift        {self.history_drift_rate:7.2%}  engine ids != apply_chat_template ids",
            f"  text drift         {self.text_drift_rate:7.2%}  engine text != template text (template rewrites)",
            f"increment mismatch   {self.increment_mismatch_rate:7.2%}  processor text != template text, newest turn",
        ]
        lines += [f"first {m}" for m in self.first.values()]
        return "\n".join(lines)


def sample_conversations(n: int = 300, *, seed: int = 0, processor: Any = None) -> list[Conversation]:
    """Generate ``n`` conversations of 2 to 5 turns with awkward text.

    Env texts mix words, numbers, unicode, and leading and trailing whitespace (half of them
    each); replies too, with leading or trailing whitespace in one in ten. With a processor that has
    ``render_agent_output(reasoning, action)``, a third of the replies carry a reasoning block in
    the family's syntax.
    """
    rng = random.Random(seed)
    render_reply = getattr(processor, "render_agent_output", None)

    def text(space: float = 0.5) -> str:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 9))) + rng.choice(["", ".", "?", "!"])
        start = rng.choice([" ", "  ", "\n", "\t"]) if rng.random() < space else ""
        return start + words + (rng.choice([" ", "\n", "\n\n"]) if rng.random() < space else "")

    conversations = []
    for _ in range(n):
        turns = rng.randint(2, 5)
        replies = []
        for _ in range(turns - 1):
            reply = text(space=0.1)  # a model rarely opens or ends its turn with whitespace
            if render_reply is not None and rng.random() < 1 / 3:
                reply = str(render_reply(text().strip(), reply.lstrip()))
            replies.append(reply)
        conversations.append(Conversation(tuple(text() for _ in range(turns)), tuple(replies)))
    return conversations


def check_additivity(
    tokenizer: Any,
    processor: Any,
    conversations: Sequence[Conversation],
    *,
    template_kwargs: Mapping[str, Any] | None = None,
) -> AdditivityReport:
    """Replay ``conversations`` as the engine would and compare with re-tokenisation and the chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        processor: the processor the engine would use.
        conversations: e.g. from ``sample_conversations``.
        template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``.

    Returns:
        The counts, rates and the first mismatch of each kind.
    """
    replay = _Replay(tokenizer, processor, template_kwargs)
    for c, conversation in enumerate(conversations):
        replay.conversation(c, conversation)
    counts, first, joins, prompts = replay.counts, replay.first, replay.joins, replay.prompts
    return AdditivityReport(
        conversations=len(conversations),
        joins=joins,
        reply_join_mismatches=counts["reply join"],
        env_join_mismatches=counts["env join"],
        prompts=prompts,
        history_drifts=counts["history"],
        text_drifts=counts["text"],
        increment_mismatches=counts["increment"],
        first=first,
    )


class _Replay:
    """``check_additivity``'s state: replays conversations turn by turn and records the first mismatch of each kind."""

    def __init__(self, tokenizer: Any, processor: Any, template_kwargs: Mapping[str, Any] | None) -> None:
        self.tokenizer, self.processor, self.template_kwargs = tokenizer, processor, template_kwargs
        family = processor if isinstance(processor, FamilyProcessor) else None
        self.stop = (family.reply_end if family else "") + _stop_string(processor, tokenizer)  # as sampled
        self.rendered_stop = history_stop(processor)  # as the template writes it after a past reply
        self.reasoning_field = family.reasoning_field if family else None
        self.system = getattr(processor, "system_prompt", None)
        self.counts = dict.fromkeys(("reply join", "env join", "history", "text", "increment"), 0)
        self.first: dict[str, Mismatch] = {}
        self.joins = self.prompts = 0

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def record(self, kind: str, c: int, turn: int, position: int, engine: str, reference: str) -> None:
        self.counts[kind] += 1
        self.first.setdefault(kind, Mismatch(kind, c, turn, position, engine, reference))

    def conversation(self, c: int, conversation: Conversation) -> None:
        messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        text, ids = "", list[int]()
        for turn, user in enumerate(conversation.user, start=1):
            if turn == 1:
                segments = [self.processor.init_system_input(user)]
            else:
                reply = conversation.replies[turn - 2]
                messages.append(self.assistant_message(reply))
                segments = [reply + self.stop, self.processor.append_user_input(user)]
                self.joins += 1
            messages.append({"role": "user", "content": user})
            text, ids = self.joined(c, turn, segments, text, ids)
            self.prompts += 1
            self.compare(c, turn, segments, messages, text, ids)

    def assistant_message(self, reply: str) -> dict[str, str]:
        """The reply as a message; split into reasoning and content where the template wants them apart (gpt-oss)."""
        if self.reasoning_field is None:
            return {"role": "assistant", "content": reply}
        reasoning, action = self.processor.parse_agent_output(reply + self.stop)
        return {"role": "assistant", "content": action, self.reasoning_field: reasoning}

    def joined(self, c: int, turn: int, segments: list[str], text: str, ids: list[int]) -> tuple[str, list[int]]:
        """Append the segments as the engine does; count where tok(a + b) != tok(a) + tok(b)."""
        kinds = ("prompt",) if turn == 1 else ("reply join", "env join")
        for kind, segment in zip(kinds, segments, strict=True):
            segment_ids = self.encode(segment)
            if text:  # tok(a + b) against tok(a) + tok(b), with a = the history's text
                joined, separate = self.encode(text + segment), self.encode(text) + segment_ids
                if joined != separate:
                    i = first_difference(separate, joined)
                    tok = self.tokenizer
                    self.record(kind, c, turn, i, _pieces(tok, separate, i), _pieces(tok, joined, i))
            text, ids = text + segment, ids + segment_ids
        return text, ids

    def compare(
        self, c: int, turn: int, segments: list[str], messages: list[dict[str, str]], text: str, ids: list[int]
    ) -> None:
        """Compare the history with the template's rendering: ids, text, and the newest increment."""
        reference = render(self.tokenizer, messages, self.template_kwargs)
        reference_ids = self.encode(reference)
        if reference_ids != ids:
            i = first_difference(ids, reference_ids)
            tok = self.tokenizer
            self.record("history", c, turn, i, _pieces(tok, ids, i), _pieces(tok, reference_ids, i))
            if reference != text:
                j = first_difference(text, reference)
                self.record("text", c, turn, j, _around(text, j), _around(reference, j))
        newest = segments[-1] if turn == 1 else self.rendered_stop + segments[-1]
        if not (reference == newest if turn == 1 else reference.endswith(newest)):
            tail = reference[-len(newest) :] if turn > 1 else reference
            i = first_difference(newest, tail)
            self.record("increment", c, turn, i, _around(newest, i), _around(tail, i))


def check_rollout(
    rollout: Any,
    tokenizer: Any,
    processor: Any,
    *,
    first_observation: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Mismatch | None:
    """Compare one finished ``Rollout``'s ids with the template's rendering of its conversation.

    The history is compared up to the last generation prompt (after the last env text). The first
    observation is not stored in a ``Rollout``; without ``first_observation`` it is read back from
    ``prompt_ids`` between the processor's opening and its assistant header.

    Returns:
        The first difference, or ``None`` when the ids agree (or the rollout is a placeholder).
    """
    if rollout.info.get("placeholder"):
        return None
    stop = _stop_string(processor, tokenizer)
    if first_observation is None:
        first_observation = _observation(tokenizer.decode(rollout.prompt_ids, skip_special_tokens=False), processor)
    system = getattr(processor, "system_prompt", None)
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": first_observation})
    kept, offset = 0, 0
    for turn in rollout.turns:
        offset += turn.num_model_tokens + turn.num_env_tokens
        if not turn.num_env_tokens or turn.delta is None:
            break
        reply = turn.text[: -len(stop)] if stop and turn.text.endswith(stop) else turn.text
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": turn.delta}]
        kept = offset
    ids = list(rollout.prompt_ids) + list(rollout.completion_ids[:kept])
    reference = list(tokenizer.encode(render(tokenizer, messages, template_kwargs), add_special_tokens=False))
    if ids == reference:
        return None
    i = first_difference(ids, reference)
    return Mismatch(
        "history",
        0,
        (len(messages) - 1 - (system is not None)) // 2 + 1,
        i,
        _pieces(tokenizer, ids, i),
        _pieces(tokenizer, reference, i),
    )


class RolloutCheck:
    """Checks a sample of live rollouts against the chat template and warns once with the first difference.

    Cheap: one template rendering and one tokenisation per checked rollout. Call it on each batch
    of rollouts (e.g. in ``make_rollout_func`` right after ``batch_rollout``).
    """

    def __init__(
        self, tokenizer: Any, processor: Any, *, every: int = 64, template_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.tokenizer, self.processor, self.every = tokenizer, processor, max(1, every)
        self.template_kwargs = template_kwargs
        self.seen = 0
        self.mismatches: list[Mismatch] = []
        """Every difference found so far (only the first is warned about)."""

    def __call__(self, rollouts: Sequence[Any]) -> None:
        """Check every ``every``-th rollout; warn (``UserWarning``) at the first difference."""
        for rollout in rollouts:
            self.seen += 1
            if (self.seen - 1) % self.every:
                continue
            found = check_rollout(rollout, self.tokenizer, self.processor, template_kwargs=self.template_kwargs)
            if found is None:
                continue
            if not self.mismatches:
                warnings.warn(
                    f"trl-env: a rollout's token history differs from the chat template's rendering of the same "
                    f"conversation ({type(self.processor).__name__}): {found}. Training uses what was sampled; "
                    "expected for templates that drop earlier reasoning (Qwen3, DeepSeek-R1, Gemma 4), otherwise "
                    "check the processor with `trl-env additivity`. Warned once.",
                    stacklevel=2,
                )
            self.mismatches.append(found)


def _stop_string(processor: Any, tokenizer: Any) -> str:
    stops = getattr(processor, "stop_strings", ())
    return str(stops[0]) if stops else str(tokenizer.eos_token or "")


def _pieces(tokenizer: Any, ids: Sequence[int], i: int, width: int = 4) -> str:
    """Token pieces around position ``i``, the first differing one marked with ``>>``."""
    lo = max(0, i - width)
    pieces = [repr(tokenizer.decode([t], skip_special_tokens=False)) for t in ids[lo : i + width]]
    if i - lo < len(pieces):
        pieces[i - lo] = ">>" + pieces[i - lo]
    return "[" + " ".join(pieces) + "]"


def _around(text: str, i: int, width: int = 20) -> str:
    return repr(text[max(0, i - width) : i + width])


def _observation(prompt_text: str, processor: Any) -> str:
    """Read the first observation back from a rendered opening (the processor's own text around it)."""
    marker = "\x00observation\x00"
    before, _, after = processor.init_system_input(marker).partition(marker)
    if prompt_text.startswith(before) and prompt_text.endswith(after):
        return prompt_text[len(before) : len(prompt_text) - len(after)]
    return prompt_text
