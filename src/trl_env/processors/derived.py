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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_env.errors import ProcessorError
from trl_env.processors.base import FamilyProcessor, Processor, StopStrings

_USERS = ("Xq7 first user", "Xq7 second user", "Xq7 third user")
_REPLIES = ("Zr5 first reply", "Zr5 second reply")
_SYSTEM = "Sy9 probe system"


@dataclass(frozen=True)
class TemplateProcessor(FamilyProcessor):
    """Prefixes and suffixes read off a chat template by ``from_tokenizer``; renders any user text between them."""

    system_prompt: str | None = None
    """System message; ``None`` renders the template's opening for a conversation without one."""
    stop_strings: tuple[str, ...] = ()
    """The end-of-turn token the template writes after a reply."""
    first_user: tuple[str, str] = ("", "")
    """Text before and after the first user message, without a system message."""
    first_user_with_system: tuple[str, str, str] | None = None
    """Text before the system message, between it and the first user message, and after; ``None``: no system role."""
    next_user: tuple[str, str] = ("", "")
    """Text after a reply's end-of-turn token and before the next user message, and after it."""
    strip_messages: bool = False
    """The template strips whitespace around messages (Jinja's ``| trim``)."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a reasoning block in a reply; ``None`` for none."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action, e.g. ``("<answer>", "</answer>")``; ``None``: the text after the reasoning."""

    def _clean(self, text: str) -> str:
        return text.strip() if self.strip_messages else text

    def init_system_input(self, prompt: str) -> str:
        """Render the opening as the template does for ``[system?, user]`` with a generation prompt."""
        if self.system_prompt is None:
            return f"{self.first_user[0]}{self._clean(prompt)}{self.first_user[1]}"
        if self.first_user_with_system is None:
            raise ProcessorError(
                f"this chat template has no system role, but system_prompt={self.system_prompt!r:.60}; put the "
                "instructions in the env's first observation instead."
            )
        before, between, after = self.first_user_with_system
        return f"{before}{self._clean(self.system_prompt)}{between}{self._clean(prompt)}{after}"

    def append_user_input(self, prompt: str) -> str:
        """Render the template's text after a reply's end-of-turn token, the user turn, the generation prompt."""
        return f"{self.next_user[0]}{self._clean(prompt)}{self.next_user[1]}"


