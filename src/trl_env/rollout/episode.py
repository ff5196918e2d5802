"""One episode: the token lists it builds (``Episode``) and the calls into user code that advance it (``Calls``).

``Calls`` runs on worker threads and only returns values (``Opened``, ``Stepped``); it does every
piece of user code and every tokenisation, so the scheduler thread does neither. Each call into
user code is wrapped where it happens, so a failure is classified by its site, whatever its type
(``EpisodeFailure.kind``). ``Episode`` lives on the scheduler thread and keeps the invariant that
``completion_ids``, ``logprobs`` and ``env_mask`` stay aligned: model tokens enter only through
``append_model``, env tokens only through ``append_env``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trl_env.backends.base import FinishReason, Generation
from trl_env.calling.processor import ToolProcessor
from trl_env.calling.types import ToolResults
from trl_env.env import Closable, Env, Seed, Truncatable, check_result
from trl_env.errors import ConfigError, EnvError, EnvTimeoutError, EpisodeFailure, ProcessorError
from trl_env.processors.base import FamilyProcessor, Processor
from trl_env.rollout.history import DeployedHistory, Message
from trl_env.rollout.records import Budgets, Ending, Rollout, Row, Turn

T = TypeVar("T")
_SENTINEL = "TRLENVDELTA7f3a9c"  # plain text no processor rewrites; locates the env text in a rendering


def call(kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run user code; anything it raises (``SystemExit`` too, not ``KeyboardInterrupt``) becomes ``kind``.

    Env code that reports its own timeout (an adapter raising ``EnvTimeoutError``) is ``env_timeout``.
    """
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except EpisodeFailure:
        raise
    except BaseException as e:  # noqa: BLE001  # user code: classified here, where it happened
        if kind == "env_exception" and isinstance(e, EnvTimeoutError):
            kind = "env_timeout"
        raise EpisodeFailure(kind, e) from e


@dataclass(frozen=True)
class Opened:
    """What opening an episode produced: the env after ``reset`` and the tokenised prompt."""

    env: Env
    prompt_ids: list[int]
    alive: bool
    reward: float
    """The env's reward after ``reset``: the episode's, should its first turn be cut before any step."""
    env_info: dict[str, Any] | None = None
    """The env's ``info`` after ``reset``, JSON-safe; ``None`` without one."""
    messages: list[Message] | None = None
    """With ``history="deployed"``: the conversation so far (``prompt_ids`` is its rendering); else ``None``."""


@dataclass(frozen=True)
class Stepped:
    """One model turn, parsed and stepped: what the env answered and the env tokens to append next."""

    env: Env
    text: str
    reasoning: str
    action: str
    delta: str
    reward: float
    alive: bool
    env_s: float
    next_ids: list[int] | None
    """The tokenised text after this turn; ``None`` when the episode ends here (env done or out of turns)."""
    parse_status: str | None = None
    """How the family processor read the turn (a ``ParseStatus`` value); ``None`` for other processors."""
    env_info: dict[str, Any] | None = None
    """The env's ``info`` after the step, JSON-safe; ``None`` without one."""
    tool_calls: tuple[tuple[str, bool], ...] = ()
    """(tool name, succeeded) for each tool result the env answered with."""
    messages: list[Message] | None = None
    """With ``history="deployed"``: the conversation so far, and ``next_ids`` is the next turn's whole prompt (the
    template's rendering of it), not the text to append."""


@dataclass(frozen=True)
class Settled:
    """What a ``Truncatable`` env left after ``truncate``: the episode's final reward and info."""

    reward: float
    info: dict[str, Any] | None
    close_error: str = ""
    """The error of a ``close()`` that failed after ``truncate`` succeeded."""


class EnvText:
    """Tokenises rendered env text so that text from the env can never become a special (added) token.

    Text without an added token's string is encoded whole, exactly as the tokenizer would. Otherwise
    the rendering is split into the processor's wrapper (encoded normally: its special tokens are the
    ones the processor wrote) and the env's text, in which every added token's string is encoded as
    plain text.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._added, self._fast = _own_copy(tokenizer)

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text``, special-token strings included, with nothing added."""
        if self._fast is not None:
            return self._fast(text)
        # The processor writes special tokens as text; never let the tokenizer add BOS/EOS again.
        return _encode(self.tokenizer, text)

    def render(self, render: Callable[[str], str], delta: str, *, lead: str = "") -> list[int]:
        """Tokenise the rendering of ``delta`` (after ``lead``), keeping special-token text in ``delta`` plain.

        Raises:
            EpisodeFailure: ``processor_error`` if the processor raises or returns no text or
                rewrites an env text holding special tokens; ``env_bad_return`` if the tokenizer
                rejects it.
        """
        rendered = lead + _text(call("processor_error", render, delta), render)
        if self._added is None or not self._added.search(delta):
            return call("env_bad_return", self.encode, rendered)
        around = lead + _text(call("processor_error", render, _SENTINEL), render)
        prefix, _, suffix = around.partition(_SENTINEL)
        for written in (delta, delta.strip()):
            if rendered == prefix + written + suffix:
                return self.segments([(prefix, False), (written, True), (suffix, False)])
        raise EpisodeFailure(
            "processor_error",
            ProcessorError(
                f"{_owner(render)} rewrote env text that holds special-token strings ({delta!r:.80}), so trl-env "
                "cannot keep them plain text; render the text unchanged (or stripped)."
            ),
        )

    def segments(self, pieces: list[tuple[str, bool]], *, lead: str = "") -> list[int]:
        """Tokenise ``lead`` and rendered pieces, each marked env text or not; env text never becomes a special token.

        Without an added token's string in the env pieces, the joined text is encoded whole (as ``render`` does).
        """
        if self._added is None or not any(env and self._added.search(text) for text, env in pieces):
            return call("env_bad_return", self.encode, lead + "".join(text for text, _ in pieces))
        return call("env_bad_return", self._encode_pieces, pieces, lead)

    def _encode_pieces(self, pieces: list[tuple[str, bool]], lead: str) -> list[int]:
        ids, wrapper = [], lead
        for text, env in pieces:
            if env:
                ids += self.encode(wrapper) + self.plain(text)
                wrapper = ""
            else:
                wrapper += text
        return ids + self.encode(wrapper)

    def plain(self, text: str) -> list[int]:
        """Encode ``text`` with every added token's string broken into ordinary tokens."""
        assert self._added is not None
        ids, at = [], 0
        for match in self._added.finditer(text):
            ids += self.encode(text[at : match.start()]) if match.start() > at else []
            token = match.group()
            ids += self.encode(token[0]) + self.plain(token[1:])
            at = match.end()
        return ids + (self.encode(text[at:]) if at < len(text) else [])


_PROBES = (
    "",
    "Hello World, The QUICK fox!",
    " leading space",
    "\n\nnewlines\n",
    "日本語 → é ✓",
    "42 + 17 = 59",
    "a\tb  c",
)


_Copy = tuple[re.Pattern[str] | None, Callable[[str], list[int]] | None]
"""What trl-env keeps of a tokenizer: its added tokens' pattern and its own copy's ``encode`` (or ``None``)."""
_OWNED: weakref.WeakKeyDictionary[Any, _Copy] = weakref.WeakKeyDictionary()
_OWNED_LOCK = threading.Lock()


def _own_copy(tokenizer: Any) -> _Copy:
    """The added tokens' pattern and the ``encode`` of trl-env's own copy of the Rust tokenizer, taken once.

    A copy, because the Rust backend's state is shared and other code sets it: ``tokenizer(text,
    truncation=True, max_length=256)`` (dataset preprocessing) leaves truncation on, ``padding="max_length"``
    (a collator) leaves padding on, ``split_special_tokens=True`` (a reward function) leaves the processor's
    special tokens spelled out as plain text. The copy has none of them, whatever the backend held when it was
    taken. It is taken the first time trl-env sees the tokenizer, with the added tokens it has then: tokens
    added later (a library adding a pad token) change neither how env text is tokenised nor which strings are
    kept plain, and no id the policy did not have at the first rollout appears. It also costs half of the
    transformers wrapper per call. It is checked once on probe texts (plain, unicode, whitespace, every added
    token) against ``tokenizer.encode``; any difference or a tokenizer without a Rust backend keeps
    ``tokenizer.encode``, read at each call (the added tokens' pattern is still the first one).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a duck-typed tokenizer: no copy to take, maybe nothing to key a cache on
        return _added_pattern(tokenizer)[0], None
    with _OWNED_LOCK:
        if tokenizer in _OWNED:
            return _OWNED[tokenizer]
        added_pattern, added = _added_pattern(tokenizer)
        own = copy.deepcopy(backend)
        own.no_truncation()
        own.no_padding()
        own.encode_special_tokens = False

        def fast(text: str) -> list[int]:
            return list(own.encode(text, add_special_tokens=False).ids)

        probes = [*_PROBES, " ".join(added), "x".join(added[:50])]
        try:
            same = all(fast(t) == _encode(tokenizer, t) for t in probes)
        except Exception:  # noqa: BLE001  # any trouble: keep the tokenizer's own encode
            same = False
        _OWNED[tokenizer] = (added_pattern, fast if same else None)
        return _OWNED[tokenizer]


def _added_pattern(tokenizer: Any) -> tuple[re.Pattern[str] | None, list[str]]:
    """A pattern matching any added token's string (longest first), and those strings."""
    added = sorted({str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}, key=len, reverse=True)
    added = [t for t in added if t]
    return (re.compile("|".join(map(re.escape, added))) if added else None), added


def _encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode`` with nothing added and special-token strings read as special tokens, whatever its state.

    A transformers tokenizer (it has ``split_special_tokens``) is told so on every call; other duck-typed ones
    get ``add_special_tokens=False`` only.
    """
    if hasattr(tokenizer, "split_special_tokens"):
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


def _text(value: object, render: Callable[[str], str]) -> str:
    if not isinstance(value, str) or not value:
        raise EpisodeFailure(
            "processor_error",
            ProcessorError(
                f"{_owner(render)} returned {value!r:.80}; it must return the rendered text (a non-empty str)."
            ),
        )
    return value


def _owner(method: Callable[..., Any]) -> str:
    return str(getattr(method, "__qualname__", repr(method)))


@dataclass
class Calls:
    """Everything that runs on worker threads: env code, processor code and tokenisation. Holds no model."""

    env_factory: Callable[[], Env]
    processor: Processor
    text: EnvText
    max_turns: int
    closer: str
    """The end-of-turn token as text: closes a turn cut by the length limit before the next user turn."""
    deployed: DeployedHistory | None = None
    """With ``history="deployed"``: renders each turn's whole prompt with the chat template."""

    def open(self, index: int, seed: Seed | BaseException) -> Opened:
        """Build the env, reset it with ``seed`` and tokenise the opening prompt."""
        if isinstance(seed, BaseException):  # the dataset row could not become a seed
            raise EpisodeFailure("prompt_error", seed)
        env = call("env_exception", self.env_factory)
        if env is None or not callable(getattr(env, "reset", None)):
            raise EpisodeFailure(
                "env_bad_return",
                EnvError(
                    f"env_factory() returned {env!r:.80}, not an env; it must return a fresh env with reset and step "
                    "(pass the class, e.g. `env_factory=MyEnv`).",
                    env_index=index,
                    turn=0,
                    method="env_factory",
                ),
            )
        result = call("env_exception", env.reset, seed)
        checked = call("env_bad_return", check_result, result, env, method="reset", env_index=index, turn=0)
        if self.deployed is not None:
            messages = self.deployed.opening(checked.delta)
            prompt_ids = self.deployed.encode(messages)
            return Opened(checked.env, prompt_ids, checked.alive, checked.reward, checked.info, messages)
        prompt_ids = self.text.render(self.processor.init_system_input, checked.delta)
        return Opened(checked.env, prompt_ids, checked.alive, checked.reward, checked.info)

    def step(
        self, index: int, env: Env, sampled: Generation, turn: int, messages: list[Message] | None = None
    ) -> Stepped:
        """Decode and parse the sampled turn, step the env with the action, tokenise what follows.

        With ``history="deployed"`` (``messages``: the conversation the turn was sampled from), what follows is the
        next turn's whole prompt: the template's rendering of the conversation with this reply and the env's answer.
        """
        started = time.perf_counter()
        text = call("server_error", self.text.tokenizer.decode, sampled.token_ids, skip_special_tokens=False)
        parsed, status = call("processor_error", _parse, self.processor, text)
        if not (isinstance(parsed, tuple) and len(parsed) == 2 and all(isinstance(x, str) for x in parsed)):
            raise EpisodeFailure(
                "processor_error",
                ProcessorError(
                    f"{type(self.processor).__name__}.parse_agent_output returned {parsed!r:.80}; it must return "
                    "a tuple (reasoning: str, action: str)."
                ),
            )
        result = call("env_exception", env.step, parsed[1])
        checked = call("env_bad_return", check_result, result, env, method="step", env_index=index, turn=turn)
        next_ids = None
        if messages is not None:
            assert self.deployed is not None
            messages = [*messages, self.deployed.reply(text), *self.deployed.answer(checked.delta)]
            if checked.alive and turn < self.max_turns:
                next_ids = self.deployed.encode(messages)
        elif checked.alive and turn < self.max_turns:
            lead = "" if sampled.finish_reason is FinishReason.STOP else self.closer
            if isinstance(checked.delta, ToolResults) and isinstance(self.processor, ToolProcessor):
                pieces = call("processor_error", self.processor.append_segments, checked.delta)
                next_ids = self.text.segments(pieces, lead=lead)
            else:
                next_ids = self.text.render(self.processor.append_user_input, checked.delta, lead=lead)
        results = checked.delta.results if isinstance(checked.delta, ToolResults) else ()
        return Stepped(
            env=checked.env,
            text=text,
            reasoning=parsed[0],
            action=parsed[1],
            parse_status=status,
            env_info=checked.info,
            tool_calls=tuple((r.name, r.ok) for r in results),
            delta=checked.delta,
            reward=checked.reward,
            alive=checked.alive,
            env_s=time.perf_counter() - started,
            next_ids=next_ids,
            messages=messages,
        )

    @staticmethod
    def close(env: Env, index: int, truncated: str | None = None) -> Settled | None:
        """Tell a ``Truncatable`` env that trl-env ended its episode (``truncated``: why), then call ``close()``.

        Returns the reward and info ``truncate`` left (``None`` when the env was not told). ``close()`` runs even
        when ``truncate`` failed; a ``close()`` that fails after a good ``truncate`` keeps what it settled.
        """
        settled = None
        try:
            if truncated is not None and isinstance(env, Truncatable):
                call("env_exception", env.truncate, truncated)
                checked = call(
                    "env_bad_return", check_result, (env, ""), env, method="truncate", env_index=index, turn=-1
                )
                settled = Settled(checked.reward, checked.info)
        finally:
            if isinstance(env, Closable) and callable(env.close):
                try:
                    env.close()
                except BaseException as e:  # noqa: BLE001  # recorded; what truncate settled stands
                    if settled is None:
                        raise
                    settled = dataclasses.replace(settled, close_error=f"{type(e).__name__}: {e}")
        return settled


def _parse(processor: Processor, text: str) -> tuple[object, str | None]:
    """``parse_agent_output``'s answer, and the ``ParseStatus`` value when a family or tool processor parsed it."""
    if (
        isinstance(processor, FamilyProcessor)
        and type(processor).parse_agent_output is FamilyProcessor.parse_agent_output
    ) or isinstance(processor, ToolProcessor):
        parsed = processor.parse(text)
        return (parsed.reasoning, parsed.action), parsed.status.value
    return processor.parse_agent_output(text), None


@dataclass
class Episode:
    """Mutable state of one running episode; ``to_rollout`` freezes it."""

    index: int
    seed: Seed
    env: Env | None = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    """The reward the last ``reset`` or step reported (read when it returned, never after ``close``)."""
    sampled: Generation | None = None
    """The model turn between generation and its env step."""
    generation_s: float = 0.0
    submitted_at: float = 0.0
    ending: Ending | None = None
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] | None = None
    """With ``history="deployed"``: the conversation so far; ``prompt_ids`` + ``completion_ids`` is the current row."""
    rows: list[Row] = field(default_factory=list)
    """Finished rows (``history="deployed"``): the current one is ``prompt_ids``, ``completion_ids``, ... ."""
    row_turns: int = 0
    """Model turns in the current row."""
    anchor: str | None = None
    """The env's ``info["anchor"]`` after its last reset or step: the state the next turn acts on (``Turn.anchor``)."""

    def room(self, budgets: Budgets, extra: int = 0) -> int:
        """Tokens the next model turn may sample once ``extra`` more env tokens are appended."""
        used = len(self.completion_ids) + extra
        room = min(budgets.max_new_tokens, budgets.max_completion_tokens - used)
        if budgets.max_context is not None:
            room = min(room, budgets.max_context - len(self.prompt_ids) - used)
        return room

    def append_model(self, sampled: Generation) -> None:
        """Append the sampled ids and their logprobs verbatim (trained on)."""
        self.completion_ids += sampled.token_ids
        self.logprobs += sampled.logprobs
        self.env_mask += [1] * len(sampled.token_ids)
        self.row_turns += 1
        self.sampled = sampled
        self.generation_s = time.perf_counter() - self.submitted_at

    def append_env(self, stepped: Stepped | None, env_ids: list[int]) -> None:
        """Close the turn in progress with what the env answered (``None``: no step) and append ``env_ids``."""
        assert self.sampled is not None, "a turn closes after it was sampled"
        text = stepped.text if stepped is not None else ""
        self.turns.append(
            Turn(
                text=text,
                reasoning=stepped.reasoning if stepped is not None else "",
                action=stepped.action if stepped is not None else None,
                delta=stepped.delta if stepped is not None else None,
                reward=stepped.reward if stepped is not None else None,
                finish_reason=self.sampled.finish_reason,
                num_model_tokens=len(self.sampled.token_ids),
                num_env_tokens=len(env_ids),
                generation_s=self.generation_s,
                env_s=stepped.env_s if stepped is not None else 0.0,
                parse_status=stepped.parse_status if stepped is not None else None,
                tool_calls=stepped.tool_calls if stepped is not None else (),
                policy=self.sampled.policy,
                anchor=self.anchor,
            )
        )
        if stepped is not None:
            self.anchor = anchor_of(stepped.env_info)
        self.completion_ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.env_mask += [0] * len(env_ids)
        self.sampled = None

    def start_row(self, prompt_ids: list[int]) -> None:
        """Close the current row and open one whose prompt is ``prompt_ids`` (a context that does not extend it)."""
        assert self.sampled is None and self.completion_ids, "a row closes after its turn"
        self.rows.append(self._row())
        self.prompt_ids, self.completion_ids, self.logprobs, self.env_mask = prompt_ids, [], [], []
        self.row_turns = 0

    def _row(self) -> Row:
        return Row(self.prompt_ids, self.completion_ids, self.logprobs, self.env_mask, self.row_turns)

    def finish(self, ending: Ending, error: str = "") -> None:
        """Record the episode's one ending."""
        assert self.ending is None, "an episode ends once"
        self.ending, self.error = ending, error

    def to_rollout(self, placeholder_id: int) -> Rollout:
        """The finished episode; without a model turn, prompt and completion are one masked ``placeholder_id``."""
        assert self.ending is not None, "every episode ends"
        # No reward without a model turn (it would only shift the group's baseline) or after a failure.
        scored = self.ending is not Ending.ERROR and bool(self.turns)
        if not self.completion_ids and self.rows:  # a row opened, then the episode failed before its turn was sampled
            last = self.rows.pop()
            self.prompt_ids, self.completion_ids, self.logprobs, self.env_mask = (
                last.prompt_ids, last.completion_ids, last.logprobs, last.env_mask)  # fmt: skip
            self.row_turns = last.turns
        prompt_ids, completion_ids, logprobs, env_mask = (
            self.prompt_ids,
            self.completion_ids,
            self.logprobs,
            self.env_mask,
        )
        if not completion_ids:
            # TRL needs a non-empty prompt and completion, and pads every row to the batch's longest prompt plus
            # longest completion: one masked stand-in token each, so the row fits any model. Flagged.
            prompt_ids, completion_ids, logprobs, env_mask = [placeholder_id], [placeholder_id], [0.0], [0]
            self.info["placeholder"] = True
            self.info["prompt_tokens"] = len(self.prompt_ids)
        return Rollout(
            seed=self.seed,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            logprobs=logprobs,
            env_mask=env_mask,
            turns=tuple(self.turns),
            reward=self.reward if scored else None,
            ending=self.ending,
            error=self.error,
            info=self.info,
            rows=(*self.rows, Row(prompt_ids, completion_ids, logprobs, env_mask, self.row_turns)),
        )


def anchor_of(info: dict[str, Any] | None) -> str | None:
    """The state key an env's ``info`` names (``info["anchor"]``, as a string), ``None`` without one."""
    if not info or info.get("anchor") is None:
        return None
    return str(info["anchor"])


def check_env_timeout(env_timeout: float | None) -> None:
    """Fail early on a timeout that is not a positive number of seconds (or ``None``)."""
    if env_timeout is not None and not env_timeout > 0:
        raise ConfigError(f"env_timeout={env_timeout!r}: it must be > 0 seconds, or None to wait forever.")
