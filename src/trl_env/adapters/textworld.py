r"""TextWorld games as trl-env envs: ``TextWorldEnv(quest_length=3)`` (extra ``pip install 'trl-env[textworld]'``).

Tested with textworld 1.7.0 (and the Jericho 3.3.1 Z-machine interpreter it installs; its wheel bundles Inform 7,
so games are generated offline). What the adapter solves once, so a user does not:

- **Games from seeds**: ``reset(seed)`` plays the game TextWorld generates from ``int_seed(seed)`` and the options.
  Each game is generated once into a cache directory keyed by the options and the seed (``cache_dir``, default
  ``$TRL_ENV_TEXTWORLD_CACHE`` or ``~/.cache/trl_env/textworld``), then loaded from there: every copy of a GRPO
  group, in any process, plays the same game. A game is built in a private folder and renamed into place, so
  worker processes generating the same game at once cannot see half a game.
- **Thread safety** (read in textworld 1.7.0's source, and tried): loading a game parses its rules with one
  module-level TatSu parser (``textworld.logic._PARSER``, behind an ``lru_cache`` that does not stop concurrent
  misses); 16 threads loading at once failed in 15 or 16 of 16 loads in each of 5 trials (``IndexError: pop from
  empty list``, ``FailedLeftRecursion``). So generating, loading and resetting a game hold one process-wide lock.
  Steps run outside it: each Jericho ``FrotzEnv`` loads its own copy of ``libfrotz.so`` (Jericho copies the
  library "to avoid concurrency issues"), and TextWorld's per-game state tracking is per instance.
- **Commands**: Frotz reads ``\x0e``-``\x15`` as its hot keys (record, playback, seed, undo, restart, quit,
  debug, help) and ``\x00`` as a time-out. Sent raw, ``"look\x0e"`` wrote a command recording to a file named by
  the command (``look\x0e``) in the working directory, then segfaulted Jericho; ``"look"`` + ``\x00`` or any of
  ``\x0f``-``\x15`` segfaulted; ``"\x0e"`` or ``"\x00"`` alone hung forever. Its input buffer holds 198 bytes.
  ``sanitize_command`` keeps printable ASCII only (accents stripped, other characters and whitespace runs as one
  space) and caps the length. ``save``/``restore`` write and read ``<game>.qzl`` in the working directory, shared
  by concurrent episodes, and ``script`` writes a transcript file there; ``restart`` and ``quit`` leave
  TextWorld's state tracking behind the game. A command with any of those words (anywhere: Inform runs
  ``go east. save`` as two commands) is refused without reaching the game.
- **Crashes**: the sanitiser removes the crashes known to us; for untrusted models run envs in worker processes
  (``env_executor="process"``, ``trl_env.rollout.isolation.isolated``) so a crash still ends only its episode.

Example::

    rollout_func = make_rollout_func(
        functools.partial(TextWorldEnv, world_size=3, quest_length=3), ChatMLProcessor(), max_turns=20
    )
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import unicodedata
import warnings
from pathlib import Path
from typing import Any

from trl_env import cache
from trl_env.env import Action, Delta, Env, Seed, int_seed
from trl_env.errors import ConfigError

_INSTALL_HINT = "pip install 'trl-env[textworld]'  (or: pip install textworld==1.7.0)"
MAX_COMMAND_CHARS = 120
"""Default cap on a command's length (Jericho truncates input past 198 bytes, with a warning)."""
REFUSED = frozenset({"save", "restore", "script", "transcript", "unscript", "noscript", "restart", "quit", "q"})
"""Words that make a command refused: they write or read files in the working directory, or restart the game."""
REFUSAL = "That command is not available in this game."

_JERICHO_INPUT = 198  # jericho.jericho.INPUT_BUFFER_SIZE
_LOCK = threading.Lock()  # generating, loading and resetting games (see the module docs)
_ready: set[Path] = set()  # game files this process has generated or found
_JERICHO_WARNING = r"Game '.*' is not fully supported"
_BANNER = re.compile(r"\A(?:[ _|\\$/<>]*\n)+")  # TextWorld's ASCII-art title: lines of these characters only
_PROMPT = re.compile(r"(?:\n\s*Would you like to RESTART[^\n]*)?\n>[^\n]*\Z")  # prompt and status line


