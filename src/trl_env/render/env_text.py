"""Tokenising env text (``EnvText``: trl-env's own copy of the tokenizer) and ``call``, the boundary around user code.

``EnvText`` keeps text from the env from ever becoming a special (added) token and does not depend on state other code
sets on the shared tokenizer; ``call`` runs user code (env, processor) and classifies what it raises by where it
happened. Both run on worker threads (calls.py's ``Calls``), never on the scheduler thread.
"""

from __future__ import annotations

import copy
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from trl_env.errors import EnvTimeoutError, EpisodeFailure, ProcessorError

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

    @property
    def own(self) -> Callable[[str], list[int]] | None:
        """The encode of trl-env's copy of the tokenizer: the same for every ``EnvText`` of it.

        ``None``: the tokenizer's own ``encode`` is read at each call (no Rust backend, or the copy tokenised a
        probe otherwise).
        """
        return self._fast

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
