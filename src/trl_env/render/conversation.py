"""``history="deployed"`` without re-rendering or re-tokenising the whole conversation every turn.

``Conversation`` carries an episode's messages with their rendering and ids; ``Incremental`` renders only the new
messages where the template provably appends (checked on probe conversations) and tokenises only the new text after
an added token the tokenizer splits on first (checked on probe texts). Anything else takes the full path.

Two kinds of turns are probed apart, since templates treat them apart (Qwen 3 drops earlier reasoning at a new user
message, not at tool results): a plain turn (a reply and a user message) and a tool turn (a reply with calls and
its ``tool`` messages).
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trl_env.render.messages import Message

_SLOT = "TRLENVSLOT7c2d{}Q"  # plain text no template rewrites; stands for a message's text in a tail rendering
_SLOTS = re.compile(r"TRLENVSLOT7c2d(\d+)Q")
_PLAIN_ROLES = {"system", "user", "assistant"}
Read = tuple[tuple[Any, ...], list[str]]
"""A shape of messages (``Incremental.read``) and their texts in slot order (none for a tool turn's messages)."""
_TOOL = "tool turn"  # the last item of a tool turn message's entry in a shape: rendered, never laid out


class TurnKind(str, Enum):
    """What a turn adds to a conversation; the probes check each kind apart."""

    PLAIN = "plain"
    """Text messages: a reply, a user message (and system)."""
    TOOLS = "tools"
    """A reply with tool calls, then one ``tool`` message per result."""


def turn_kind(messages: list[Message]) -> TurnKind | None:
    """The kind of turn ``messages`` are; ``None``: neither (a reply with calls answered by text, ...)."""
    structured = [m.get("role") == "tool" or bool(m.get("tool_calls")) for m in messages]
    if not any(structured):
        return TurnKind.PLAIN
    first, *rest = messages
    answered = bool(rest) and all(m.get("role") == "tool" for m in rest)
    if first.get("role") == "assistant" and first.get("tool_calls") and answered:
        return TurnKind.TOOLS
    return None


@dataclass(frozen=True)
class Conversation:
    """An episode's messages so far and, once encoded, the template's rendering of them with its ids."""

    messages: list[Message]
    text: str = ""
    """The rendering with the generation prompt; ``""`` when not encoded."""
    ids: list[int] = field(default_factory=list)
    cuts: tuple[tuple[int, int], ...] = ()
    """(chars, ids) pairs: ``text[:chars]`` tokenises to ``ids[:ids]`` whatever text follows it (the ends of clean
    added tokens in the text tokenised last turn, and where it started)."""
    head: int = 0
    """How many messages the opening had (the head a tail rendering starts from)."""
    plain: bool = False
    """No env text spells an added token (ids are the rendering tokenised whole, so ``cuts`` may be used)."""
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """The episode's: its opening's renderings, and per shape of new messages, the tail rendering as a format string
    (template text, a ``{k}`` slot per message text; ``None``: render it every turn). Shared by all of the episode's
    conversations."""

    tools: tuple[Any, ...] = ()
    """The tools the conversation is rendered with when it is a chat request's (``chat``); else unused."""
    chat: bool = False
    """The messages are a chat request's, as an agent sent them (``render/chat.py``), not built turn by turn."""
    max_tokens: int | None = None
    """A chat request's own cap on the next turn (``ChatRequest.max_tokens``); ``None``: the budgets'."""

    @property
    def reused(self) -> int:
        """How many leading ids are the previous conversation's own, taken as they were (not re-tokenised).

        They equal its ids by construction, so a comparison with that conversation's ids may start here.
        """
        return self.cuts[0][1] if self.cuts else 0

    def extends(self, prompt_ids: list[int], completion_ids: list[int]) -> bool:
        """Whether ``ids`` start with ``prompt_ids + completion_ids``.

        Those are the row the previous conversation's ids began and the reply sampled from them, so its ``reused``
        ids are known to match: the comparison starts there (O(new ids) per turn, not O(context)).
        """
        split, end = len(prompt_ids), len(prompt_ids) + len(completion_ids)
        if len(self.ids) < end:
            return False
        known = min(self.reused, end)
        if known < split and self.ids[known:split] != prompt_ids[known:]:
            return False
        start = max(known, split)
        return self.ids[start:end] == completion_ids[start - split :]


@dataclass
class Verdicts:
    """What probes showed about a template (with its variables) and a tokenizer, kept for the next batches."""

    appends: dict[TurnKind, bool] = field(default_factory=dict)
    """Per kind of turn: whether the template appends it (``Incremental.appends``)."""
    clean: dict[str, bool] = field(default_factory=dict)
    rests: dict[str, list[int]] = field(default_factory=dict)
    """Ids of the text after the last cut (most often the same every turn: ``\\n`` and the generation prompt)."""
    mismatches: dict[Any, str | None] = field(default_factory=dict)
    """``processors.derived.mismatch``'s answer per (processor, system prompt): what ``DeployedHistory.check`` asks."""
    lock: threading.Lock = field(default_factory=threading.Lock)


_VERDICTS: weakref.WeakKeyDictionary[Any, dict[Any, Verdicts]] = weakref.WeakKeyDictionary()
_VERDICTS_LOCK = threading.Lock()


def kept_verdicts(tokenizer: Any, key: tuple[Any, ...]) -> Verdicts:
    """The ``Verdicts`` kept for ``tokenizer`` and ``key`` (what else they depend on).

    A fresh one where either cannot key a cache (a tokenizer without weak references, an unhashable key).
    """
    try:
        with _VERDICTS_LOCK:
            return _VERDICTS.setdefault(tokenizer, {}).setdefault(key, Verdicts())
    except TypeError:
        return Verdicts()


@dataclass
class Incremental:
    """Cheap checks of what a template and a tokenizer allow, computed once per ``DeployedHistory``."""

    render: Callable[[list[Message], bool], str]
    """The template's rendering of messages, with the generation prompt or without."""
    encode: Callable[[str], list[int]]
    added: re.Pattern[str] | None
    tokenizer: Any
    reasoning_field: str | None
    tool_turn: Callable[[int], list[Message]] | None = None
    """A probe tool turn (a reply with calls, then its ``tool`` messages) for turn ``k``, as the conversation writes
    them; ``None``: the conversation holds no tool turns (they take the full rendering)."""
    verdicts: Verdicts = field(default_factory=lambda: Verdicts())
    """What the probes showed; shared with the batches that render with the same template and tokenizer."""

    def clean(self, token: str) -> bool:
        """Whether ids of a text ending with ``token`` stand whatever follows: the tokenizer splits it off first.

        Holds for an added token without ``lstrip``/``rstrip``/``single_word`` whose neighbours are tokenised on
        their own; checked on probe texts (a tokenizer that marks the first word, as SentencePiece's ``prepend``
        does, fails them).
        """
        known = self.verdicts.clean
        if token not in known:
            specs = getattr(self.tokenizer, "added_tokens_decoder", {}).values()
            spec = next((t for t in specs if str(t) == token), None)
            flags = [True] if spec is None else [getattr(spec, k, True) for k in ("lstrip", "rstrip", "single_word")]
            ok = not any(flags)
            for head in ("a b", "", "x\n"):
                for tail in (" x", "x", "\n\nx", "\n", " ", token + "x", "\u65e5\u672c"):
                    ok = ok and self.encode(head + token + tail) == self.encode(head + token) + self.encode(tail)
            known[token] = ok
        return known[token]

    def appends(self, kind: TurnKind = TurnKind.PLAIN) -> bool:
        """Whether the template renders a turn of ``kind`` after the opening as it renders after any history.

        Checked on probe conversations (with and without a system message): at every turn of that kind, the full
        rendering must be the previous one without its generation prompt plus the tail rendering (the opening and
        the new messages, less the opening's rendering without the generation prompt). Plain turns: replies with and
        without reasoning. Tool turns: replies with calls (with and without reasoning) and their results, after
        the opening and after a plain turn.
        """
        verdicts = self.verdicts
        known = verdicts.appends.get(kind)
        if known is not None:  # every turn asks: no lock once decided
            return known
        with verdicts.lock:
            if kind not in verdicts.appends:
                if kind is TurnKind.PLAIN:
                    verdicts.appends[kind] = self._probe()
                else:
                    verdicts.appends[kind] = self.tool_turn is not None and self._probe_tools()
            return verdicts.appends[kind]

    def _probe_tools(self) -> bool:
        assert self.tool_turn is not None
        try:
            for head in (
                [{"role": "user", "content": "Start."}],
                [{"role": "system", "content": "Play."}, {"role": "user", "content": "Start."}],
            ):
                conversation = Conversation(list(head), self.render(head, True), head=len(head))
                for k in range(3):
                    if k == 1:  # a plain turn between (rendered whole: only the tool turns are checked)
                        messages = [
                            *conversation.messages,
                            {"role": "assistant", "content": "Answer 1."},
                            {"role": "user", "content": "Hint 1."},
                        ]
                        text = self.render(messages, True)
                    else:
                        new = self.tool_turn(k)
                        messages = [*conversation.messages, *new]
                        text = self.tail(conversation, new)  # type: ignore[assignment]
                        if text is None or text != self.render(messages, True):
                            return False
                    conversation = Conversation(messages, text, head=len(head), memo=conversation.memo)
        except Exception:  # noqa: BLE001  # a template that fails on a probe: the full path decides
            return False
        return True

    def _probe(self) -> bool:
        def reply(k: int) -> Message:
            if k % 3 and self.reasoning_field:  # with reasoning, and with an empty one (gpt-oss always has one)
                return {"role": "assistant", "content": f"{k}", self.reasoning_field: f"Think {k} over." * (k % 3 - 1)}
            return {"role": "assistant", "content": f"Answer {k}."}

        try:
            for head in (
                [{"role": "user", "content": "Start."}],
                [{"role": "system", "content": "Play."}, {"role": "user", "content": "Start."}],
            ):
                conversation = Conversation(list(head), self.render(head, True), head=len(head))
                for k in range(5):
                    new = [reply(k), {"role": "user", "content": f"Hint {k}." if k % 4 else f"\n Hint {k} \n"}]
                    stitched = self.tail(conversation, new)
                    messages = [*conversation.messages, *new]
                    if stitched is None or stitched != self.render(messages, True):
                        return False
                    conversation = Conversation(messages, stitched, head=len(head), memo=conversation.memo)
        except Exception:  # noqa: BLE001  # a template that fails on a probe: the full path decides
            return False
        return True

    def extend(self, previous: Conversation | None, messages: list[Message]) -> Conversation | None:
        """``DeployedHistory.extend`` for plain messages (``read``) after a plain conversation; else ``None``.

        Renders only the opening and the new messages where the template appends (``tail``) and tokenises only the
        text after the last cut the previous rendering keeps (``tokenise``).
        """
        if previous is None:
            head, new, memo = len(messages), messages, {}
        elif previous.plain:
            head, new, memo = previous.head, messages[len(previous.messages) :], previous.memo
        else:
            return None
        kind = turn_kind(new) if previous is not None else TurnKind.PLAIN
        read = None if kind is None else self.read(new)
        if read is None:
            return None
        text, kept = None, 0
        if previous is not None and previous.text and self.appends(kind):  # type: ignore[arg-type]  # read: a kind
            text = self.tail(previous, new, read)
            if text is not None:  # it starts with previous.text less the generation prompt
                kept = len(previous.text) - memo["opening"][2]
        if text is None:
            text = self.render(messages, True)
        if previous is None and any(self.appends(k) for k in TurnKind):
            self._open(memo, text, self.render(messages, False))
        stable = len(text) - memo["opening"][2] if "opening" in memo else len(text)
        ids, cuts = self.tokenise(text, stable, previous, kept)
        return Conversation(messages, text, ids, cuts, head, True, memo)

    @staticmethod
    def _open(memo: dict[Any, Any], with_prompt: str, without: str) -> None:
        """Keep the opening's renderings with the generation prompt and without, and how they differ.

        Their length difference, and whether the first starts with the second (else no tail fits).
        """
        memo["opening"] = (with_prompt, without, len(with_prompt) - len(without), with_prompt.startswith(without))

    def tail(self, conversation: Conversation, new: list[Message], read: Read | None = None) -> str | None:
        """The rendering of ``conversation``'s messages and ``new``, from its rendering.

        Renders at most the opening and ``new`` (once per shape of ``new``, in an episode); ``None`` where the
        renderings do not fit together. ``read``: ``read(new)``, where the caller has it.
        """
        memo, opening = conversation.memo, conversation.messages[: conversation.head]
        if "opening" not in memo:
            self._open(memo, self.render(opening, True), self.render(opening, False))
        with_prompt, without, prompt, fits = memo["opening"]
        previous = conversation.text
        if not fits or not previous.endswith(with_prompt[len(without) :]):
            return None
        read = read or self.read(new)
        if read is None:
            return None
        shape, values = read
        layout = memo.get(shape, False)  # the tail as a format string: template text, a {k} for each message text
        if layout is False and any(part[-1] == _TOOL for part in shape):
            layout = memo[shape] = None  # a tool turn's structure is the template's to lay out: rendered every time
        if layout is False:
            layout = memo[shape] = self._layout(opening, new, without)
        if layout is None:
            rendered = self.render([*opening, *new], True)
            if not rendered.startswith(without):
                return None
            return previous[: len(previous) - prompt] + rendered[len(without) :]
        return previous[: len(previous) - prompt] + layout.format(*values)

    def _layout(self, opening: list[Message], new: list[Message], without: str) -> str | None:
        """The tail rendering of ``new`` as a format string: template text, a ``{k}`` slot for its ``k``-th text.

        Read off a rendering with a marker for each text; ``None`` unless it predicts the rendering of texts with edge
        whitespace too.
        """

        def filled(texts: list[str]) -> list[Message]:
            it = iter(texts)
            return [{k: (v if k == "role" else next(it)) for k, v in m.items()} for m in new]

        count = sum(len(m) - 1 for m in new)
        marked = self.render([*opening, *filled([_SLOT.format(j) for j in range(count)])], True)
        if not marked.startswith(without):
            return None
        parts = _SLOTS.split(marked[len(without) :])
        pieces: list[str | int] = [p if i % 2 == 0 else int(p) for i, p in enumerate(parts)]
        values = [v for m in new for k, v in m.items() if k != "role"]
        edges = [f"\n {j} x \n" if v else "" for j, v in enumerate(values)]
        actual = self.render([*opening, *filled(edges)], True)
        predicted = without + "".join(p if isinstance(p, str) else edges[p] for p in pieces)
        if actual != predicted:
            return None
        return "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else f"{{{p}}}" for p in pieces)

    def read(self, messages: list[Message]) -> Read | None:
        """The shape and texts of messages the probes stand for; ``None`` for others.

        Those are system, user and assistant text (and the reasoning field), and where the conversation has tool
        turns (``tool_turn``), a reply with calls and its ``tool`` messages; no added token's string anywhere. The
        shape (each message's role, keys in order and which texts are empty) picks the tail layout; the texts fill
        its slots, in order (a tool turn's messages have no slots: they are rendered).
        """
        shape, values, structured = [], [], []
        for m in messages:
            keys, role = tuple(m), m.get("role")
            if self.tool_turn is not None and (role == "tool" or (role == "assistant" and m.get("tool_calls"))):
                shape.append((keys, role, _TOOL))
                structured.append(m)
                continue
            if role not in _PLAIN_ROLES or not self._fields.issuperset(keys):
                return None
            texts = [m[k] for k in keys if k != "role"]
            shape.append((keys, role, *map(bool, texts)))
            values += texts
        try:
            joined = "\0".join([*values, *(s for m in structured for s in _strings(m))])  # a text no str: raises
        except TypeError:
            return None
        if self.added is not None and self.added.search(joined):
            return None
        return tuple(shape), values

    @functools.cached_property
    def _fields(self) -> frozenset[str | None]:
        return frozenset(("role", "content", self.reasoning_field))

    def tokenise(
        self, text: str, stable: int, previous: Conversation | None, kept: int = 0
    ) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        """The ids of ``text`` (no env text spelling an added token), and the cuts for the next turn.

        Reuses ``previous``'s ids up to the last of its cuts that ``text`` extends verbatim (known for the first
        ``kept`` characters: a tail rendering keeps them). The cuts: where this
        turn's tokenisation started, and after the last clean added token in ``text[:stable]`` (what the next
        rendering keeps: not the generation prompt, which Qwen 3 without thinking rewrites).
        """
        chars, count = 0, 0
        if previous is not None and previous.plain:
            for c, k in reversed(previous.cuts):
                if c <= kept or text.startswith(previous.text[:c]):
                    chars, count = c, k
                    break
        ids = previous.ids[:count] if previous is not None else []  # the one copy of the kept ids
        cut = chars
        if self.added is not None:
            cut = next(
                (m.end() for m in reversed(list(self.added.finditer(text, chars, stable))) if self.clean(m.group())),
                chars,
            )
        head = self.encode(text[chars:cut]) if cut > chars else []
        rest = text[cut:]  # after the cut: most often the same text every turn (``\n`` and the generation prompt)
        rests = self.verdicts.rests
        tail = rests.get(rest)
        if tail is None:
            tail = self.encode(rest)
            if len(rest) < 256 and len(rests) < 64:
                rests[rest] = tail
        ids += head
        ids += tail
        return ids, ((chars, count), (cut, count + len(head)))


def _strings(value: Any) -> list[str]:
    """Every string in a message's values, nested (tool calls' names and arguments included); keys left out."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []
