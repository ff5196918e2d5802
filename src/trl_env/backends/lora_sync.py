"""Policy sync through LoRA adapters (no NCCL, no CUDA): the trainer's PEFT adapter served by the vLLM servers."""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from typing import Any, Protocol

from trl_env.errors import ConfigError


@dataclass
class LoraSync:
    """What ``sync_lora`` keeps per generator."""

    step: int | None = None
    """The global step whose adapter is served; ``None`` before the first sync."""
    run: str | None = None
    """This generator's run token, in every adapter name: ``trl-env-{run}-step-{step}``."""
    path: str | None = None
    """The folder the served adapter was saved to (main process); deleted once the next one is served."""


class AdapterServers(Protocol):
    """What ``sync_lora`` needs of a generator (``VLLMServerGenerator``): adapter routes, the name requests carry."""

    model: str
    served_model: str
    lora: LoraSync

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter saved at ``path`` into every server under ``name``."""
        ...

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter ``name`` from every server."""
        ...


def sync_lora(generator: AdapterServers, trainer: Any, adapter_dir: str) -> None:
    """Serve the trainer's current PEFT adapter if the global step changed since the last sync.

    The main process saves the adapter to ``adapter_dir/NAME``, loads it into every server
    (``POST /v1/load_lora_adapter``; the server needs ``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), unloads the previous one and deletes the folder it saved that one to;
    then every request names the adapter as its ``model``. Every rank calls this (a barrier keeps them together).
    So ``adapter_dir`` holds one adapter of this generator's, the one served (after training, the last step's: kept,
    as is anything in ``adapter_dir`` this sync did not save, such as another run's adapters or the trainer's
    checkpoints).
    NAME is ``trl-env-{run}-step-{step}``, ``run`` drawn once per generator by the main process and shared with
    every rank, so a second run (or trainer) against the same long-lived server never meets its names.
    """
    step = int(trainer.state.global_step)
    if step == generator.lora.step:
        return
    accelerator = trainer.accelerator
    name = f"trl-env-{_run_token(generator, accelerator)}-step-{step}"
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        if not hasattr(model, "peft_config"):
            raise ConfigError(
                f"lora_sync needs a PEFT model, got {type(model).__name__}; pass peft_config=LoraConfig(...) "
                "to GRPOTrainer."
            )
        path = os.path.abspath(os.path.join(adapter_dir, name))
        model.save_pretrained(path)
        generator.load_lora_adapter(name, path)
        if generator.model != generator.served_model:
            generator.unload_lora_adapter(generator.model)
        if generator.lora.path is not None:  # the folder of the adapter just unloaded: this sync saved it
            shutil.rmtree(generator.lora.path, ignore_errors=True)
        generator.lora.path = path
    accelerator.wait_for_everyone()
    generator.model, generator.lora.step = name, step


def _run_token(generator: AdapterServers, accelerator: Any) -> str:
    """This generator's run token: drawn by the main process at the first sync, broadcast to every rank."""
    if generator.lora.run is None:
        token = [secrets.token_hex(4) if accelerator.is_main_process else ""]
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list  # type: ignore[import-untyped]

            broadcast_object_list(token, from_process=0)
        generator.lora.run = token[0]
    return generator.lora.run