def sanitize_command(text: str, max_chars: int = MAX_COMMAND_CHARS) -> str:
    """``text`` as a safe Z-machine command: printable ASCII only, whitespace runs as one space, at most ``max_chars``.

    Accents are stripped (NFKD: ``"café"`` -> ``"cafe"``); other non-ASCII and control characters become spaces:
    Jericho segfaults or hangs on some control characters.
    """
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = re.sub(r"\s+", " ", "".join(c if " " <= c <= "~" else " " for c in text))
    return text.strip()[:max_chars].strip()


def refused_word(command: str) -> str | None:
    """The first word of ``command`` in ``REFUSED`` (case-insensitive), or ``None``."""
    return next((w for w in re.findall(r"[a-z]+", command.lower()) if w in REFUSED), None)


class TextWorldEnv(Env):
    """One generated TextWorld game per episode; each model turn is one command; reward = score / max_score.

    ``reset(seed)`` generates (or loads from the cache) the game of ``int_seed(seed)`` and returns its
    introduction: the objective and the first room, without the ASCII-art title. ``step(command)`` sanitises the
    command (``sanitize_command``), refuses it if it holds a word in ``REFUSED``, and otherwise plays it; the
    observation is the game's answer, without the prompt and status line. ``reward`` is the score so far over the
    game's maximum (TextWorld scores a quest when it is completed: a one-quest game gives 0.0 or 1.0).
    The episode ends when the game is won or lost, or after ``max_steps`` commands.

    ``info`` (JSON-safe; numbers and flags become ``env/info/*`` training metrics): ``game``
    (``"<options key>/<seed>"``), ``score``, ``max_score``, ``won``, ``lost``, ``moves`` (the game's count),
    ``steps`` (commands received), ``sanitized`` (commands changed by the sanitiser), ``refused`` and, when trl-env
    ended the episode first, ``truncated``. ``walkthrough`` holds the game's winning commands (never shown to the
    model).

    Args:
        world_size: rooms in the world.
        nb_objects: objects in the world (at least those the quest needs).
        quest_length: actions in the winning policy.
        max_steps: commands per episode.
        max_command_chars: cap on a command's length after sanitising.
        cache_dir: where generated games are kept (default ``$TRL_ENV_TEXTWORLD_CACHE`` or
            ``~/.cache/trl_env/textworld``: ``trl_env.cache.cache_dir``).

    Raises:
        ConfigError: when textworld is not installed, or for a size that is not a positive int.
    """

    def __init__(
        self,
        *,
        world_size: int = 3,
        nb_objects: int = 5,
        quest_length: int = 3,
        max_steps: int = 50,
        max_command_chars: int = MAX_COMMAND_CHARS,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._tw = _textworld()
        sizes = {
            "world_size": world_size,
            "nb_objects": nb_objects,
            "quest_length": quest_length,
            "max_steps": max_steps,
            "max_command_chars": max_command_chars,
        }
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"TextWorldEnv({name}={value!r}): expected a positive int, e.g. {name}=3.")
        if max_command_chars > _JERICHO_INPUT:
            raise ConfigError(f"TextWorldEnv(max_command_chars={max_command_chars}): Jericho reads at most 198 bytes.")
        self.options = {"world_size": world_size, "nb_objects": nb_objects, "quest_length": quest_length}
        self.max_steps, self.max_command_chars = max_steps, max_command_chars
        default = cache_dir or cache.cache_dir("textworld", env_var="TRL_ENV_TEXTWORLD_CACHE")
        self.cache_dir = Path(default).expanduser().absolute()
        options = json.dumps([self._tw.__version__, self.options], sort_keys=True)
        self.key = f"w{world_size}-o{nb_objects}-q{quest_length}-{hashlib.sha256(options.encode()).hexdigest()[:8]}"
        self.reward, self.alive = 0.0, True
        self.info: dict[str, Any] = {}
        self.walkthrough: list[str] | None = None
        self._game: Any = None

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Start the game of ``int_seed(seed)`` (generated once, then loaded from the cache); return its intro."""
        self.close()
        number = int_seed(seed)
        infos = self._tw.EnvInfos(score=True, max_score=True, won=True, lost=True, moves=True, extras=["walkthrough"])
        with _LOCK:
            path = self._game_file(number)
            self._game = self._tw.start(str(path), request_infos=infos)
            state = self._game.reset()
        self.walkthrough = list(state.get("extra.walkthrough") or []) or None
        self.info = {
            "game": f"{self.key}/{number}",
            "score": 0,
            "max_score": int(state["max_score"] or 0),
            "won": False,
            "lost": False,
            "moves": 0,
            "steps": 0,
            "sanitized": 0,
            "refused": 0,
        }
        self.reward, self.alive = 0.0, True
        self._update(state)
        return self, _clean(state.feedback)

    def step(self, action: Action) -> tuple[Env, Delta]:
        """Sanitise ``action`` and play it (or refuse it); the observation is the game's answer."""
        if self._game is None or not self.alive:
            raise RuntimeError(f"{type(self).__name__}.step called with no episode running: call reset first.")
        command = self._sanitize(action)
        self.info["steps"] += 1
        self.info["sanitized"] += command != action.strip()
        if refused_word(command):
            self.info["refused"] += 1
            text = REFUSAL
        elif not command:
            text = "I beg your pardon?"
        else:
            state, _, _ = self._game.step(command)
            self._update(state)
            text = _clean(state.feedback)
        if self.alive and self.info["steps"] >= self.max_steps:
            self.alive = False
        if not self.alive:
            self.close()
        return self, text

    def truncate(self, reason: str) -> None:
        """trl-env ended the episode first: record why; the reward stays the score so far."""
        self.info = {**self.info, "truncated": reason}

    def close(self) -> None:
        """Stop the game's interpreter (called by the engine when the episode ends; safe to call twice)."""
        game, self._game = self._game, None
        if game is not None:
            game.close()

    def _sanitize(self, action: str) -> str:
        return sanitize_command(action, self.max_command_chars)

    def _update(self, state: Any) -> None:
        won, lost = bool(state["won"]), bool(state["lost"])
        score, top = int(state["score"] or 0), self.info["max_score"]
        self.info.update(score=score, won=won, lost=lost, moves=int(state["moves"] or 0))
        self.reward = score / top if top > 0 else float(won)
        self.alive = not (won or lost)

    def _game_file(self, number: int) -> Path:
        """The game file of seed ``number``, generated if the cache does not have it. Call it holding ``_LOCK``."""
        folder = self.cache_dir / self.key / str(number)
        path = folder / "game.z8"
        if path in _ready or (path.is_file() and path.with_suffix(".json").is_file()):
            _ready.add(path)
            return path
        folder.parent.mkdir(parents=True, exist_ok=True)
        private = Path(tempfile.mkdtemp(prefix=f".{number}-", dir=folder.parent))
        try:
            options = self._tw.GameOptions()
            options.seeds, options.nb_rooms = number, self.options["world_size"]
            options.nb_objects, options.quest_length = self.options["nb_objects"], self.options["quest_length"]
            options.path, options.force_recompile = str(private / "game.z8"), True
            try:
                self._tw.make(options)
            except Exception as e:  # noqa: BLE001  # TextWorld's generator raises several types
                raise RuntimeError(
                    f"TextWorld could not generate a game with {self.options} from seed {number} "
                    f"({type(e).__name__}: {e}); try a larger world_size or nb_objects."
                ) from e
            try:
                os.rename(private, folder)  # atomic: other processes see the whole game or none
            except OSError:
                if not path.is_file():  # not another process's game already in place
                    raise
        finally:
            shutil.rmtree(private, ignore_errors=True)
        _ready.add(path)
        return path


def _clean(text: str) -> str:
    """The game's text without TextWorld's title art, the input prompt and the status line."""
    return _PROMPT.sub("", _BANNER.sub("", text.lstrip("\n"))).strip("\n")


def _textworld() -> Any:
    try:
        import textworld  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional; no py.typed
    except ImportError as e:
        raise ConfigError(f"TextWorldEnv needs textworld, which is not installed ({e}); run `{_INSTALL_HINT}`.") from e
    # Jericho warns once per game that it does not know TextWorld's games; TextWorld tracks their score itself.
    if not any(f[1] is not None and f[1].pattern == _JERICHO_WARNING for f in warnings.filters):
        warnings.filterwarnings("ignore", message=_JERICHO_WARNING)
    return textworld
