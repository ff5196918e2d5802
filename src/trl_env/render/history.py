"""What a turn is sampled from: the tokens as sampled (``"sampled"``) or the template's own rendering (``"deployed"``).

``DeployedHistory`` renders each turn's prompt with the tokenizer's chat template (``apply_chat_template`` of the
messages so far, with the generation prompt), so earlier reasoning is dropped or rewritten exactly as the model's
deployment does; env text stays plain text. With a ``ToolProcessor``, a reply with calls is an assistant message with
``tool_calls`` and its results are ``tool`` messages (``tools=`` rendered). See docs/history.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trl_env.errors import ConfigError, EpisodeFailure, ProcessorError
from trl_env.render.conversation import Conversation, Incremental, Verdicts, kept_verdicts
from trl_env.render.located import CUTS, MARK, locate
from trl_env.render.messages import REASONING_FIELDS, Message, call_arguments
from trl_env.render.processors.base import FamilyProcessor, ParsedOutput, ParseStatus, Processor, StopStrings
from trl_env.render.processors.derived import mismatch
from trl_env.render.tools.probe import CALL_ID, special_spans
from trl_env.render.tools.processor import ToolProcessor
from trl_env.render.tools.types import ToolCall, ToolCalls, ToolResult, ToolResults

__all__ = ["Conversation", "DeployedHistory", "History", "Message"]


class History(str, Enum):
    """Which context each model turn is sampled from, and trained on."""

    SAMPLED = "sampled"
    """Every token as sampled: one row per episode, each turn appended to the last (the default)."""
    DEPLOYED = "deployed"
    """The chat template's rendering of the conversation so far, as the deployed model sees it: one row per turn,
    turns merged where a context extends the previous row verbatim."""


def as_history(history: History | str) -> History:
    """``history`` as a ``History``.

    Raises:
        ConfigError: naming the value and the choices.
    """
    try:
        return History(history)
    except ValueError:
        raise ConfigError(
            f"history={history!r}: use 'sampled' (every token as sampled, one row per episode) or 'deployed' (each "
            "turn's prompt is the chat template's rendering of the conversation so far)."
        ) from None


@dataclass(frozen=True)
class DeployedHistory:
    """Renders and tokenises the conversation so far as the chat template does; env text never becomes a special token.

    Built by ``check``, which refuses what it cannot render exactly. ``encode`` runs on worker threads.
    """

    tokenizer: Any
    processor: Processor
    template_kwargs: Mapping[str, Any]
    text: Any
    """The engine's ``EnvText`` (trl-env's own tokenizer copy; ``segments`` keeps env text plain)."""

    @classmethod
    def check(
        cls, processor: Processor, tokenizer: Any, text: Any, template_kwargs: Mapping[str, Any] | None = None
    ) -> DeployedHistory:
        """A ``DeployedHistory`` for ``processor`` and ``tokenizer``'s chat template, or the reason there is none.

        A ``ToolProcessor`` renders with its tools (``tools=``) and, without ``template_kwargs``, the template
        variables it was built with.

        Raises:
            ConfigError: the tokenizer has no chat template, or the processor renders unlike the template at the
                generation boundary (the reply would be parsed with other markers than the prompt it was sampled
                from).
        """
        name = type(processor).__name__
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "history='deployed' renders every turn with the tokenizer's chat template, and "
                f"{type(tokenizer).__name__} has none; set tokenizer.chat_template or use history='sampled'."
            )
        base, kwargs = processor, dict(template_kwargs or {})
        if isinstance(processor, ToolProcessor):
            base = processor.format.base
            kwargs = dict(processor.format.template_kwargs) if template_kwargs is None else kwargs
        history = cls(tokenizer, processor, kwargs, text)
        key, known = (base, getattr(base, "system_prompt", None)), history.verdicts.mismatches
        try:
            if key not in known:
                known[key] = mismatch(base, tokenizer, history.render_kwargs, system=key[1])
            problem = known[key]
        except TypeError:  # an unhashable processor: asked every time
            problem = mismatch(base, tokenizer, history.render_kwargs, system=key[1])
        if problem is not None:
            raise ConfigError(
                f"history='deployed': {name} renders unlike the tokenizer's chat template with "
                f"template_kwargs={kwargs} ({problem}), so a turn would be parsed unlike the prompt it was sampled "
                "from. Pass the "
                "template_kwargs the processor was built for (e.g. {'enable_thinking': False}), or use "
                "from_tokenizer(tokenizer, template_kwargs=...)."
            )
        return history

    @functools.cached_property
    def base(self) -> Processor:
        """The processor that renders text turns: a ``ToolProcessor``'s base, else the processor itself."""
        return self.processor.format.base if isinstance(self.processor, ToolProcessor) else self.processor

    @property
    def render_kwargs(self) -> dict[str, Any]:
        """``template_kwargs``, with a ``ToolProcessor``'s tool schemas as ``tools``."""
        if isinstance(self.processor, ToolProcessor):
            return {**self.template_kwargs, "tools": self.processor.format.tools}
        return dict(self.template_kwargs)

    def opening(self, observation: str) -> list[Message]:
        """The conversation before the first turn: the processor's system prompt (if any) and the observation."""
        system = getattr(self.base, "system_prompt", None)
        head = [] if system is None else [{"role": "system", "content": system}]
        return [*head, {"role": "user", "content": observation}]

    @functools.cached_property
    def reasoning_field(self) -> str | None:
        """The message field a chat pipeline sends a past reply's reasoning in, for this template; ``None``: none.

        The processor's own (gpt-oss: ``thinking``), else the first of ``reasoning_content``, ``reasoning``,
        ``thinking`` the template reads (Qwen 3 and later, Nemotron 3, GLM-4 MoE, Gemma 4, LFM 2.5, Muse Glimmer);
        ``None`` where it reads none (DeepSeek R1 and V3 read the reasoning off the content).
        """
        declared = getattr(self.base, "reasoning_field", None)
        if declared:
            return str(declared)
        template = str(getattr(self.tokenizer, "chat_template", "") or "")
        return next((f for f in REASONING_FIELDS if re.search(rf"[.'\"]{f}\b", template)), None)

    def reply(self, text: str, parsed: ParsedOutput | None = None) -> Message:
        """The sampled turn as the assistant message a chat pipeline sends back: without its end-of-turn token(s).

        ``parsed``: the processor's parse of ``text``, where the caller has it (else it is parsed here).

        A reply with reasoning carries it as deployments do: in the template's ``reasoning_field`` (the reasoning
        and the text after it, each stripped, as the processor parses them), else in the content with the opener
        the generation prompt wrote (``<think>``: the model never sampled it). A ``ToolProcessor`` reply with
        calls carries them as ``tool_calls`` (ids ``call_0``, ... as in the probes the format was read with;
        arguments a JSON string where the template wants one), its content the text before the first call; a
        malformed call stays in the content as written.
        """
        sampled = text
        for stop in self._stops:
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
                break
        family = self.base if isinstance(self.base, FamilyProcessor) else None
        if family is not None and family.reply_end and text.endswith(family.reply_end):
            text = text[: -len(family.reply_end)]
        if isinstance(self.processor, ToolProcessor):
            parsed = self.processor.parse(sampled) if parsed is None else parsed
            if parsed.status is ParseStatus.TOOL_CALL and isinstance(parsed.action, ToolCalls):
                head = self._before_calls(text.split(self.processor.format.call_marker, 1)[0])
                return self._with_calls(self._carried(head), parsed.action)
        if family is not None and family.reasoning_field is not None:  # gpt-oss: its processor splits every reply
            parsed = family.parse(text)
            return {"role": "assistant", "content": parsed.action, family.reasoning_field: parsed.reasoning}
        return {"role": "assistant", **self._carried(text)}

    @functools.cached_property
    def _stops(self) -> list[str]:
        """The processor's stop strings and the tokenizer's EOS token (a runtime protocol check is slow: once)."""
        stops = getattr(self.processor, "stop_strings", ()) if isinstance(self.processor, StopStrings) else ()
        return [*map(str, stops), str(getattr(self.tokenizer, "eos_token", None) or "")]

    def _carried(self, text: str) -> Message:
        """``content`` (and the reasoning field) of a reply's ``text``, as a chat pipeline sends them back."""
        family = self.base if isinstance(self.base, FamilyProcessor) else None
        field = self.reasoning_field
        if family is None or field is None:
            return {"content": self._opened(text)}
        if getattr(family, "action_tags", None) is not None:  # the content is all the text after the reasoning
            family = dataclasses.replace(family, action_tags=None)  # type: ignore[type-var]  # a dataclass family
        parsed = family.parse(text)
        tags = family.reasoning_tags
        if parsed.reasoning or parsed.status is ParseStatus.CUT_IN_REASONING or (tags and tags[1] in text):
            return {"content": parsed.action, field: parsed.reasoning}
        return {"content": self._opened(text)}

    def _before_calls(self, head: str) -> str:
        """The reply's content before its calls, as the template takes it.

        Without trailing whitespace and the special tokens that open the calls (DeepSeek V3's
        ``<｜tool▁calls▁begin｜>``), which the template writes itself; a reasoning close tag stays.
        """
        tags = getattr(self.base, "reasoning_tags", None) or ("", "")
        head = head.rstrip()
        for start, end in reversed(special_spans(self.tokenizer, head)):
            if end != len(head) or head[start:end] in tags:
                break
            head = head[:start].rstrip()
        return head

    def _opened(self, content: str) -> str:
        """``content`` with the reasoning opener the generation prompt wrote, where the turn was sampled inside it.

        The template reads the reasoning off the content (Nemotron 3 renders a content without the opener as given).
        """
        opener = self._opener
        if opener is None or opener[1] not in content or opener[0] in content:
            return content
        return opener[2] + content

    @functools.cached_property
    def _opener(self) -> tuple[str, str, str] | None:
        """Where the generation prompt opens reasoning: the open and close tags, and the prompt from its open tag."""
        tags = getattr(self.base, "reasoning_tags", None)
        opens = getattr(self.base, "prompt_opens_reasoning", None)
        if not (tags and callable(opens) and opens()):
            return None
        prompt = self.base.init_system_input("")
        return tags[0], tags[1], prompt[prompt.rfind(tags[0]) :] if tags[0] in prompt else ""

    def _with_calls(self, carried: Message, action: ToolCalls) -> Message:
        assert isinstance(self.processor, ToolProcessor)
        as_text = self.processor.format.args_as_text  # DeepSeek V3 concatenates the arguments as a string
        calls = [
            {
                "id": CALL_ID.format(i),
                "type": "function",
                "function": {"name": c.name, "arguments": call_arguments(c.arguments, as_text=as_text)},
            }
            for i, c in enumerate(action.calls)
        ]
        return {"role": "assistant", **carried, "tool_calls": calls}

    def answer(self, delta: str) -> list[Message]:
        """The env's answer: one ``tool`` message per result (with its call's id and name), else a user message."""
        if isinstance(delta, ToolResults) and isinstance(self.processor, ToolProcessor):
            return [
                {"role": "tool", "tool_call_id": CALL_ID.format(i), "name": r.name, "content": str(r.content)}
                for i, r in enumerate(delta.results)
            ]
        return [{"role": "user", "content": delta}]

    @functools.cached_property
    def incremental(self) -> Incremental:
        """What this template and tokenizer allow to be rendered and tokenised turn by turn (see ``extend``)."""
        kwargs = self.render_kwargs

        def render(messages: list[Message], prompt: bool) -> str:
            return _render(self.tokenizer, messages, kwargs, prompt=prompt)

        tool_turn = self._tool_turn if isinstance(self.processor, ToolProcessor) else None
        added = self.text._added  # noqa: SLF001
        return Incremental(
            render, self.text.encode, added, self.tokenizer, self.reasoning_field, tool_turn, self.verdicts
        )

    def _tool_turn(self, k: int) -> list[Message]:
        """A probe tool turn as ``reply`` and ``answer`` write one: calls to the first tool, then their results.

        Reasoning in the template's field on even turns; two calls where the template renders parallel calls.
        """
        assert isinstance(self.processor, ToolProcessor)
        tool = self.processor.format.tools[0]
        name = str(tool.get("function", tool).get("name"))
        calls = [ToolCall(name, {"x": k}), ToolCall(name, {"x": k + 1})][: 2 if self.processor.format.parallel else 1]
        field = self.reasoning_field
        carried: Message = {"content": f"Call {k}."} if field is None or k % 2 else {"content": "", field: f"Why {k}."}
        reply = self._with_calls(carried, ToolCalls("", calls))
        return [reply, *self.answer(ToolResults([ToolResult(c.name, f"Result {k}.") for c in calls]))]

    @functools.cached_property
    def verdicts(self) -> Verdicts:
        """What probes showed about this template and tokenizer, kept for later batches.

        Where the tokenizer's copy (``EnvText.own``) and the template variables (as JSON) key a cache; else this
        batch's own.
        """
        own = None if self.text is None else self.text.own  # None: a check before any engine (no EnvText yet)
        try:
            kwargs = json.dumps(self.render_kwargs, sort_keys=True)
        except (TypeError, ValueError):
            return Verdicts()
        template, plain = str(self.tokenizer.chat_template), not isinstance(self.processor, ToolProcessor)
        key = (template, kwargs, self.reasoning_field, plain, own)
        return Verdicts() if own is None else kept_verdicts(self.tokenizer, key)

    def extend(self, previous: Conversation | None, messages: list[Message]) -> Conversation:
        """``messages`` (``previous``'s and the new ones) with their rendering and ids: exactly ``encode(messages)``.

        Where the template appends turns of the new messages' kind (``Incremental.appends``: plain text, or a tool
        turn), only the opening and the new messages are rendered; where no env text spells an added token, only the
        text after the last
        clean added token the previous rendering shares is tokenised. Otherwise ``encode``.
        """
        conversation = self.incremental.extend(previous, messages)
        if conversation is not None:
            return conversation
        head, memo = (len(messages), {}) if previous is None else (previous.head, previous.memo)
        return Conversation(messages, "", self.encode(messages), (), head, False, memo)

    def encode(self, messages: list[Message]) -> list[int]:
        """The ids of the template's rendering of ``messages`` with the generation prompt; env text kept plain.

        Without an added token's text in any env message (user or tool), the rendering is tokenised whole (exactly
        ``apply_chat_template(..., tokenize=True)``). Otherwise each env text that spells one is located in that
        rendering and tokenised as plain text, the template's text around it as usual. To locate it, the conversation
        is rendered once more with a marker *inside* each such text (between two plain characters, so what the
        template tests, e.g. Qwen 3's ``content.startswith('<tool_response>')``, still holds); that rendering counts
        only if, markers removed, it is the real one, and each marker sits inside its text as written, stripped or
        JSON-quoted. The marker then goes at the text's start, then at its end, before giving up.

        Raises:
            EpisodeFailure: ``processor_error`` when the template fails or writes an env text holding special-token
                text other than verbatim, stripped or JSON-quoted (gpt-oss's tool results).
        """
        kwargs = self.render_kwargs
        rendered = _render(self.tokenizer, messages, kwargs)
        added = self.text._added  # noqa: SLF001  # the engine's added-token pattern, shared on purpose
        envs = [i for i, m in enumerate(messages) if m["role"] in ("user", "tool")]
        located = [] if added is None else [i for i in envs if added.search(messages[i]["content"])]
        if added is None or not located:
            return list(self.text.encode(rendered))
        tried: list[dict[int, int]] = []
        for cut in CUTS:
            cuts = {i: cut(messages[i]["content"], added) for i in located}
            if cuts in tried:
                continue
            tried.append(cuts)
            marked = [
                dict(m, content=m["content"][: cuts[i]] + MARK.format(i) + m["content"][cuts[i] :]) if i in cuts else m
                for i, m in enumerate(messages)
            ]
            pieces = locate(_render(self.tokenizer, marked, kwargs), rendered, messages, cuts)
            if pieces is not None:
                return list(self.text.segments(pieces))
        raise EpisodeFailure(
            "processor_error",
            ProcessorError(
                "history='deployed': the chat template writes an env text that holds special-token text other than "
                "verbatim (or stripped, or JSON-quoted), so trl-env cannot keep it plain text; last env text "
                f"{messages[-1]['content']!r:.80}."
            ),
        )


def _render(tokenizer: Any, messages: list[Message], kwargs: Mapping[str, Any], *, prompt: bool = True) -> str:
    """``apply_chat_template`` as text, with the generation prompt (after a user or a tool message) or without."""
    try:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt, **kwargs))
    except Exception as e:  # noqa: BLE001  # a template that refuses this conversation fails its episode
        raise EpisodeFailure(
            "processor_error", ProcessorError(f"the chat template failed: {type(e).__name__}: {e}")
        ) from e
