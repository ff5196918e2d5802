"""``LoraSnapshots``: a frozen copy of the trained policy for a seat, served as a LoRA adapter by the same vLLM server.

A ``TrainerCallback`` saves the trained PEFT adapter every ``every`` optimizer steps, loads it into the server(s) under
a new name (``POST /v1/load_lora_adapter``) and unloads the one before; as a ``Generator`` it samples with the latest.
Play it with ``Seating(game, (POLICY, snapshots.seat))`` (docs/selfplay.md, "Seat policies").
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from transformers import TrainerCallback

from trl_env.backends.base import Generation, GenerationRequest, GeneratorBase
from trl_env.backends.vllm_server import VLLMServerGenerator
from trl_env.errors import ConfigError, ServerError
from trl_env.seats import Frozen

__all__ = ["LoraSnapshots"]


class LoraSnapshots(GeneratorBase, TrainerCallback):  # type: ignore[misc]  # TrainerCallback is untyped
    """A seat's frozen copy of the policy: the trained LoRA adapter as it was at the last multiple of ``every`` steps.

    At the start of training (step 0, or the step a run resumes from) and after every ``every``-th optimizer step, the
    main process saves the trainer's PEFT adapter to ``adapter_dir/{name}-{step}``, loads it into every server of
    ``generator`` under that name and unloads (and deletes) the snapshot before it; every process then samples the
    frozen seat's turns naming it. The snapshot is a copy of the adapter only, so it assumes the server's base weights
    stay the model's initial ones: the policy is served as an adapter too (``make_rollout_func(..., lora_sync=DIR)``,
    or not synced), never by TRL's full-weight sync (``use_vllm=True``).

    Args:
        generator: a ``VLLMServerGenerator`` of its own (not the policy's: this one's ``model`` is the snapshot's name)
            for the server(s) that serve the policy, started with ``--enable-lora --max-lora-rank R`` and
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; its sampling settings are the frozen seat's.
        every: optimizer steps between snapshots.
        adapter_dir: where the snapshots are saved (a path every server can read).
        name: the adapters' name prefix.

    Raises:
        ConfigError: for a generator that cannot address an adapter, or ``every < 1``.
    """

    continuous = True

    def __init__(
        self, generator: VLLMServerGenerator, *, every: int, adapter_dir: str | os.PathLike[str], name: str = "frozen"
    ) -> None:
        if not isinstance(generator, VLLMServerGenerator):
            raise ConfigError(
                f"LoraSnapshots(generator={type(generator).__name__}): a snapshot is a LoRA adapter the vLLM server "
                "loads by name, so give VLLMServerGenerator(base_url) for the server that serves the policy."
            )
        if not isinstance(every, int) or every < 1:
            raise ConfigError(f"LoraSnapshots(every={every!r}): give the optimizer steps between snapshots, >= 1.")
        self.generator, self.every, self.name = generator, every, name
        self.adapter_dir = os.path.abspath(adapter_dir)
        self.step: int | None = None
        """The optimizer step of the snapshot now served; ``None`` before the first."""

    @property
    def seat(self) -> Frozen:
        """The seat policy that plays with this snapshot: ``Seating(game, (POLICY, snapshots.seat))``."""
        return Frozen(self)

    @property
    def served(self) -> str | None:
        """The adapter name the frozen seat's requests carry; ``None`` before the first snapshot."""
        return None if self.step is None else self.generator.model

    @property
    def context_limit(self) -> int | None:
        """The server's ``max_model_len``."""
        return self.generator.context_limit

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Refuse to play before the first snapshot (the callback was not given to the trainer).

        Raises:
            ConfigError: naming the fix.
        """
        if self.step is None:
            raise ConfigError(
                "LoraSnapshots has no snapshot to play with yet: pass it to the trainer (callbacks=[snapshots]), "
                "which saves the first at the start of training, or call snapshots.refresh(peft_model, step=0)."
            )
        return contextlib.nullcontext()

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Sample with the snapshot served now."""
        return self.generator.submit(requests)

    # -- the TrainerCallback events -----------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Refuse TRL's full-weight sync, then snapshot the adapter training starts from."""
        if getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "server") == "server":
            raise ConfigError(
                "LoraSnapshots with use_vllm=True: TRL then loads the merged policy into the vLLM server, and a "
                "snapshot adapter on top of changed base weights is not the snapshot. Set use_vllm=False and serve "
                "the policy as an adapter: make_rollout_func(..., base_url=URL, lora_sync=DIR)."
            )
        self.refresh(model, step=int(state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Snapshot the adapter after every ``every``-th optimizer step."""
        if state.global_step % self.every == 0 and state.global_step != self.step:
            self.refresh(model, step=int(state.global_step))

    # -- one snapshot -------------------------------------------------------------------------------------------------

    def refresh(self, model: Any, *, step: int) -> None:
        """Serve ``model``'s adapter as it is now as the snapshot of ``step``; drop the one before.

        Every process calls it (a barrier keeps them together); the main one saves and loads.

        Raises:
            ConfigError: for a model without a LoRA adapter, or a server that cannot load one at run time.
        """
        from accelerate import PartialState  # type: ignore[import-untyped]  # accelerate ships no type hints

        _check_peft(model)
        name, old = f"{self.name}-{step}", self.served
        path = os.path.join(self.adapter_dir, name)
        state = PartialState()
        if state.is_main_process:
            model.save_pretrained(path)
            _load(self.generator, name, path)
            if old is not None and old != name:
                self.generator.unload_lora_adapter(old)
                shutil.rmtree(os.path.join(self.adapter_dir, old), ignore_errors=True)
        state.wait_for_everyone()
        self.generator.model, self.step = name, step


def _check_peft(model: Any) -> None:
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ConfigError("LoraSnapshots snapshots a LoRA adapter: `pip install peft`.") from e
    if not isinstance(model, PeftModel):
        raise ConfigError(
            f"LoraSnapshots needs a LoRA-trained policy, got {type(model).__name__}: pass "
            "peft_config=LoraConfig(...) to the trainer (a full-weight policy has no adapter to snapshot; play a "
            "fixed earlier model with Frozen(VLLMServerGenerator(url, model=...)) instead)."
        )


def _load(generator: VLLMServerGenerator, name: str, path: str) -> None:
    """Load the snapshot into every server; one that does not load it is a ``ConfigError`` naming the server flags.

    vLLM 0.32 answers 404 without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (no such route) and an error from its engine
    (a 5xx, retried first) without ``--enable-lora``.
    """
    try:
        generator.load_lora_adapter(name, path)
    except ServerError as e:
        raise ConfigError(
            f"{e.url} did not load the snapshot adapter {name!r} from {path}: {str(e)[:300]}. Serve the policy with "
            "--enable-lora --max-lora-rank R (R >= the LoraConfig's r) and the environment variable "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and give adapter_dir on a file system the server reads."
        ) from e
