"""A processor read off a tokenizer's own chat template: ``from_tokenizer``.

Renders probe conversations (with and without a system prompt, three user turns) through
``apply_chat_template``. A template that a registered family renders identically gets that
family's processor; otherwise the prefixes and suffixes around the probe messages become a
``TemplateProcessor``, provided the template is append-only (each turn's rendering extends the
previous one by the reply, its end-of-turn token and the new user turn). A template that rewrites
earlier turns is refused with the turn and the characters that differ.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_env.errors import ProcessorError
from trl_env.render.processors.base import FamilyProcessor, Processor, StopStrings

logger = logging.getLogger(__name__)

_USERS = ("Xq7 first user", "Xq7 second user", "Xq7 third user", "Xq7 fourth user")
_REPLIES = ("Zr5 first reply", "Zr5 second reply", "Zr5 third reply")
_SYSTEM = "Sy9 probe system"
_PADDED_USERS = (" \nXq7 fïrst üser\n ", "Xq7 sécond 用户  ", "\tXq7 third user\n\n", "Xq7 fourth user. ")
_PADDED_SYSTEM = "  Sy9 prøbe\nsystem "
_PAD = " \n"
"""Probes: plain ones to read the template's layout off, padded ones (whitespace, newlines, non-ASCII) to check it."""


@dataclass(frozen=True)
class TemplateProcessor(FamilyProcessor):
    """Prefixes and suffixes read off a chat template by ``from_tokenizer``; renders any user text between them."""

    system_prompt: str | None = None
    """System message; ``None`` renders the template's opening for a conversation without one."""
    stop_strings: tuple[str, ...] = ()
    """The end-of-turn token the model samples to end its turn."""
    first_user: tuple[str, str] = ("", "")
    """Text before and after the first user message, without a system message."""
    first_user_with_system: tuple[str, str, str] | None = None
    """Text before the system message, between it and the first user message, and after; ``None``: no system role."""
    next_user: tuple[str, str] = ("", "")
    """Text after a reply's end-of-turn token and before the next user message, and after it."""
    strip_messages: bool = False
    """The template strips whitespace around user messages (Jinja's ``| trim``)."""
    strip_system: bool = False
    """The template strips whitespace around the system message."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a reasoning block in a reply; ``None`` for none."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""
    reasoning_prefilled: bool = False
    """The generation prompt opens the reasoning block (e.g. ends with ``<think>\\n``): a turn starts inside it."""
    reply_end: str = ""
    """Special tokens the template writes between a reply and its end-of-turn token (Cohere 2:
    ``<|END_RESPONSE|>``); the model samples them, and a turn's action ends there."""
    rendered_stop: str | None = None
    """What the template writes after a past reply *instead of* the sampled stop token (gpt-oss writes ``<|end|>``
    where the model sampled ``<|return|>``): drift, reported by ``template_drift``; ``None``: the same."""

    def prompt_opens_reasoning(self) -> bool:
        """Whether the generation prompt leaves a reasoning block open."""
        return self.reasoning_prefilled

    def prompt_closes_reasoning(self) -> bool:
        """Whether the generation prompt ends with a closed (empty) reasoning block, e.g. ``<think></think>``."""
        return self.reasoning_tags is not None and self.first_user[1].rstrip().endswith(self.reasoning_tags[1])

    def turn_end_markers(self) -> tuple[str, ...]:
        """Where a turn's text ends: ``reply_end`` (if any), then the stop token."""
        return (self.reply_end, *self.stop_strings) if self.reply_end else self.stop_strings

    def init_system_input(self, prompt: str) -> str:
        """Render the opening as the template does for ``[system?, user]`` with a generation prompt."""
        user = prompt.strip() if self.strip_messages else prompt
        if self.system_prompt is None:
            return f"{self.first_user[0]}{user}{self.first_user[1]}"
        if self.first_user_with_system is None:
            raise ProcessorError(
                f"this chat template has no system role, but system_prompt={self.system_prompt!r:.60}; put the "
                "instructions in the env's first observation instead."
            )
        before, between, after = self.first_user_with_system
        system = self.system_prompt.strip() if self.strip_system else self.system_prompt
        return f"{before}{system}{between}{user}{after}"

    def append_user_input(self, prompt: str) -> str:
        """Render the template's text after a reply's end-of-turn token, the user turn, the generation prompt."""
        user = prompt.strip() if self.strip_messages else prompt
        return f"{self.next_user[0]}{user}{self.next_user[1]}"


