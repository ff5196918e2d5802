"""TRL glue: ``make_rollout_func`` for ``GRPOTrainer(rollout_func=...)`` and the ``env_reward`` reward function.

Follows the rollout_func contract of TRL 1.16 (``trl/trainer/grpo_trainer.py``, ``_generate``):
called on every process with this process's prompts, already repeated ``num_generations`` times;
returns one row per prompt, in order.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from typing_extensions import Unpack

from trl_env.backends.base import Generator, as_generator
from trl_env.backends.vllm_colocate import VLLMColocateGenerator
from trl_env.backends.vllm_server import VLLMServerGenerator
from trl_env.env import Env, RowSeed, Seed
from trl_env.errors import ConfigError, ProcessorError, TrlEnvError
from trl_env.render.processors.base import Processor, check_processor
from trl_env.rollout import Ending, History, Rollout
from trl_env.rollout.failures import FailureLog
from trl_env.rollout.isolation import isolated
from trl_env.rollout.seated import check_executor
from trl_env.rollout.transcripts import write_transcripts
from trl_env.seats import Seating
from trl_env.tools.additivity import RolloutCheck
from trl_env.train.credit import CreditEstimator, credit_estimator
from trl_env.train.episodes import run_episodes
from trl_env.train.metrics import log_metrics
from trl_env.train.options import (
    BackendOptions,
    EngineOptions,
    FlatOptions,
    Limits,
    LoggingOptions,
    RolloutOptions,
)
from trl_env.train.trl_internals import check_rollout_hook, take_over_truncation, wrap_reward_calculation
from trl_env.train.trl_output import RolloutOutput, to_trl


def check_trl_version() -> None:
    """Fail with the installed and required versions if TRL lacks the ``rollout_func(prompts, trainer)`` hook.

    The plain path's one check (``trl_internals.check_rollout_hook``); any TRL in ``SUPPORTED_TRL`` passes.

    Raises:
        ConfigError: for a TRL older than 1.16 or without ``rollout_func``.
    """
    check_rollout_hook()


def env_reward(completions: list[Any], env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """Reward function returning the env's reward for each completion: ``reward_funcs=env_reward``."""
    return list(env_reward)


def prompt_to_seed(prompt: object) -> Seed:
    """The env seed for one dataset prompt.

    The rule: a string is the seed itself; a number (``int``, ``float``, any real, not ``bool``) is
    its ``str``; a conversational prompt (a list of messages) gives the text of its last user
    message (the rest of the list is ignored: use the processor's system prompt). A whole dataset row
    (a mapping with a ``prompt`` column) gives its prompt's seed as a ``RowSeed`` carrying the row.

    Raises:
        ConfigError: for anything else, e.g. a message list without a user message, ``None`` or a mapping
            without ``prompt``.
    """
    if isinstance(prompt, Mapping):
        if "prompt" not in prompt:
            raise ConfigError(
                f"dataset row {dict(prompt)!r:.120} has no 'prompt' column, so it gives no env seed; name the seed's "
                "column 'prompt'."
            )
        return RowSeed(prompt_to_seed(prompt["prompt"]), prompt)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, numbers.Real) and not isinstance(prompt, bool):
        return str(prompt)
    if isinstance(prompt, (list, tuple)):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content", "")
                if isinstance(content, list):  # typed content blocks: keep the text ones
                    return "".join(b.get("text", "") for b in content if isinstance(b, dict))
                return str(content)
        raise ConfigError(
            f"prompt {prompt!r:.120} has no message with role 'user', so it gives no env seed; put the seed in a "
            "user message or use string prompts."
        )
    raise ConfigError(
        f"prompt {prompt!r:.120} ({type(prompt).__name__}) is not a seed; use strings (or numbers) as prompts, or "
        "message lists whose last user message holds the seed."
    )


def seed_or_error(prompt: object) -> Seed | BaseException:
    """A bad dataset row fails only its own episode (``prompt_error``), not the batch."""
    try:
        return prompt_to_seed(prompt)
    except TrlEnvError as e:
        return e


