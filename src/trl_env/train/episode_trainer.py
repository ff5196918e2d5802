"""Several training rows per episode for ``GRPOTrainer``: ``EpisodeGRPOTrainer`` and the per-episode group statistics.

With ``history="deployed"`` an episode gives one row per turn whose context the template rewrote (docs/history.md).
TRL 1.16's ``rollout_func`` takes one row per prompt, so this subclass scores the *episodes* (reward functions,
failed episodes left out, TRL's group statistics over episodes) and then builds the batch TRL's loss reads from the
rows, each carrying its episode's advantage: the batch ``GRPOTrainer._generate_and_score_completions`` would build
(``tests/test_credit_grpo.py`` checks it key by key), without entering that method or rewriting TRL's logs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from trl import GRPOTrainer

from trl_env.errors import ConfigError
from trl_env.rollout import History, Rollout
from trl_env.train.advantages import episode_advantages, nan_std, weighted_rewards
from trl_env.train.credit import (
    CreditEstimator,
    EpisodeCredit,
    credit_estimator,
    credit_metrics,
    estimate,
)
from trl_env.train.grpo import RolloutFunction, env_reward
from trl_env.train.micro_batches import (
    REAL_ROW,
    MicroStep,
    check_micro_batches,
    micro_step_loss,
    plan_micro_steps,
)
from trl_env.train.packing import packing_enabled, trainer_packed_logps
from trl_env.train.trl_internals import (
    calculate_rewards,
    log_metrics_once,
    log_rows,
    loss_extras,
    metric_lists,
    micro_step_index,
    policy_logps,
    require_tested_trl,
    spread_pending_extras,
    sync_weights_once_per_step,
    tokenizer_of,
    trl_compute_loss,
    trl_prepare_inputs,
)
from trl_env.train.trl_output import training_rows, trl_output

__all__ = ["EpisodeGRPOTrainer", "env_reward_columns", "episode_advantages"]


def env_reward_columns(reward_funcs: Sequence[Any]) -> list[int]:
    """The positions of ``trl_env.env_reward`` in ``reward_funcs``, whose scores per-turn credit reads turn by turn.

    ``env_reward`` is found as itself, as a ``functools.partial`` of it and as a function that wraps it with
    ``functools.wraps`` (any nesting of these); ``_check_env_reward_scores`` then checks that it scored the env's
    rewards. Any other reward function judges the whole episode: its score is earned at the last turn.

    Raises:
        ConfigError: for a reward function named ``env_reward`` that is not trl_env's (a copy, or one of your own),
            which would otherwise silently put the env's reward on the last turn.
    """
    columns = []
    for i, func in enumerate(reward_funcs):
        inner = _unwrapped(func)
        if inner is env_reward:
            columns.append(i)
        elif getattr(inner, "__name__", None) == "env_reward":
            raise ConfigError(
                f"reward_funcs[{i}] is named env_reward but is not trl_env.env_reward ({inner!r:.80}): per-turn "
                "credit reads the env's reward turn by turn only from trl_env.env_reward (itself, a functools.partial "
                "of it or a functools.wraps wrapper of it); any other reward function is earned at the episode's last "
                "turn. Pass trl_env.env_reward itself, or give yours another name if it judges the whole episode."
            )
    return columns


def _unwrapped(func: Any) -> Any:
    """``func`` without its ``functools.partial`` and ``functools.wraps`` layers."""
    while True:
        func = inspect.unwrap(func)
        if not isinstance(func, functools.partial):
            return func
        func = func.func


def _check_env_reward_scores(
    rewards_per_func: torch.Tensor, columns: Sequence[int], rollouts: Sequence[Rollout], names: Sequence[str]
) -> None:
    """Refuse an ``env_reward`` wrapper that changed the env's rewards: how it did, per turn, credit cannot know."""
    expected = torch.tensor([math.nan if r.reward is None else r.reward for r in rollouts], dtype=torch.float64)
    for i in columns:
        got = rewards_per_func[:, i].detach().to("cpu", torch.float64)
        differs = ~torch.isclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)  # TRL's scores are float32
        if differs.any():
            k = int(differs.nonzero()[0])
            raise ConfigError(
                f"reward function {names[i]!r} (reward_funcs[{i}]) wraps trl_env.env_reward but scored episode {k} "
                f"as {got[k].item():g} where the env's reward is {expected[k].item():g}: per-turn credit spreads "
                "env_reward's score over the turns as env.reward changed, and cannot tell how your wrapper changed "
                "it. Pass trl_env.env_reward itself and weight it with GRPOConfig(reward_weights=...), or make yours "
                "a reward function of its own (another name, not functools.wraps or partial of env_reward): its "
                "score is then earned at the episode's last turn."
            )


