"""``sync_lora`` against its seam (the generator's adapter routes): names, load/unload order, the folders it keeps.

A real PEFT adapter on the tiny model, saved by a real ``Accelerator``; the vLLM server's routes are recorded. The same
sync against a real vLLM server is in tests/test_vllm_integration.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trl_env.backends.lora_sync import LoraSync, sync_lora


class Servers:
    """The ``AdapterServers`` seam: records each route call and checks the folder it loads from is complete."""

    def __init__(self) -> None:
        self.model = self.served_model = "tiny"
        self.lora = LoraSync()
        self.calls: list[tuple[str, str]] = []

    def load_lora_adapter(self, name: str, path: str) -> None:
        from pathlib import Path

        assert (Path(path) / "adapter_config.json").is_file() and Path(path).name == name
        self.calls.append(("load", name))

    def unload_lora_adapter(self, name: str) -> None:
        self.calls.append(("unload", name))


@pytest.fixture
def trainer(model):
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    return SimpleNamespace(state=SimpleNamespace(global_step=0), accelerator=Accelerator(cpu=True), model=peft_model)


def test_each_new_step_loads_its_adapter_then_unloads_the_one_before(trainer, tmp_path):
    servers = Servers()
    names = []
    for step in (0, 0, 1, 2):  # a second call at the same step syncs nothing
        trainer.state.global_step = step
        sync_lora(servers, trainer, str(tmp_path))
        names.append(servers.model)
    run = servers.lora.run
    assert names == [f"trl-env-{run}-step-{s}" for s in (0, 0, 1, 2)]
    assert servers.calls == [
        ("load", names[0]),
        ("load", names[2]),
        ("unload", names[0]),
        ("load", names[3]),
        ("unload", names[2]),
    ]


def test_the_adapter_folders_it_saved_are_deleted_once_the_next_one_is_served(trainer, tmp_path):
    """Only the served adapter's folder stays (the last one at the end of training); nothing else in the folder goes."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    servers = Servers()
    for step in (0, 1, 2):
        trainer.state.global_step = step
        sync_lora(servers, trainer, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mine", servers.model])
    assert (tmp_path / servers.model / "adapter_config.json").is_file()
    assert (tmp_path / "mine" / "notes.txt").read_text() == "a user's file"
