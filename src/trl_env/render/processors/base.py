"""The seed's Processor protocol (per-model-family chat formatting) and helpers shared by processors.

A processor renders text; the engine tokenises it. Besides the seed's three methods, a processor
tells the engine where a model turn ends with an optional ``stop_strings`` attribute (see
``stop_token_ids``); family processors live in ``trl_env.render.processors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Protocol, runtime_checkable

from trl_env.env import Language
from trl_env.errors import ConfigError, ProcessorError


@runtime_checkable
class Processor(Protocol):
    r"""Chat formatting for one model family, exactly as the seed defines it.

    ``init_system_input(prompt)`` renders the opening of a conversation around the env's first
    observation (system block if any, the user turn, the assistant header). ``append_user_input``
    renders what follows a finished model turn: the close of that turn as the template writes it,
    the next user turn and the next assistant header. ``parse_agent_output`` splits the text of
    one model turn into ``(reasoning, action)``; malformed output is data, never an exception.

    Optionally, ``stop_strings: tuple[str, ...]`` names the end-of-turn markers (each one token of
    the tokenizer, e.g. ``"<|im_end|>"``); without it the tokenizer's EOS token ends a turn.

    Example::

        p = ChatMLProcessor()
        p.init_system_input("Guess a number.")
        # '<|im_start|>user\\nGuess a number.<|im_end|>\\n<|im_start|>assistant\\n'
        p.parse_agent_output("<think>50 is the middle</think>50<|im_end|>")
        # ('50 is the middle', '50')
    """

    def init_system_input(self, prompt: Language) -> str:
        """Render the start of a conversation whose first user message is ``prompt``."""
        ...

    def append_user_input(self, prompt: Language) -> str:
        """Render the text appended after a model turn for the user message ``prompt``."""
        ...

    def parse_agent_output(self, completion: Language) -> tuple[str, str]:
        """Split one model turn into ``(reasoning, action)``."""
        ...


@runtime_checkable
class StopStrings(Protocol):
    """A processor that names its end-of-turn markers (each one token, e.g. ``"<|im_end|>"``)."""

    stop_strings: tuple[str, ...]


def check_processor(processor: object) -> None:
    """Fail early when ``processor`` lacks one of the seed's methods.

    Raises:
        ProcessorError: naming the class, the missing method and the fix.
    """
    for method in ("init_system_input", "append_user_input", "parse_agent_output"):
        if not callable(getattr(processor, method, None)):
            raise ProcessorError(
                f"{type(processor).__name__} has no method {method}(prompt); a processor needs "
                "init_system_input, append_user_input and parse_agent_output. Use a processor from "
                "trl_env.render.processors (e.g. ChatMLProcessor()) or add the method."
            )


def stop_token_ids(processor: object, tokenizer: object) -> tuple[int, ...]:
    """The token ids that end a model turn: the processor's ``stop_strings`` plus the tokenizer's EOS.

    Raises:
        ConfigError: if a stop string is not exactly one token of ``tokenizer``.
    """
    ids: list[int] = []
    for text in processor.stop_strings if isinstance(processor, StopStrings) else ():
        # split_special_tokens=False: a stop string is read as the model's token whatever state other code left
        # the tokenizer in (tokenizer.split_special_tokens=True would split '<|im_end|>' into 6 plain tokens)
        encoded = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False)  # type: ignore[attr-defined]  # any HF tokenizer
        if len(encoded) != 1:
            raise ConfigError(
                f"{type(processor).__name__}.stop_strings has {text!r}, which the tokenizer splits into "
                f"{len(encoded)} tokens {encoded}; a stop string must be one (special) token. The tokenizer "
                "probably belongs to another model family: pick the processor that matches it."
            )
        ids.append(encoded[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(int(eos))
    if not ids:
        raise ConfigError(
            f"neither {type(processor).__name__}.stop_strings nor the tokenizer's eos_token_id names an end "
            "of turn; set `stop_strings` on the processor or `tokenizer.eos_token`."
        )
    return tuple(dict.fromkeys(ids))


def split_reasoning(
    text: str,
    *,
    open_tag: str = "<think>",
    close_tag: str = "</think>",
    strip: tuple[str, ...] = (),
) -> tuple[str, str]:
    """Split ``text`` into ``(reasoning, action)`` around a thinking block.

    ``strip`` lists end markers removed from the end of the text first (e.g. ``"<|im_end|>"``).
    The block ends at the last closing tag (as in ``parse_output``). A turn that opens a block but
    never closes it (cut mid-thought) is all reasoning, with an empty action: half a thought must
    never be taken as the action.
    """
    for marker in strip:
        if marker and text.endswith(marker):
            text = text[: -len(marker)]
            break
    head, sep, tail = text.rpartition(close_tag)  # the last close, as parse_output
    if sep:
        return head.replace(open_tag, "", 1).strip(), tail.strip()
    if open_tag in text:
        return text.split(open_tag, 1)[1].strip(), ""
    return "", text.strip()


class FamilyProcessor:
    """What every family processor shares: parsing a turn and rendering one back, from its markers.

    A family is a frozen dataclass that subclasses this and states only what differs: its turn
    layout (``init_system_input``, ``append_user_input``), its ``stop_strings``, and where they
    differ, ``end_markers`` (other end-of-text tokens), ``reasoning_tags`` and
    ``reasoning_open_in_prompt``.
    """

    stop_strings: tuple[str, ...] = ()
    """End-of-turn markers; each must be one token."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Markers of a reasoning block; ``None`` for none."""
    action_tags: tuple[str, str] | None = None
    """Markers around the action; ``None``: the text after the reasoning."""
    end_markers: ClassVar[tuple[str, ...]] = ()
    """End-of-text tokens besides ``stop_strings`` that end a turn."""
    reasoning_open_in_prompt: ClassVar[bool] = False
    """The generation prompt opens the reasoning block (DeepSeek-R1's `<think>`)."""
    reply_end: str = ""
    """Special tokens the model samples between its reply and the stop token (Cohere 2's ``<|END_RESPONSE|>``)."""
    rendered_stop: str | None = None
    """What the template writes after a past reply *instead of* the sampled stop (gpt-oss: ``<|end|>``)."""
    reasoning_field: str | None = None
    """The message field the template reads a past turn's reasoning from, if not its content (gpt-oss)."""

    def history_stop(self) -> str:
        """What the template writes right after a past reply: ``rendered_stop``, else ``reply_end`` + the stop."""
        if self.rendered_stop is not None:
            return self.rendered_stop
        return self.reply_end + (self.stop_strings[0] if self.stop_strings else "")

    def prompt_opens_reasoning(self) -> bool:
        """Whether the generation prompt leaves a reasoning block open (the turn starts inside it)."""
        return self.reasoning_open_in_prompt

    def prompt_closes_reasoning(self) -> bool:
        """Whether the generation prompt writes an empty, closed reasoning block (thinking off)."""
        return False

    def turn_end_markers(self) -> tuple[str, ...]:
        """The strings that end a turn's text: the stop strings and other end-of-text tokens."""
        return (*self.stop_strings, *self.end_markers)

    def parse(self, completion: str) -> ParsedOutput:
        """Split a turn into reasoning, action and a ``ParseStatus`` (see ``parse_output``)."""
        return parse_output(
            completion,
            end_markers=self.turn_end_markers(),
            reasoning_tags=self.reasoning_tags,
            reasoning_open_in_prompt=self.prompt_opens_reasoning(),
            action_tags=self.action_tags,
        )

    def parse_agent_output(self, completion: str) -> tuple[str, str]:
        """Split a turn into (reasoning, action), without the end marker."""
        parsed = self.parse(completion)
        return parsed.reasoning, parsed.action

    def render_agent_output(self, reasoning: str, action: str) -> str:
        """The text of a model turn with this reasoning and action (the inverse of ``parse``)."""
        if not reasoning or self.reasoning_tags is None or self.prompt_closes_reasoning():
            return action
        open_tag, close_tag = self.reasoning_tags
        opened = "" if self.prompt_opens_reasoning() else f"{open_tag}\n"
        return f"{opened}{reasoning}\n{close_tag}\n\n{action}"


class ParseStatus(str, Enum):
    """How ``parse_output`` read a model turn; the text is returned in every case."""

    OK = "ok"
    """Reasoning (if any) was closed, and the action markers (if asked for) were found and closed."""
    CUT_IN_REASONING = "cut_in_reasoning"
    """The reasoning block never closed (the turn was cut mid-thought): all reasoning, empty action."""
    NO_ACTION_MARKER = "no_action_marker"
    """Action markers were asked for but absent: the action is the whole text after the reasoning."""
    UNCLOSED_ACTION = "unclosed_action"
    """The last action marker opened but never closed: the action runs to the end of the turn."""
    TOOL_CALL = "tool_call"
    """The reply called tools in the template's native format, and every call parsed (``ToolProcessor``)."""
    MALFORMED_TOOL_CALL = "malformed_tool_call"
    """A call opened and did not parse (bad JSON, no name): the env answers with an error, nothing runs."""


@dataclass(frozen=True)
class ParsedOutput:
    """One model turn split by ``parse_output``."""

    reasoning: str
    """The text of the reasoning block, stripped; empty without one."""
    action: str
    """What the env receives, stripped."""
    status: ParseStatus


def parse_output(
    text: str,
    *,
    end_markers: tuple[str, ...] = (),
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>"),
    reasoning_open_in_prompt: bool = False,
    action_tags: tuple[str, str] | None = None,
) -> ParsedOutput:
    """Split one model turn into reasoning and action; malformed output is data, never an exception.

    The rules, in order: the text is cut at the first end-of-turn marker in ``end_markers`` (the
    stop token and EOS strings; what follows is not part of the turn), and every other special
    token is kept as written. A reasoning block ``reasoning_tags`` becomes the reasoning; a block
    that never closes is all reasoning with an empty action (half a thought is never an action).
    With ``reasoning_open_in_prompt`` the prompt already opened the block (DeepSeek-R1's
    ``<think>``), so the turn is reasoning up to the closing tag. With ``action_tags``, the action is
    the content of the last such block (to the end of the turn if it never closes), or all the text
    after the reasoning if the markers are absent.

    Args:
        text: the decoded turn, special tokens included.
        end_markers: end-of-turn strings; the first one found ends the turn.
        reasoning_tags: (open, close) of the reasoning block; ``None`` for a family without one.
        reasoning_open_in_prompt: the generation prompt ended inside an open reasoning block.
        action_tags: (open, close) around the action, e.g. ``("<answer>", "</answer>")``; ``None``
            takes all the text after the reasoning.

    Returns:
        The reasoning, the action and how parsing went (``ParseStatus``).
    """
    cuts = [i for i in (text.find(m) for m in end_markers if m) if i >= 0]
    if cuts:
        text = text[: min(cuts)]
    reasoning, rest = "", text
    if reasoning_tags is not None:
        open_tag, close_tag = reasoning_tags
        head, closed, tail = text.rpartition(close_tag)
        if closed:
            reasoning, rest = head.replace(open_tag, "", 1), tail
        elif reasoning_open_in_prompt or open_tag in text:
            reasoning = text.split(open_tag, 1)[-1] if open_tag in text else text
            return ParsedOutput(reasoning.strip(), "", ParseStatus.CUT_IN_REASONING)
    status = ParseStatus.OK
    if action_tags is not None:
        open_tag, close_tag = action_tags
        head, opened, tail = rest.rpartition(open_tag)
        if not opened:
            status = ParseStatus.NO_ACTION_MARKER
        else:
            inner, closed, _ = tail.partition(close_tag)
            rest, status = inner, ParseStatus.OK if closed else ParseStatus.UNCLOSED_ACTION
    return ParsedOutput(reasoning.strip(), rest.strip(), status)
