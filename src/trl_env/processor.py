"""The seed's Processor protocol (per-model-family chat formatting) and helpers shared by processors.

A processor renders text; the engine tokenises it. Besides the seed's three methods, a processor
tells the engine where a model turn ends with an optional ``stop_strings`` attribute (see
``stop_token_ids``); family processors live in ``trl_env.processors``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

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
                "trl_env.processors (e.g. ChatMLProcessor()) or add the method."
            )


def stop_token_ids(processor: object, tokenizer: object) -> tuple[int, ...]:
    """The token ids that end a model turn: the processor's ``stop_strings`` plus the tokenizer's EOS.

    Raises:
        ConfigError: if a stop string is not exactly one token of ``tokenizer``.
    """
    ids: list[int] = []
    for text in getattr(processor, "stop_strings", ()):
        encoded = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]  # any HF tokenizer
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
    A turn that opens a block but never closes it (cut mid-thought) is all reasoning, with an
    empty action: half a thought must never be taken as the action.
    """
    for marker in strip:
        if marker and text.endswith(marker):
            text = text[: -len(marker)]
            break
    head, sep, tail = text.partition(close_tag)
    if sep:
        return head.replace(open_tag, "", 1).strip(), tail.strip()
    if open_tag in text:
        return text.split(open_tag, 1)[1].strip(), ""
    return "", text.strip()