def make_rollout_func(
    env_factory: Callable[[], Env] | Seating,
    processor: Processor,
    *,
    system_prompt: str | None = None,
    limits: Limits | None = None,
    engine: EngineOptions | None = None,
    backend: BackendOptions | None = None,
    logging: LoggingOptions | None = None,
    credit: str | CreditEstimator = "episode",
    **options: Unpack[FlatOptions],
) -> Callable[[list[Any], Any], RolloutOutput]:
    """Build ``rollout_func(prompts, trainer)`` for ``GRPOTrainer``.

    Each prompt is an env seed; each copy of a prompt (TRL repeats it ``num_generations`` times)
    gets its own fresh env with the same seed, so a GRPO group shares one problem. Pair it with
    ``reward_funcs=env_reward``. Options come in four typed groups (``trl_env.train.options``),
    or as their flat keywords: ``make_rollout_func(Env, processor, max_turns=4, env_timeout=60)``.

    Args:
        env_factory: builds a fresh env; called once per episode. A ``trl_env.seats.Seating`` plays games of several
            seats (docs/selfplay.md): ``k`` consecutive prompts (``k`` policy seats) are one game, one seat's each.
        processor: chat formatting for the model family (e.g. ``ChatMLProcessor()``).
        system_prompt: replaces the processor's ``system_prompt`` field.
        limits: ``Limits``: ``max_turns`` (8), ``max_new_tokens``, ``max_completion_tokens`` (default:
            ``GRPOConfig.max_completion_length``), ``max_context`` (default: the generator's context limit).
        engine: ``EngineOptions``: ``parse_truncated_turns``, ``strict``, ``env_workers``, ``env_timeout``,
            ``env_executor`` (``"process"``: each env in a worker process, see ``trl_env.rollout.isolation``),
            ``env_memory_mb``, ``coalesce_s`` (how long a ready turn waits to be batched with others; ``"auto"``: a
            third of a typical env step, 10 to 50 ms), ``history`` (``"sampled"``; ``"deployed"``: each turn sampled
            from the chat template's rendering, several rows per episode, trained with
            ``trl_env.train.episode_trainer.EpisodeGRPOTrainer``; docs/history.md) and ``template_kwargs``.
        backend: ``BackendOptions``: ``generator`` (a ``Generator`` or ``trainer -> Generator``; default:
            the trainer's model in process with ``use_vllm=False``, a vLLM client with ``vllm_mode="server"``),
            ``base_url`` (vLLM server URL(s); with ``use_vllm=False`` it still selects the server backend),
            ``lora_sync`` (a directory: serve the trainer's PEFT adapter from the server(s) at each new step).
        logging: ``LoggingOptions``: ``transcripts`` (a JSONL path), ``transcripts_every``,
            ``check_template_every`` (compare a sample of rollouts with the chat template, warn once).
        credit: how each turn's advantage is computed (docs/credit.md): ``"episode"`` (default: every token gets
            its episode's group advantage, TRL's own), ``"discounted"``, ``"gigpo"``, ``"per_turn_index"`` (the
            biased reference) or a ``trl_env.train.credit.CreditEstimator``. Any other than ``"episode"`` trains with
            ``trl_env.train.episode_trainer.EpisodeGRPOTrainer`` (per-token advantages).
        **options: the same options by their flat names.

    Returns:
        The rollout function; its output is a ``RolloutOutput``.

    Raises:
        ConfigError, ProcessorError: for bad arguments, at once.
    """
    check_trl_version()
    if not callable(env_factory) and not isinstance(env_factory, Seating):
        raise ConfigError(
            f"env_factory={env_factory!r} is not callable; pass the env class or a function that returns a "
            "fresh env, e.g. `env_factory=MyEnv`, not `MyEnv()`."
        )
    check_processor(processor)
    credit_estimator(credit, "group")  # a bad value fails here, not at the first step
    if system_prompt is not None:
        processor = with_system_prompt(processor, system_prompt)
    groups = {"limits": limits, "engine": engine, "backend": backend, "logging": logging}
    built = RolloutOptions.build(groups, options)
    check_executor(env_factory, built.engine.env_executor)
    tools = _declared_tools(env_factory)
    if built.engine.env_executor == "process" and not isinstance(env_factory, Seating):
        env_factory = isolated(env_factory, pool_size=built.engine.env_workers, memory_mb=built.engine.env_memory_mb)
    return RolloutFunction(env_factory, processor, built, credit=credit, tools=tools)


