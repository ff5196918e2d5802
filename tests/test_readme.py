"""The README's quick start runs as written (its own tiny offline model; 2 steps in a temporary folder)."""

import re
from pathlib import Path

import trl


def test_readme_quick_start_trains(tmp_path, monkeypatch):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "class Countdown(Env)" in b)
    real_config = trl.GRPOConfig

    def short_config(**kwargs):  # the block's own settings, shortened to 2 steps in a temporary folder
        kwargs.update(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no", use_cpu=True)
        return real_config(**kwargs)

    monkeypatch.setattr(trl, "GRPOConfig", short_config)
    namespace: dict = {}  # nothing given: the block defines its model and tokenizer, as a reader pastes it
    exec(compile(block, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    assert any("env/turns_mean" in h for h in trainer.state.log_history)