def _mean_on(values: Sequence[float], mask: Sequence[int]) -> float:
    """The mean of ``values`` where ``mask`` is 1 (0.0 where it is nowhere)."""
    kept = [v for v, m in zip(values, mask, strict=True) if m]
    return sum(kept) / len(kept) if kept else 0.0


class EpisodeGRPOTrainer(GRPOTrainer):  # type: ignore[misc]  # trl is untyped
    """``GRPOTrainer`` for episodes of several rows (``history="deployed"``); same arguments, same results otherwise.

    Takes a ``rollout_func`` from ``make_rollout_func``. For each generation batch it runs the episodes, then:

    1. scores each *episode* with the reward functions (they see the episode: its keys ``env_reward``,
       ``env_ending``, ``env_turns``, and as its completion the text of all its rows' completions, every sampled
       token once); failed episodes are out of the group statistics, as with ``GRPOTrainer``;
    2. computes one advantage per episode with TRL's own rule (``scale_rewards``, ``multi_objective_aggregation``,
       reward weights): each episode counts once in its group's mean and std, however many rows it has;
    3. builds the batch TRL's loss reads from the rows (``to_trl_rows``, padded as TRL pads them), each with its
       episode's advantage, with the old and reference logprobs and importance-sampling ratios TRL would add
       (``trl_internals.policy_logps``), and logs the step's metrics once under TRL's names; TRL's loss then runs
       per row as usual.

    Each sampled token is in exactly one row, so token-level losses (``dapo``, the default, ``bnpo``, ``cispo``,
    ``vespo``) weigh every trained token as ``history="sampled"`` does, only in its deployed context. ``grpo`` and
    ``sapo`` average per row, so an episode of k rows weighs k times; ``dr_grpo`` divides by rows x
    ``max_completion_length``; ``luspo`` sums per row. With ``history="deployed"`` the rows go to the
    optimizer in micro-batches of at most ``max_micro_batch_tokens`` tokens (rows x padded length; with ``packing``
    the unique tokens its packed forward runs; default ``per_device_train_batch_size`` rows), however many rows the
    episodes have, each normalised as one batch of its optimizer step's rows on every process would be
    (``trl_env.train.micro_batches``); the padding rows that
    give every process the same number of rows count in no denominator. ``history="sampled"`` trains exactly as
    ``GRPOTrainer`` does.

    With ``make_rollout_func(..., credit=...)`` other than ``"episode"`` (docs/credit.md), step 2 gives each *turn*
    its advantage and TRL receives them per token, shape (rows, completion length): each model token gets its
    turn's, env and padding tokens 0. TRL's loss multiplies advantages per token for every loss type, so ``grpo``,
    ``dapo``, ``dr_grpo``, ``bnpo`` and the others weigh tokens exactly as above. The turn rewards: each turn earns
    ``w`` x the change of ``env.reward`` over its step, ``w`` the weight of ``env_reward`` among ``reward_funcs``
    (a ``functools.partial`` or ``wraps`` of it counts: ``env_reward_columns``; 0 if absent); the rest of the
    episode's weighted reward (``sum_k w_k R_k``, TRL's) goes to its last turn, so other reward functions, which
    judge whole episodes, are earned at the end, and the turn rewards always sum to
    the reward TRL would use. A named estimator takes the trainer's ``scale_rewards`` (``"group"`` or ``"none"``);
    ``"batch"`` and ``multi_objective_aggregation="normalize_then_sum"`` are refused (they normalise episodes, not
    turns). Failed episodes get 0 everywhere and stay out of every statistic. Logged under ``credit/``:
    ``trl_env.train.credit.credit_metrics``.

    ``packing=True`` (docs/packing.md) runs each forward TRL's loss and its old / reference logprobs take
    (``_get_per_token_logps_and_entropies``) prefix-shared and padding-free: the forward's rows folded into a prefix
    trie, each unique token forwarded once under an ancestor attention mask, each row's per-token logprobs gathered
    back (``trl_env.train.packing``); TRL's loss then runs on the rows as before. Models whose attention cannot take
    the mask (sliding window, linear attention, sinks, flash-attention) are refused here; ``packing="if_supported"``
    trains them unpacked instead. Logged: ``packing/ratio`` and ``packing/padding_fraction``.
    """

    def __init__(
        self, *args: Any, max_micro_batch_tokens: int | None = None, packing: bool | str = False, **kwargs: Any
    ) -> None:
        require_tested_trl("EpisodeGRPOTrainer")  # it builds the batch of TRL's private scoring step (trl_internals)
        super().__init__(*args, **kwargs)
        self._packing = packing_enabled(self.model, packing)  # trl_env.train.packing: prefix-shared forwards
        func = self.rollout_func
        config: Any = self.args  # a GRPOConfig
        credit = func.credit if isinstance(func, RolloutFunction) else "episode"  # not one: refused at the first step
        if isinstance(func, RolloutFunction):  # what would fail every episode is refused now, not after a step
            context = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
            func.check_config(self.processing_class, config.max_completion_length, context)
        self._row_steps: list[MicroStep] | None = None
        self._max_micro_batch_tokens = max_micro_batch_tokens
        self._bounded_rows = isinstance(func, RolloutFunction) and func.options.engine.history is not History.SAMPLED
        if self._bounded_rows:
            check_micro_batches(
                config.steps_per_generation,
                config.gradient_accumulation_steps,
                max_micro_batch_tokens,
                loss_extras(self),
            )
        if credit != "episode":
            env_reward_columns(self.reward_funcs)  # a function named env_reward that is not trl_env's: refused now
            if self.multi_objective_aggregation != "sum_then_normalize":
                raise ConfigError(
                    f"multi_objective_aggregation={self.multi_objective_aggregation!r} with credit={credit!r}: "
                    "per-turn credit needs one reward per episode to spread over its turns; use 'sum_then_normalize'."
                )
            if self.scale_rewards not in ("group", "none"):
                raise ConfigError(
                    f"scale_rewards={self.scale_rewards!r} with credit={credit!r}: the credit estimators normalise "
                    "within a group; use scale_rewards='group' or 'none'."
                )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch TRL's loss reads, built here: episodes run and scored once, advantages computed once.

        TRL's ``_prepare_inputs`` calls this for each generation batch (``trl_internals`` lists the name). The rows
        are ``to_trl_rows``'s, padded as TRL pads them; the logprob tensors TRL adds come from
        ``trl_internals.policy_logps``; the metrics are logged once, under TRL's names (``_log_batch``).
        """
        trainer: Any = self  # TRL is untyped
        func = self.rollout_func
        if not isinstance(func, RolloutFunction):
            raise ConfigError(f"EpisodeGRPOTrainer needs rollout_func=make_rollout_func(...), got {func!r:.80}.")
        mode = "train" if trainer.model.training else "eval"
        prompts = [x["prompt"] for x in inputs]
        sync_weights_once_per_step(self)
        rollouts = func.rollouts(inputs, self)  # whole rows: each seed carries its row (``RowSeed``, AgentRun.extra)
        advantages, rewards_per_func = self._score_episodes(inputs, prompts, rollouts, mode)  # every process's
        start = self.accelerator.process_index * len(rollouts)  # this process's episodes, in TRL's gathered order
        local = slice(start, start + len(rollouts))
        group = self.num_generations if mode == "train" else self.num_generations_eval
        assert group is not None, "TRL sets num_generations_eval (it defaults to num_generations)"
        per_turn = None
        if func.credit != "episode":
            per_turn = self._turn_credit(func.credit, rollouts, rewards_per_func, group, mode, local)
        train = training_rows(rollouts, per_turn, mask_truncated=func.mask_truncated)  # every trainer's rows
        output_rows, episode = trl_output(rollouts, train)
        per_token = None if per_turn is None else [t.advantages for t in train]
        rows: dict[str, list[Any]] = dict(output_rows)  # type: ignore[arg-type]  # every value is a list
        pad = 0  # several processes: every one gets the most rows of any (TRL gathers rows), in no denominator
        if self._bounded_rows and self.accelerator.num_processes > 1:
            counts = self.accelerator.gather(torch.tensor([len(episode)], device=self.accelerator.device))
            pad = int(counts.max()) - len(episode)
        for values in rows.values():  # fully masked copies of the last row
            values.extend([values[-1]] * pad)
        rows["env_mask"][len(episode) :] = [[0] * len(m) for m in rows["env_mask"][len(episode) :]]
        episode += [-1] * pad
        batch = self._pad_rows(rows)
        mine = advantages[local].to(batch["completion_ids"].device)
        row_advantages = torch.stack([mine[e] if e >= 0 else mine.new_zeros(()) for e in episode])
        batch["advantages"] = row_advantages
        if per_token is not None:  # (rows, completion length): each model token its turn's advantage, the rest 0
            table = torch.zeros(batch["completion_ids"].shape, dtype=torch.float32)
            for i, values in enumerate(per_token):
                table[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
            batch["advantages"] = table.to(batch["completion_ids"].device)
            # a row's logged advantage: the mean over its model tokens
            row_advantages = torch.tensor(
                [_mean_on(a, m) for a, m in zip(per_token, rows["env_mask"], strict=False)] + [0.0] * pad
            )
        if self._bounded_rows:  # the micro-batches leave padding rows out of every denominator
            batch[REAL_ROW] = torch.tensor([e >= 0 for e in episode], device=batch["completion_ids"].device)
        batch.update(policy_logps(self, batch, mode))
        self._log_batch(mode, inputs, rows, episode, local, rewards_per_func, row_advantages, group)
        return batch

    def _pad_rows(self, rows: dict[str, list[Any]]) -> dict[str, Any]:
        """The rows as TRL's padded tensors: prompts left-, completions right-padded, ``env_mask`` as ``tool_mask``.

        Exactly ``GRPOTrainer``'s padding of a ``rollout_func``'s rows (``pad_to_multiple_of`` included); its
        ``mask_truncated_completions`` rule is trl-env's here (``to_trl_rows``), and ``num_items_in_batch`` counts the
        trained tokens of every process.
        """
        from trl.trainer.utils import pad

        config: Any = self.args  # a GRPOConfig
        device, multiple = self.accelerator.device, config.pad_to_multiple_of
        pad_id = tokenizer_of(self).pad_token_id

        def padded(lists: list[list[Any]], value: Any, side: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            tensors = [torch.tensor(x, dtype=dtype) for x in lists]
            return pad(tensors, padding_value=value, padding_side=side, pad_to_multiple_of=multiple).to(device)

        prompts, completions = rows["prompt_ids"], rows["completion_ids"]
        logprobs = [[math.nan if x is None else x for x in row] for row in rows["logprobs"]]
        batch = {
            "prompt_ids": padded(prompts, pad_id, "left"),
            "prompt_mask": padded([[1] * len(p) for p in prompts], 0, "left", torch.long),
            "completion_ids": padded(completions, pad_id, "right"),
            "completion_mask": padded([[1] * len(c) for c in completions], 0, "right", torch.long),
            "sampling_per_token_logps": padded(logprobs, 0.0, "right", torch.float32),
            "tool_mask": padded(rows["env_mask"], 1, "right"),
        }
        trained = (batch["completion_mask"] * batch["tool_mask"]).sum()
        batch["num_items_in_batch"] = self.accelerator.gather(trained).sum()
        return batch

    def _log_batch(
        self,
        mode: str,
        inputs: list[dict[str, Any]],
        rows: dict[str, list[Any]],
        episode: list[int],
        local: slice,
        rewards_per_func: torch.Tensor,
        row_advantages: torch.Tensor,
        group: int,
    ) -> None:
        """TRL's metrics and completion table for this batch, logged once under TRL's names.

        Per row, as ``GRPOTrainer`` logs a ``rollout_func``'s rows: ``num_tokens`` and ``completions/*`` (a row's
        length is its model tokens), the completion table (``_logs``: each row beside its episode's rewards, its
        advantage, the ``log_extra`` values its episode's reward functions gave). Per episode: ``rewards/*``,
        ``reward``, ``reward_std``, ``frac_reward_zero_std`` (each episode once, however many rows) and ``episodes``.
        """
        trainer: Any = self  # TRL is untyped
        gather, device = self.accelerator.gather, self.accelerator.device
        tokenizer = tokenizer_of(self)
        prompt_lengths = gather(torch.tensor([len(p) for p in rows["prompt_ids"]], device=device))
        lengths = gather(torch.tensor([sum(m) for m in rows["env_mask"]], device=device)).float()
        if mode == "train":
            trainer.state.num_input_tokens_seen += (prompt_lengths.sum() + lengths.sum()).item()
        ends = [*trainer.eos_token_ids, tokenizer.pad_token_id]
        clipped = gather(torch.tensor([c[-1] not in ends for c in rows["completion_ids"]], device=device))
        ended = lengths[~clipped] if bool((~clipped).any()) else torch.zeros(1, device=device)
        weighted = weighted_rewards(rewards_per_func, self.reward_weights)
        std = nan_std(weighted.view(-1, group), dim=1) if group > 1 else torch.zeros(len(weighted) // group)
        metrics = {
            "num_tokens": float(trainer.state.num_input_tokens_seen),
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": clipped.float().mean().item(),
            "completions/mean_terminated_length": ended.mean().item(),
            "completions/min_terminated_length": ended.min().item(),
            "completions/max_terminated_length": ended.max().item(),
        }
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
            metrics[f"rewards/{name}/std"] = nan_std(rewards_per_func[:, i]).item()
        metrics["reward"] = torch.nanmean(weighted).item()
        metrics["reward_std"] = nan_std(weighted).item()
        metrics["frac_reward_zero_std"] = torch.isclose(std, torch.zeros_like(std)).float().mean().item()
        metrics["episodes"] = float(len(rewards_per_func))
        log_metrics_once(self, mode, metrics, gauges=("num_tokens",))
        mine = rewards_per_func[local]  # this process's episodes
        row_rewards = torch.stack([mine[e] if e >= 0 else mine[0] * torch.nan for e in episode])
        texts = [str(t) for t in tokenizer.batch_decode(rows["completion_ids"], skip_special_tokens=True)]
        row_prompts = [inputs[e]["prompt"] if e >= 0 else inputs[0]["prompt"] for e in episode]
        conversational = isinstance(row_prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        spread_pending_extras(self, episode)  # log_extra values came per episode: logged beside each row
        every = gather(row_advantages.to(device)).tolist()  # every process's rows
        log_rows(self, mode, row_prompts, completions, gather(row_rewards), every)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        """TRL's micro-batch for the step; with deployed rows a ``MicroStep`` of token-bounded chunks.

        As TRL does, the batch is generated and scored every ``steps_per_generation`` x ``num_iterations``
        micro-steps; its real rows are dealt into ``steps_per_generation`` micro-steps (``plan_micro_steps``).
        """
        if not self._bounded_rows:
            return trl_prepare_inputs(self, generation_batch)
        trainer: Any = self  # TRL is untyped
        args = trainer.args
        plan = functools.partial(
            plan_micro_steps,
            budget=self._max_micro_batch_tokens,
            default_rows=args.per_device_train_batch_size,
            gather=self.accelerator.gather,
            packed=self._packing,
        )
        if not trainer.model.training:  # eval: one micro-step, no accumulation
            return plan(self._generate_and_score_completions(generation_batch), steps=1, accumulation=1)[0]
        steps, index = args.steps_per_generation, micro_step_index(self)
        if index % (steps * trainer.num_iterations) == 0 or self._row_steps is None:
            scored = self._generate_and_score_completions(generation_batch)
            self._row_steps = plan(scored, steps=steps, accumulation=args.gradient_accumulation_steps)
        return self._row_steps[index % steps]

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """TRL's loss; for a ``MicroStep``, chunk by chunk (``micro_step_loss``), earlier chunks back-propagated."""
        if not isinstance(inputs, MicroStep):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # type: ignore[no-any-return]
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        return micro_step_loss(self, model, inputs, lambda chunk: trl_compute_loss(self, model, chunk))

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **media: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's per-token logprobs of the rows; with ``packing``, of text rows, from prefix-shared packed forwards."""
        if self._packing and not compute_aux_loss and all(v is None for v in media.values()):
            packed = trainer_packed_logps(
                self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )
            if packed is not None:
                return packed[0], packed[1], None
        return super()._get_per_token_logps_and_entropies(  # type: ignore[no-any-return]
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **media
        )

    def _score_episodes(
        self, inputs: list[dict[str, Any]], prompts: list[Any], rollouts: list[Rollout], mode: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reward functions on whole episodes, then one advantage per episode (TRL's rule, groups of episodes)."""
        tokenizer = tokenizer_of(self)
        ids = [[t for row in r.rows for t in row.completion_ids] for r in rollouts]
        texts = [str(tokenizer.decode(i, skip_special_tokens=True)) for i in ids]
        conversational = isinstance(prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        scored = []
        for x, r in zip(inputs, rollouts, strict=True):
            scored.append(dict(x, env_reward=r.reward, env_ending=r.ending.value, env_turns=len(r.turns)))
        rewards_per_func = calculate_rewards(self, scored, prompts, completions, ids)
        group = self.num_generations if mode == "train" else self.num_generations_eval
        assert group is not None, "TRL sets num_generations_eval (it defaults to num_generations)"
        advantages, _ = episode_advantages(
            rewards_per_func,
            self.reward_weights,
            group,
            scale_rewards=self.scale_rewards,
            aggregation=self.multi_objective_aggregation,
        )
        return advantages, rewards_per_func

    def _turn_credit(
        self,
        credit: str | CreditEstimator,
        rollouts: list[Rollout],
        rewards_per_func: torch.Tensor,
        group: int,
        mode: str,
        local: slice,
    ) -> list[list[float] | None]:
        """Per-turn advantages of ``credit=`` for each of this process's episodes (``None`` for a failed one).

        ``rewards_per_func`` holds every process's episodes (TRL gathers them); so do the groups the estimator sees:
        the credit records are gathered too, and ``local`` picks this process's episodes out of them.
        """
        from accelerate.utils import gather_object  # type: ignore[import-untyped]

        estimator = credit_estimator(credit, self.scale_rewards)  # type: ignore[arg-type]  # "group"/"none": __init__
        assert estimator is not None, "called for a credit other than 'episode'"
        weights = self.reward_weights.to(rewards_per_func.device)
        totals = weighted_rewards(rewards_per_func, weights)
        columns = env_reward_columns(self.reward_funcs)
        _check_env_reward_scores(rewards_per_func[local], columns, rollouts, self.reward_func_names)
        env_weight = float(sum(weights[i].item() for i in columns))
        mine = [
            EpisodeCredit.from_rollout(r, total=t, env_weight=env_weight)
            for r, t in zip(rollouts, totals[local].tolist(), strict=True)
        ]
        credits = gather_object(mine) if self.accelerator.num_processes > 1 else mine
        groups = [credits[g : g + group] for g in range(0, len(credits), group)]
        advantages = [estimate(estimator, g) for g in groups]
        for key, value in credit_metrics(groups, advantages).items():
            metric_lists(self)[mode][key].append(value)
        return [a for g in advantages for a in g][local]