def history_stop(processor: Processor) -> str:
    """What the template writes right after a past reply: the processor's ``rendered_stop``, else its stop string."""
    if isinstance(processor, FamilyProcessor):
        return processor.history_stop()
    return processor.stop_strings[0] if isinstance(processor, StopStrings) and processor.stop_strings else ""


def from_tokenizer(
    tokenizer: Any,
    *,
    system_prompt: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Processor:
    """The processor for ``tokenizer``'s chat template: a registered family if it renders the same, else derived.

    Everything is checked at the *generation boundary*, where trl-env renders: the opening must equal
    the template's rendering of ``[system?, user]`` with the generation prompt, and the text after a
    reply must equal what the template writes after a past reply's end-of-turn token, for three later
    user turns, with plain probes and with probes padded with whitespace, newlines and non-ASCII.
    Templates that rewrite *earlier* turns (drop reasoning, pre-fill ``<think>``) are served: trl-env
    never re-renders history, and ``template_drift`` reports (and this logs) what a re-rendering changes.
    A family is recognised when it renders like the template (with and without a system prompt when one
    is asked for); families that render identically are tried in ``PROCESSORS`` order. Otherwise a
    ``TemplateProcessor`` is derived from the renderings.

    Args:
        tokenizer: a Hugging Face tokenizer with a ``chat_template``.
        system_prompt: the processor's system prompt.
        template_kwargs: extra variables for the template, e.g. ``{"enable_thinking": False}``.

    Returns:
        A family processor, or a ``TemplateProcessor``.

    Raises:
        ProcessorError: the tokenizer has no chat template, or the template does not write messages verbatim
            (beyond trimming whitespace), writes no end-of-turn special token after a reply, or renders a later
            turn differently from the layout read off the first ones (the message names the turn and the text).
    """
    from trl_env.render.processors import PROCESSORS  # the registry imports this module

    if not getattr(tokenizer, "chat_template", None):
        raise ProcessorError(
            f"{type(tokenizer).__name__} has no chat_template; set tokenizer.chat_template or pick a processor by "
            f"name: {', '.join(PROCESSORS)}."
        )
    kwargs = dict(template_kwargs or {})
    need_system = system_prompt is not None
    # A family that also renders a system prompt like the template wins over one that matches only without.
    tries = [
        (f, with_system) for with_system in (True, False) for f in PROCESSORS.values() if with_system or not need_system
    ]
    family = next((f for f, with_system in tries if _renders_like(f, tokenizer, kwargs, with_system)), None)
    processor: Processor | None = None if family is None else family(system_prompt=system_prompt)
    if processor is None:
        try:
            derived = _derive(tokenizer, kwargs, need_system=need_system)
        except ProcessorError as e:
            close = [name for name, f in PROCESSORS.items() if _renders_like(f, tokenizer, kwargs, False)]
            if not close or not need_system:
                raise
            raise ProcessorError(
                f"{e} Without a system prompt, this template renders like {', '.join(close)}; see that processor's "
                "docs for where it writes a system prompt."
            ) from None
        processor = dataclasses.replace(derived, system_prompt=system_prompt)
    drift = template_drift(tokenizer, processor, kwargs)
    if drift:
        logger.info("from_tokenizer: %s. trl-env keeps the sampled history; %s", type(processor).__name__, drift)
    return processor


def render(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: Mapping[str, Any] | None = None) -> str:
    """``apply_chat_template`` as text, with the generation prompt when the last message is the user's."""
    return str(
        tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=messages[-1]["role"] == "user",
            **dict(template_kwargs or {}),
        )
    )


def _conversation(
    system: str | None, turns: int, users: tuple[str, ...] = _USERS, replies: tuple[str, ...] = _REPLIES
) -> list[dict[str, str]]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    for k in range(turns):
        if k:
            messages.append({"role": "assistant", "content": replies[k - 1]})
        messages.append({"role": "user", "content": users[k]})
    return messages