def _declared_tools(env_factory: Any) -> tuple[dict[str, Any], ...]:
    """The tools an ``agent_env_factory(..., tools=...)`` declares (its module is loaded if one was built)."""
    agents = sys.modules.get("trl_env.agents.env")
    return env_factory.tools if agents is not None and isinstance(env_factory, agents.AgentEnvFactory) else ()


def with_system_prompt(processor: Processor, system_prompt: str) -> Processor:
    """``processor`` with its ``system_prompt`` field replaced; a ``ConfigError`` where it has none."""
    fields: set[str] = set()
    if dataclasses.is_dataclass(processor):
        fields = {f.name for f in dataclasses.fields(processor)}
    if "system_prompt" not in fields:
        raise ConfigError(
            f"system_prompt was given but {type(processor).__name__} has no `system_prompt` field; set the "
            "system prompt in your processor's init_system_input instead."
        )
    return dataclasses.replace(processor, system_prompt=system_prompt)  # type: ignore[type-var]  # checked above


class RolloutFunction:
    """``rollout_func(prompts, trainer)``: one ``batch_rollout`` per call, on every process, with TRL's glue."""

    def __init__(
        self,
        env_factory: Callable[[], Env] | Seating,
        processor: Processor,
        options: RolloutOptions,
        *,
        credit: str | CreditEstimator = "episode",
        tools: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.env_factory, self.processor, self.options = env_factory, processor, options
        self.tools = tools
        """The tools the env factory declares (``agent_env_factory(..., tools=...)``), checked by ``check_config``."""
        self._config_checked = False
        self.credit = credit
        """``make_rollout_func``'s ``credit=``, read by ``EpisodeGRPOTrainer`` (GRPOTrainer takes only "episode")."""
        self._generators: dict[int, tuple[Callable[[], Any], Generator]] = {}
        """One generator per live trainer object: by ``id``, with a reference to the trainer it was made for (weak where
        the trainer takes one), checked on every look-up, so a new trainer at a dead one's address never gets its
        generator."""
        self._template_check: RolloutCheck | None = None
        self.failures = FailureLog(stop_on_config_failure=options.engine.stop_on_config_failure)
        self.mask_truncated = False
        """The trainer's ``mask_truncated_completions``, read at each call (trl-env applies it, TRL's rule is off)."""

    def __call__(self, prompts: list[Any], trainer: Any) -> RolloutOutput:
        """Run one episode per prompt (a fresh env each) and return TRL's rows, in order.

        Raises:
            ConfigError: with ``history="deployed"`` (several rows per episode) or a ``credit`` other than
                ``"episode"`` (per-token advantages): train with ``EpisodeGRPOTrainer``.
        """
        if self.options.engine.history is History.DEPLOYED:
            raise ConfigError(
                "history='deployed' gives several training rows per episode, and GRPOTrainer's rollout_func takes one "
                "row per prompt; train with trl_env.train.episode_trainer.EpisodeGRPOTrainer (same arguments)."
            )
        if self.credit != "episode":
            raise ConfigError(
                f"credit={self.credit!r} gives each turn its own advantage, and GRPOTrainer gives one per row; train "
                "with trl_env.train.episode_trainer.EpisodeGRPOTrainer (same arguments), or use "
                "credit='episode'."
            )
        rollouts = self.rollouts(prompts, trainer)
        return to_trl(rollouts, mask_truncated=self.mask_truncated)

    def rollouts(self, prompts: list[Any], trainer: Any) -> list[Rollout]:
        """Run one episode per prompt, log its metrics and transcripts, and return the ``Rollout``s in order.

        ``prompts`` may be whole dataset rows (``EpisodeGRPOTrainer`` passes them): each seed then carries its row
        (``prompt_to_seed``, ``RowSeed``).

        Also takes over ``mask_truncated_completions`` (``self.mask_truncated`` holds the trainer's setting).
        """
        gen = self._generator(trainer)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)  # a processor wraps it
        _exclude_failed_from_rewards(trainer)
        # trl-env decides which episodes are truncated; TRL's own rule (last token not EOS) is switched off.
        self.mask_truncated = take_over_truncation(trainer)
        engine = self.options.engine
        if not self._config_checked:  # GRPOTrainer's construction does not tell us; EpisodeGRPOTrainer's did
            self.check_config(tokenizer, trainer.args.max_completion_length, gen.context_limit)
        with gen.session():  # e.g. wake a sleeping colocated vLLM
            budgets = self.options.limits.budgets(trainer.args.max_completion_length, gen.context_limit)
            seeds = [seed_or_error(p) for p in prompts]
            rollouts = run_episodes(seeds, self.env_factory, self.processor, tokenizer, gen, engine, budgets)
        log_metrics(trainer, rollouts)
        self.failures(rollouts, step=int(getattr(getattr(trainer, "state", None), "global_step", 0)) + 1)
        self._write_transcripts(trainer, rollouts, tokenizer)
        if engine.history is History.SAMPLED:  # deployed rows are the template's rendering by construction
            self._check_template(rollouts, tokenizer)
        return rollouts

    def check_config(self, tokenizer: Any, max_completion_length: int, context_limit: int | None) -> None:
        """Refuse, before any episode, a configuration that would fail every episode for a reason known now.

        Args:
            tokenizer: The trainer's tokenizer (its chat template).
            max_completion_length: ``GRPOConfig.max_completion_length``.
            context_limit: The model's context length, where known (``make_rollout_func(max_context=...)`` wins).

        Raises:
            ConfigError: the env factory declares tools (``agent_env_factory(..., tools=...)``) and the chat template
                renders no tool-calling conversation; or the opening prompt (system prompt and the template's
                opening) alone fills ``max_context``.
        """
        from trl_env.render.tools.format import ToolFormat

        self._config_checked = True
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a multimodal processor wraps it
        template_kwargs = dict(self.options.engine.template_kwargs or {})
        if self.tools:
            names = ", ".join(tool["function"]["name"] for tool in self.tools)
            try:
                ToolFormat.read(tokenizer, list(self.tools), template_kwargs=template_kwargs)
            except ProcessorError as e:
                raise ConfigError(
                    f"agent_env_factory(..., tools=[{names}]) declares tools, and the tokenizer's chat template "
                    f"renders no tool-calling conversation with them ({e}): every episode would fail at its first "
                    "call. Set tokenizer.chat_template to a tool-capable template (the model family's own, or one "
                    "TRL ships, e.g. trl/chat_templates/qwen2_5.jinja for ChatML models: `trl-env eval "
                    "--chat-template qwen2_5`), or drop the tools."
                ) from e
        max_context = self.options.limits.budgets(max_completion_length, context_limit).max_context
        if max_context is None:
            return
        try:  # the processor's opening before any env text: a lower bound of every episode's first prompt
            opening = len(tokenizer.encode(self.processor.init_system_input(""), add_special_tokens=False))
        except (TrlEnvError, ValueError):
            return  # a processor that cannot render an empty prompt: the engine reports it per episode
        if opening >= max_context:
            raise ConfigError(
                f"the opening prompt (the processor's system prompt and the chat template's opening, before any env "
                f"text) is {opening} tokens, and max_context={max_context} leaves no room for one sampled token: "
                "every episode would end before its first turn. Shorten the system prompt, or raise max_context "
                "(make_rollout_func(max_context=...); default: the model's context length)."
            )

    def _generator(self, trainer: Any) -> Generator:
        backend = self.options.backend
        made_for, gen = self._generators.get(id(trainer), (None, None))
        if gen is None or made_for is None or made_for() is not trainer:
            gen = _make_generator(backend.generator, trainer, backend.base_url)
            self._generators[id(trainer)] = (_reference(trainer), gen)
        if backend.lora_sync is not None:
            if not isinstance(gen, VLLMServerGenerator):
                raise ConfigError(f"lora_sync needs a vLLM server generator, got {type(gen).__name__}; pass base_url=.")
            gen.sync_lora(trainer, str(backend.lora_sync))
        return gen

    def _check_template(self, rollouts: Sequence[Rollout], tokenizer: Any) -> None:
        every = self.options.logging.check_template_every
        if every <= 0:
            return
        if self._template_check is None:
            self._template_check = RolloutCheck(tokenizer, self.processor, every=every)
        self._template_check([r for r in rollouts if r.turns and r.ending is not Ending.ERROR])

    def _write_transcripts(self, trainer: Any, rollouts: Sequence[Rollout], tokenizer: Any) -> None:
        logging = self.options.logging
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        if logging.transcripts is None or step % max(1, logging.transcripts_every):
            return
        write_transcripts(
            logging.transcripts,
            rollouts,
            step=step,
            tokenizer=tokenizer,
            process_index=int(getattr(getattr(trainer, "accelerator", None), "process_index", 0)),
            mode="train" if trainer.model.training else "eval",
        )


