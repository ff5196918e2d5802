"""trl-env as the rollout worker of TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``, TRL 1.16).

``AsyncGRPOTrainer(rollout_worker=TrlEnvRolloutWorker(...))`` trains while trl-env keeps generating: episodes
run continuously against a vLLM server, each finished group of ``num_generations`` episodes becomes
``RolloutSample`` rows on ``rollout_buffer``, and the trainer pulls them as it needs them. The trainer syncs
its weights to the server after each optimizer step (with a PEFT model and a server started with
``--enable-lora``: as a LoRA adapter named ``trl-policy-v{N}``, over HTTP) and tells the worker with
``update_model_version(N)``; from then on every NEW turn names that adapter, while turns already sent finish
on the adapter they named. A sample can therefore mix policies across its turns; each token's old logprob
comes from the policy that sampled it, which is what the per-token importance ratio needs.

The protocol (``RolloutWorkerProtocol``, TRL's ``async_grpo_trainer.py``): ``rollout_buffer`` and
``metrics_queue`` (``queue.Queue``), ``start()``, ``stop()``, ``update_model_version(v)`` and
``check_health(stale_after_s)``. Everything here runs in the trainer's process, on threads: no pickling,
so env factories may be closures. CPU-heavy env code belongs in worker processes
(``env_executor="process"``).

The rows:

* ``input_ids`` = ``prompt_ids + completion_ids`` (the exact ids the sampler saw and produced: one episode
  is always one row, with no re-tokenisation), ``completion_mask`` = 0 over the prompt then trl-env's
  ``env_mask`` (1 = sampled by the model), ``old_log_probs`` = 0 over the prompt then the sampler's
  processed logprobs (0 at env tokens); numpy int64 / int64 / float32.
* ``advantage``: the one group rule (``trl_env.train.advantages``, TRL ``GRPOTrainer``'s), per group over its
  *scored* episodes: ``(r - mean) / (std + 1e-4)`` with the Bessel-corrected std (``scale_rewards="none"``:
  ``r - mean``). A failed episode (``Ending.ERROR``) is
  left out of the statistics and never pushed; it is counted (``rollout/failed_frac``). An episode that did
  not fail but has no reward (the model never acted) is "unscored": like TRL, it gets advantage 0
  (``unscored="zero"``), or it is dropped (``unscored="drop"``); having no trained token, it is never pushed.
* ``credit=`` other than ``"episode"`` (docs/credit.md): one sample per model turn of each row instead, the row's
  prefix up to the end of that turn's model tokens, trained on that turn only, with that turn's advantage from the
  credit estimator (docs/async.md, "Turn-level credit").
* ``model_version``: the OLDEST policy version among the episode's turns, read from ``Turn.policy``
  (``<lora_name>-v<N>``); without LoRA names, the version that was live when the group's first turn was
  submitted. That makes the trainer's ``staleness = version - model_version <= max_staleness`` check
  conservative.
* never pushed: a row with no trained token (the trainer crashes on a rank whose row has no loss term), a
  row with a NaN or infinite logprob at a trained position (the loss would be NaN), an episode trl-env
  reports as a placeholder.

Staleness: the trainer drops any sample older than ``max_staleness`` versions when it reads it; the worker
drops such samples itself before pushing them, and evicts them from a full buffer, since the trainer would
drop them anyway (``rollout/dropped_stale_total``). The buffer is bounded (``buffer_size``): a group
thread that finds it full waits (``rollout/backpressure_s``). What keeps the worker from running ahead of
the trainer is the admission rule: a group starts only if the trainer, reading about as many rows per
version as it did between its last two syncs, will read its rows before they go stale (see
``TrlEnvRolloutWorker``).

``patch_for_cpu()`` applies the two monkeypatches TRL 1.16's ``AsyncGRPOTrainer`` needs to run on CPU
at all; see its docstring and ``docs/async.md``.
"""

from trl_env.train.async_grpo.cpu import patch_for_cpu
from trl_env.train.async_grpo.samples import GroupRecord, ScaleRewards, Unscored, group_advantages
from trl_env.train.async_grpo.worker import LORA_NAME, TrlEnvRolloutWorker, WorkerOptions

__all__ = [
    "LORA_NAME",
    "GroupRecord",
    "ScaleRewards",
    "TrlEnvRolloutWorker",
    "Unscored",
    "WorkerOptions",
    "group_advantages",
    "patch_for_cpu",
]