def mismatch(
    processor: Processor,
    tokenizer: Any,
    template_kwargs: Mapping[str, Any] | None = None,
    *,
    system: str | None = None,
    users: tuple[str, ...] = _USERS,
    replies: tuple[str, ...] = _REPLIES,
) -> str | None:
    """Where ``processor`` (built with ``system``) renders unlike the template at the generation boundary, or ``None``.

    Compares its opening with the rendering of ``[system?, users[0]]`` and, for each later user turn, checks
    that the rendering ends with reply + ``history_stop`` + ``append_user_input(user)``.
    """
    stop = history_stop(processor)
    try:
        ours = processor.init_system_input(users[0])
        theirs = render(tokenizer, _conversation(system, 1, users, replies), template_kwargs)
        if ours != theirs:
            return f"the opening differs: {_difference(ours, theirs)}"
        for k in range(2, len(users) + 1):
            ours = replies[k - 2] + stop + processor.append_user_input(users[k - 1])
            theirs = render(tokenizer, _conversation(system, k, users, replies), template_kwargs)
            if not theirs.endswith(ours):
                return f"user turn {k} differs: {_difference(ours, theirs[-len(ours) :])}"
    except Exception as e:  # noqa: BLE001  # a template that refuses a probe (e.g. no system role) is a mismatch
        return f"{type(e).__name__}: {e}"
    return None


