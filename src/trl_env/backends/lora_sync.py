"""Policy sync through LoRA adapters (no NCCL, no CUDA): the trainer's PEFT adapter served by the vLLM servers."""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING, Any

from trl_env.errors import ConfigError

if TYPE_CHECKING:
    from trl_env.backends.vllm_server import VLLMServerGenerator


def sync_lora(generator: VLLMServerGenerator, trainer: Any, adapter_dir: str) -> None:
    """Serve the trainer's current PEFT adapter if the global step changed since the last sync.

    The main process saves the adapter to ``adapter_dir/NAME``, loads it into every server
    (``POST /v1/load_lora_adapter``; the server needs ``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and unloads the previous one; then every request
    names the adapter as its ``model``. Every rank calls this (a barrier keeps them together).
    NAME is ``trl-env-{run}-step-{step}``, ``run`` drawn once per generator by the main process and shared with
    every rank, so a second run (or trainer) against the same long-lived server never meets its names.
    """
    step = int(trainer.state.global_step)
    if step == generator._lora_step:
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
    accelerator.wait_for_everyone()
    generator.model, generator._lora_step = name, step


def _run_token(generator: VLLMServerGenerator, accelerator: Any) -> str:
    """This generator's run token: drawn by the main process at the first sync, broadcast to every rank."""
    if generator._lora_run is None:
        token = [secrets.token_hex(4) if accelerator.is_main_process else ""]
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list  # type: ignore[import-untyped]

            broadcast_object_list(token, from_process=0)
        generator._lora_run = token[0]
    return generator._lora_run
