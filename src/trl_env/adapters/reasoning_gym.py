"""reasoning-gym bridge: ``ReasoningGymEnv`` poses one reasoning-gym problem per episode and scores each answer.

reasoning-gym (https://github.com/open-thought/reasoning-gym; ``pip install 'trl-env[reasoning-gym]'``) generates
problems procedurally (106 datasets in 0.1.25: arithmetic, algebra, logic, puzzles, games) and ships a verifier per
dataset (``dataset.score_answer``). It is imported only when the first env is built.

Thread safety (read in reasoning-gym 0.1.25's source, and tried): most generators draw an entry from its own
``random.Random(dataset_seed + index)``, which is safe on threads and reproducible. Three are not: ``pool_matrix``
seeds and then draws numpy's *global* RNG (``np.random.seed``, ``np.random.randint``), so concurrent entries get
each other's matrices (3 to 12 of 40 entries differed in trials with 4 threads); ``bf`` compiles its programs
through the module-level function and variable tables of its bundled bfit compiler; ``list_functions`` draws some
numbers from the global ``random`` without seeding it, so those entries are not reproducible at all (19 of its first
300 differed between two runs; within one process the entry cache still gives a GRPO group one problem). So
building a dataset and generating an entry hold one process-wide lock; that work is pure Python, serialised by the
GIL anyway. Scoring runs outside the lock: every ``score_answer`` in 0.1.25 reads only its arguments and the
dataset's config, and a slow scorer (sympy on a long expression) must not stall the other episodes.

Some scorers run the model's text as Python: ``eval`` (``binary_matrix``, ``spiral_matrix``, ``string_insertion``,
``n_queens``) or sympy's ``parse_expr``, which calls ``eval`` (``countdown``, ``puzzle24``,
``polynomial_multiplication``, ``simple_integration``, ``intermediate_integration``). Run those in worker processes
(``trl_env.rollout.isolation.isolated``) when the model is not trusted.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from trl_env.env import Action, Delta, Env, Seed, int_seed
from trl_env.errors import ConfigError

_INSTALL_HINT = "pip install 'trl-env[reasoning-gym]'  (or: pip install reasoning-gym==0.1.25)"
DATASET_SEED = 0
"""reasoning-gym's dataset seed when ``dataset_kwargs`` gives none: the pool of ``size`` problems episodes draw from."""