def template_drift(tokenizer: Any, processor: Processor, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """What re-rendering a 3-turn conversation changes in the history trl-env keeps ("" if nothing)."""
    system = getattr(processor, "system_prompt", None)
    history = processor.init_system_input(_USERS[0])
    for k in (1, 2):
        history += _REPLIES[k - 1] + history_stop(processor) + processor.append_user_input(_USERS[k])
    try:
        rendered = render(tokenizer, _conversation(system, 3), template_kwargs)
    except Exception as e:  # noqa: BLE001  # reported, not raised: drift is information
        return f"the template cannot re-render the history ({type(e).__name__}: {e})"
    return "" if rendered == history else f"a re-rendering of earlier turns differs: {_difference(history, rendered)}"


def _difference(ours: str, theirs: str) -> str:
    i = first_difference(ours, theirs)
    lo = max(0, i - 30)
    return f"at character {i}, trl-env writes {ours[lo : i + 30]!r}, the template {theirs[lo : i + 30]!r}"


def _renders_like(factory: Any, tokenizer: Any, kwargs: dict[str, Any], need_system: bool) -> bool:
    cases: list[tuple[str | None, tuple[str, ...]]] = [(None, _USERS), (None, _PADDED_USERS)]
    if need_system:
        cases += [(_SYSTEM, _USERS), (_PADDED_SYSTEM, _PADDED_USERS)]
    for system, users in cases:
        try:
            processor = factory(system_prompt=system)
        except Exception:  # noqa: BLE001  # a factory that cannot take this system prompt is not this template
            return False
        if mismatch(processor, tokenizer, kwargs, system=system, users=users) is not None:
            return False
    return True


def _derive(tokenizer: Any, kwargs: dict[str, Any], *, need_system: bool) -> TemplateProcessor:
    """Read the layout off renderings at the generation boundary, then check it on every probe."""
    first = render(tokenizer, _conversation(None, 1), kwargs)
    first_user = _around(first, _USERS[0], "the first user message")
    tail = _after(render(tokenizer, _conversation(None, 2), kwargs), _REPLIES[0], "the reply")
    stop, reply_end, rendered_stop = _end_of_turn(tokenizer, tail)
    written = rendered_stop or reply_end + stop
    next_user = _around(tail[len(written) :], _USERS[1], "the second user message")
    padded = render(tokenizer, [{"role": "user", "content": _PAD + _USERS[0] + _PAD}], kwargs)
    strip_user = _strips(padded, first, first_user, _USERS[0], "user")
    with_system, strip_system = _system_layout(tokenizer, kwargs)
    derived = TemplateProcessor(
        stop_strings=(stop,),
        reply_end=reply_end,
        rendered_stop=rendered_stop,
        first_user=first_user,
        first_user_with_system=with_system,
        next_user=next_user,
        strip_messages=strip_user,
        strip_system=strip_system,
        reasoning_prefilled=first_user[1].rstrip().endswith("<think>"),
    )
    cases: list[tuple[str | None, tuple[str, ...]]] = [(None, _USERS), (None, _PADDED_USERS)]
    if with_system is not None:
        cases += [(_SYSTEM, _USERS), (_PADDED_SYSTEM, _PADDED_USERS)]
    elif need_system:
        raise ProcessorError("the chat template has no system role (it refused or dropped a system message).")
    for system, users in cases:
        candidate = dataclasses.replace(derived, system_prompt=system)
        problem = mismatch(candidate, tokenizer, kwargs, system=system, users=users)
        if problem:
            raise ProcessorError(
                f"the chat template renders a later turn unlike its first ones ({problem}, system prompt "
                f"{system!r}, user texts {users!r:.80}); write a processor for it (see docs/processors.md)."
            )
    return derived


def _system_layout(tokenizer: Any, kwargs: dict[str, Any]) -> tuple[tuple[str, str, str] | None, bool]:
    """Text around the system message and the first user message, and whether the system message is trimmed."""
    try:
        opening = render(tokenizer, _conversation(_SYSTEM, 1), kwargs)
        before, rest = _around(opening, _SYSTEM, "the system message")
        between, after = _around(rest, _USERS[0], "the first user message after the system message")
        padded = render(tokenizer, _conversation(_PAD + _SYSTEM + _PAD, 1), kwargs)
        return (before, between, after), _strips(padded, opening, (before, rest), _SYSTEM, "system")
    except Exception:  # noqa: BLE001  # e.g. Gemma's "System role not supported", or the system text not verbatim
        return None, False


def _strips(padded: str, plain: str, around: tuple[str, str], probe: str, role: str) -> bool:
    """Whether the template trims whitespace around a ``role`` message; refuse any other change to it."""
    if padded == plain:
        return True
    if padded == f"{around[0]}{_PAD}{probe}{_PAD}{around[1]}":
        return False
    raise ProcessorError(
        f"the chat template changes the {role} message beyond stripping whitespace: rendering "
        f"{_PAD + probe + _PAD!r} gave {padded!r:.200}; write a processor for it."
    )


def _around(text: str, needle: str, what: str) -> tuple[str, str]:
    if text.count(needle) != 1:
        raise ProcessorError(
            f"the chat template does not write {what} verbatim once (found {text.count(needle)} times in "
            f"{text!r:.300}); write a processor for it (see docs/processors.md)."
        )
    before, _, after = text.partition(needle)
    return before, after


def _after(text: str, needle: str, what: str) -> str:
    return _around(text, needle, what)[1]


def _end_of_turn(tokenizer: Any, tail: str) -> tuple[str, str, str | None]:
    """The token the model stops on, the special tokens it samples before it, and what history writes instead.

    Read off the special tokens the template writes right after a reply. Usually the first one is the stop
    token. When the tokenizer's EOS token is written in the template source: EOS among those tokens ends the
    turn and the ones before it are sampled (Cohere 2's ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``); EOS absent
    means the template writes another token for the EOS the model sampled (gpt-oss: ``<|end|>`` for
    ``<|return|>``).
    """
    run = _leading_specials(tokenizer, tail)
    if not run:
        raise ProcessorError(
            f"the chat template writes {tail[:40]!r} after an assistant reply, which does not start with a special "
            "token; the engine needs an end-of-turn token to stop on and to join turns at. Write a processor for it."
        )
    eos = str(getattr(tokenizer, "eos_token", None) or "")
    if not eos or eos == run[0] or eos not in str(tokenizer.chat_template):
        return run[0], "", None
    if eos in run:
        return eos, "".join(run[: run.index(eos)]), None
    return eos, "", run[0]


def _leading_specials(tokenizer: Any, text: str) -> list[str]:
    """The special tokens ``text`` starts with, as strings."""
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(tokenizer.get_added_vocab().values())
    run: list[str] = []
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        piece = str(tokenizer.decode([token_id], skip_special_tokens=False))
        if token_id not in special or not text.startswith("".join(run) + piece):
            break
        run.append(piece)
    return run


def first_difference(a: str | list[int], b: str | list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