def from_tokenizer(
    tokenizer: Any,
    *,
    system_prompt: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Processor:
    """The processor for ``tokenizer``'s chat template: a registered family if it renders the same, else derived.

    A family is recognised when, with and without a system prompt and over three user turns, its
    opening equals the template's rendering and each appended user turn equals what the template
    writes after the reply's end-of-turn token (without ``system_prompt``, a family that matches
    without a system prompt will do). Families that render identically are tried in ``PROCESSORS``
    order (Qwen3 in thinking mode renders exactly as ChatML, and is returned as
    ``ChatMLProcessor``). Otherwise a ``TemplateProcessor`` is derived.

    Args:
        tokenizer: a Hugging Face tokenizer with a ``chat_template``.
        system_prompt: the processor's system prompt.
        template_kwargs: extra variables for the template, e.g. ``{"enable_thinking": False}``.

    Returns:
        A family processor, or a ``TemplateProcessor``.

    Raises:
        ProcessorError: the tokenizer has no chat template, the template does not copy messages
            verbatim, writes no end-of-turn token after a reply, or is not append-only (the
            message names the turn and the characters that differ).
    """
    from trl_env.processors import PROCESSORS  # the registry imports this module

    if not getattr(tokenizer, "chat_template", None):
        raise ProcessorError(
            f"{type(tokenizer).__name__} has no chat_template; set tokenizer.chat_template or pick a processor by "
            f"name: {', '.join(PROCESSORS)}."
        )
    kwargs = dict(template_kwargs or {})
    # With a system prompt to render, a family must match with and without one; without, only without.
    for systems in ((None, _SYSTEM), (None,)) if system_prompt is None else ((None, _SYSTEM),):
        for factory in PROCESSORS.values():
            if _renders_like(factory, tokenizer, kwargs, systems):
                return factory(system_prompt=system_prompt)
    try:
        derived = _derive(tokenizer, kwargs, need_system=system_prompt is not None)
    except ProcessorError as e:
        close = [name for name, f in PROCESSORS.items() if _renders_like(f, tokenizer, kwargs, (None,))]
        if not close:
            raise
        raise ProcessorError(
            f"{e} Without a system prompt, this template renders like {', '.join(close)}; see that processor's "
            "docs for where it writes a system prompt."
        ) from None
    return dataclasses.replace(derived, system_prompt=system_prompt)


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


def _conversation(system: str | None, turns: int) -> list[dict[str, str]]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    for k in range(turns):
        if k:
            messages.append({"role": "assistant", "content": _REPLIES[k - 1]})
        messages.append({"role": "user", "content": _USERS[k]})
    return messages


def _renders_like(factory: Any, tokenizer: Any, kwargs: dict[str, Any], systems: tuple[str | None, ...]) -> bool:
    for system in systems:
        processor = factory(system_prompt=system)
        stop = processor.stop_strings[0] if isinstance(processor, StopStrings) and processor.stop_strings else ""
        try:
            if render(tokenizer, _conversation(system, 1), kwargs) != processor.init_system_input(_USERS[0]):
                return False
            for k in (2, 3):
                expected = _REPLIES[k - 2] + stop + processor.append_user_input(_USERS[k - 1])
                if not render(tokenizer, _conversation(system, k), kwargs).endswith(expected):
                    return False
        except Exception:  # noqa: BLE001  # a template that refuses a probe (e.g. no system role) is not this family
            return False
    return True


def _derive(tokenizer: Any, kwargs: dict[str, Any], *, need_system: bool) -> TemplateProcessor:
    first = render(tokenizer, _conversation(None, 1), kwargs)
    first_user = _around(first, _USERS[0], "the first user message")
    padded = render(tokenizer, [{"role": "user", "content": f" \n{_USERS[0]}\n "}], kwargs)
    strip = padded == first
    if not strip and padded != f"{first_user[0]} \n{_USERS[0]}\n {first_user[1]}":
        raise ProcessorError(
            "the chat template changes the user message beyond stripping whitespace: rendering "
            f"{' ' + chr(10) + _USERS[0] + chr(10) + ' '!r} gave {padded!r:.200}; write a processor for it."
        )
    second = render(tokenizer, _conversation(None, 2), kwargs)
    _check_prefix(first + _REPLIES[0], second, turn=2)
    tail = second[len(first) + len(_REPLIES[0]) :]
    stop = _end_of_turn(tokenizer, tail)
    next_user = _around(tail[len(stop) :], _USERS[1], "the second user message")
    appended = stop + next_user[0] + _USERS[2] + next_user[1]
    third = render(tokenizer, _conversation(None, 3), kwargs)
    _check_prefix(second + _REPLIES[1] + appended, third, turn=3, exact=True)

    with_system: tuple[str, str, str] | None = None
    try:
        opening = render(tokenizer, _conversation(_SYSTEM, 1), kwargs)
        before, rest = _around(opening, _SYSTEM, "the system message")
        between, after = _around(rest, _USERS[0], "the first user message after the system message")
        expected = opening
        for k in (2, 3):
            expected += _REPLIES[k - 2] + stop + next_user[0] + _USERS[k - 1] + next_user[1]
            _check_prefix(expected, render(tokenizer, _conversation(_SYSTEM, k), kwargs), turn=k, exact=True)
        with_system = (before, between, after)
    except Exception as e:  # noqa: BLE001  # e.g. Gemma 2's "System role not supported", or not append-only
        if need_system:
            raise ProcessorError(f"with a system prompt: {e}") from e
    return TemplateProcessor(
        stop_strings=(stop,),
        first_user=first_user,
        first_user_with_system=with_system,
        next_user=next_user,
        strip_messages=strip,
    )


def _around(text: str, needle: str, what: str) -> tuple[str, str]:
    if text.count(needle) != 1:
        raise ProcessorError(
            f"the chat template does not write {what} verbatim once (found {text.count(needle)} times in "
            f"{text!r:.300}); write a processor for it (see docs/processors.md)."
        )
    before, _, after = text.partition(needle)
    return before, after


def _end_of_turn(tokenizer: Any, tail: str) -> str:
    """The special token the template writes right after a reply: the token the model must stop on."""
    ids = tokenizer.encode(tail, add_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(tokenizer.get_added_vocab().values())
    if ids and ids[0] in special:
        stop = str(tokenizer.decode(ids[:1], skip_special_tokens=False))
        if tail.startswith(stop):
            return stop
    raise ProcessorError(
        f"the chat template writes {tail[:40]!r} after an assistant reply, which does not start with a special "
        "token; the engine needs an end-of-turn token to stop on and to join turns at. Write a processor for it."
    )


def first_difference(a: str | list[int], b: str | list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _check_prefix(expected: str, actual: str, *, turn: int, exact: bool = False) -> None:
    """Refuse unless ``actual`` starts with (or, ``exact``, equals) ``expected``, naming the first difference."""
    if actual.startswith(expected) and (not exact or actual == expected):
        return
    i = first_difference(expected, actual)
    lo = max(0, i - 30)
    raise ProcessorError(
        f"the chat template is not append-only at user turn {turn}: rendering the longer conversation changes "
        f"what the engine's history already holds. At character {i}, the history continues "
        f"{expected[lo : i + 30]!r}, the template writes {actual[lo : i + 30]!r}. trl-env keeps sampled tokens "
        "and never re-renders; pick a family processor (trl_env.processors.PROCESSORS) or write one."
    )