_EXAMPLES = ("basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "countdown", "sudoku")
_lock = threading.Lock()  # reasoning-gym generation touches process-wide state (see the module docs)
_datasets: dict[str, Any] = {}  # dataset config (as JSON) -> dataset, built once per process: some load data files


def seed_to_index(seed: Seed, size: int) -> int:
    """The problem a seed selects: ``int_seed(seed, bits=64) % size``, the same in every process and run.

    A decimal integer seed is the index itself, modulo ``size`` (``"7"`` is problem 7, so ``--seed-format '{i}'``
    gives distinct problems); any other text is hashed: the first 8 bytes of its SHA-256 as an unsigned big-endian
    integer, modulo ``size``. Python's ``hash()`` would differ between processes (``PYTHONHASHSEED``), and every
    copy of a GRPO group, on any rank, must see the same problem.
    """
    return int_seed(seed, bits=64) % size


class ReasoningGymEnv(Env):
    """One reasoning-gym problem per episode: the question, then up to ``attempts`` answers, each scored.

    ``reset(seed)`` picks problem ``seed_to_index(seed, size)`` of the dataset built with
    ``reasoning_gym.create_dataset(dataset, size=size, seed=DATASET_SEED, **dataset_kwargs)`` and returns its
    question. ``step(answer)`` scores the stripped answer with the dataset's own ``score_answer`` (0.0 to 1.0;
    partial credit where the dataset gives it). ``reward`` is the best score so far, so a later worse answer cannot
    undo a better one. The episode ends at a score of 1.0 or after ``attempts`` answers. A scorer that raises on a
    malformed answer (``prime_factorization`` on ``"hello"``: ``ValueError``) scores it 0.0: a malformed answer is
    the model's mistake, not an env failure; the error is kept in ``info["scorer_errors"]``.

    Answers in tags (``<answer>42</answer>``, reasoning-gym's convention) are the processor's job: pass
    ``action_tags=("<answer>", "</answer>")`` to it (``--action-tags`` in ``trl-env eval``).

    ``info`` (JSON-safe; numbers and flags become ``env/info/*`` training metrics): ``problem``
    (``"<dataset>/<index>"``), ``scores`` (one per answer), ``attempts`` (answers given), ``solved`` (a score of
    1.0) and ``scorer_errors``.

    Example::

        env_factory = functools.partial(ReasoningGymEnv, "leg_counting", attempts=2)
        rollout_func = make_rollout_func(env_factory, ChatMLProcessor(action_tags=("<answer>", "</answer>")))

    Args:
        dataset: a reasoning-gym dataset name (``sorted(reasoning_gym.factory.DATASETS)``), e.g. ``"chain_sum"``.
        attempts: answers allowed per episode (1: single-turn).
        size: problems in the pool seeds select from. reasoning-gym generates entry ``i`` from
            ``dataset_seed + i``, so pools overlap unless their dataset seeds are at least ``size`` apart.
        dataset_kwargs: the dataset's config (``min_terms``, ``max_digits``, ...), and optionally ``seed`` (the
            pool; default ``DATASET_SEED``). ``size`` goes in ``size=``.
        feedback: after a wrong answer, say so and how many attempts are left (never the answer). Without it,
            observations after the question are empty.

    Raises:
        ConfigError: when reasoning-gym is not installed, for an unknown dataset, or for arguments the dataset's
            config rejects.
    """

    def __init__(
        self,
        dataset: str,
        *,
        attempts: int = 3,
        size: int = 1000,
        dataset_kwargs: Mapping[str, Any] | None = None,
        feedback: bool = True,
    ) -> None:
        create, registry = _import_reasoning_gym()
        for name, value in (("attempts", attempts), ("size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: expected a positive int, e.g. {name}=3.")
        kwargs = dict(dataset_kwargs or {})
        if "size" in kwargs:
            raise ConfigError(
                f"dataset_kwargs has size={kwargs['size']!r}; pass it as ReasoningGymEnv(..., size={kwargs['size']!r})."
            )
        if not isinstance(dataset, str) or dataset not in registry:
            close = difflib.get_close_matches(str(dataset), registry, n=3)
            hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
            examples = [name for name in _EXAMPLES if name in registry] or sorted(registry)[:5]
            raise ConfigError(
                f"unknown reasoning-gym dataset {dataset!r}; {hint}it has {len(registry)} datasets, e.g. "
                f"{', '.join(examples)} (all: sorted(reasoning_gym.factory.DATASETS))."
            )
        kwargs.setdefault("seed", DATASET_SEED)
        self.dataset_name, self.attempts, self.size, self.feedback = dataset, attempts, size, feedback
        self._key, self._dataset = _dataset(create, registry, dataset, size, kwargs)
        self.reward, self.alive = 0.0, True
        self.info: dict[str, Any] = {}
        self.entry: dict[str, Any] | None = None
        """The episode's problem (``question``, ``answer``, ``metadata``), this env's own copy; the model sees only
        the question."""

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        """Pose problem ``seed_to_index(seed, size)``; the observation is its question."""
        index = seed_to_index(seed, self.size)
        with _lock:
            entry = _entry(self._key, index)
        self.entry = copy.deepcopy(entry)  # the cached entry is shared: a scorer that edits its entry edits a copy
        self.reward, self.alive = 0.0, True
        self.info = {
            "problem": f"{self.dataset_name}/{index}",
            "scores": [],
            "attempts": 0,
            "solved": False,
            "scorer_errors": [],
        }
        return self, str(self.entry["question"])

    def step(self, action: Action) -> tuple[Env, Delta]:
        """Score ``action`` as the answer; the reward is the best score so far."""
        if self.entry is None or not self.alive:
            raise RuntimeError(f"{type(self).__name__}.step called with no episode running: call reset first.")
        try:
            score = float(self._dataset.score_answer(answer=action.strip(), entry=self.entry))
        except Exception as e:  # noqa: BLE001  # scorers assume well-formed answers; a malformed one scores 0
            score = 0.0
            self.info["scorer_errors"].append(f"{type(e).__name__}: {e}"[:200])
        self.info["scores"].append(score)
        self.info["attempts"] += 1
        self.reward = max(self.reward, score)
        solved = self.info["solved"] = score >= 1.0
        left = self.attempts - self.info["attempts"]
        self.alive = not solved and left > 0
        if not self.feedback:
            return self, ""
        if solved:
            return self, "Correct."
        credit = f" (partial credit {score:.2f})" if score > 0 else ""
        if left == 0:
            return self, f"That is not correct{credit}. No attempts left."
        return self, f"That is not correct{credit}. {left} attempt{'s' if left > 1 else ''} left: answer again."


def _import_reasoning_gym() -> tuple[Callable[..., Any], Mapping[str, tuple[type, type]]]:
    """reasoning-gym's ``create_dataset`` and its registry of datasets (name -> (dataset class, config class))."""
    try:
        import reasoning_gym  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional; no py.typed
        from reasoning_gym.factory import DATASETS  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as e:
        raise ConfigError(
            f"ReasoningGymEnv needs reasoning-gym, which is not installed ({e}); run `{_INSTALL_HINT}`."
        ) from e
    create: Callable[..., Any] = reasoning_gym.create_dataset
    registry: Mapping[str, tuple[type, type]] = DATASETS
    return create, registry


def _dataset(
    create: Callable[..., Any],
    registry: Mapping[str, tuple[type, type]],
    name: str,
    size: int,
    kwargs: dict[str, Any],
) -> tuple[str, Any]:
    """This config's key in ``_datasets`` and its dataset, built once per process (an env is made per episode)."""
    key = json.dumps([name, size, kwargs], sort_keys=True, default=repr)
    with _lock:
        if key not in _datasets:
            try:
                _datasets[key] = create(name, size=size, **kwargs)
            except (TypeError, ValueError, AssertionError, KeyError) as e:  # config dataclass, then its validate()
                fields = [f.name for f in dataclasses.fields(registry[name][1]) if f.name != "size"]
                raise ConfigError(
                    f"reasoning-gym rejected dataset_kwargs={kwargs!r} for {name!r} ({type(e).__name__}: {e}); "
                    f"its config takes {', '.join(fields)}."
                ) from e
        return key, _datasets[key]


@functools.lru_cache(maxsize=512)
def _entry(key: str, index: int) -> dict[str, Any]:
    """Entry ``index`` of dataset ``key``, generated once (a GRPO group asks for it ``num_generations`` times).

    Call it holding ``_lock``.
    """
    entry: dict[str, Any] = _datasets[key][index]
    return entry