def _exclude_failed_from_rewards(trainer: Any) -> None:
    """Make TRL treat failed episodes as unscorable, whatever reward functions and weights the user gave.

    TRL 1.16 leaves a row out of its group's mean and std, and gives it advantage 0, only when
    *every* reward function returned ``None`` for it; a second function returning 0.0 would bring
    the failed row back in. So the trainer's reward computation is wrapped once: after it ran,
    the rows of failed episodes (gathered across processes, in TRL's order) are set to NaN.
    """
    import torch

    def excluding_failed(calculate: Callable[..., Any]) -> Callable[..., Any]:
        def calculate_rewards(inputs: list[dict[str, Any]], *args: Any) -> Any:
            rewards = calculate(inputs, *args)  # (rows of every process, reward functions)
            failed = torch.tensor(
                [int(row.get("env_ending") == Ending.ERROR.value) for row in inputs], device=rewards.device
            )
            failed = trainer.accelerator.gather(failed).bool()
            rewards[failed] = torch.nan
            return rewards

        return calculate_rewards

    wrap_reward_calculation(trainer, excluding_failed)


def _reference(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj``, or a strong one where it takes none (a stand-in trainer in tests)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _make_generator(
    generator: Generator | Callable[[Any], Generator] | None, trainer: Any, base_url: str | Sequence[str] | None
) -> Generator:
    if generator is None:
        args = trainer.args
        if base_url is not None:
            return VLLMServerGenerator.from_trainer(trainer, base_url=base_url)
        if not getattr(args, "use_vllm", False):
            from trl_env.backends.transformers import TransformersGenerator  # torch: imported only when used

            return TransformersGenerator.from_trainer(trainer)
        if args.vllm_mode == "server":
            return VLLMServerGenerator.from_trainer(trainer, base_url=base_url)
        if args.vllm_mode == "colocate":
            return VLLMColocateGenerator.from_trainer(trainer)
        raise ConfigError(f"vllm_mode={args.vllm_mode!r}: expected 'server' or 'colocate'.")
    if callable(getattr(generator, "submit", None)):
        return as_generator(generator)
    return as_generator(generator(trainer))  # type: ignore[operator]  # a factory trainer -> Generator
