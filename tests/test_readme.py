"""The README's quick start runs as written (with a tiny local model and a short run)."""

import re
from pathlib import Path


def test_readme_quick_start_trains(tmp_path, model, tokenizer):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "class Countdown(Env)" in b)
    assert 'output_dir="out"' in block and "use_vllm=False)" in block
    code = block.replace('output_dir="out"', f'output_dir="{tmp_path}"').replace(
        "use_vllm=False)", "use_vllm=False, max_steps=2, report_to=[], use_cpu=True, save_strategy='no')"
    )
    namespace = {"model": model, "tokenizer": tokenizer}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    assert any("env/turns_mean" in h for h in trainer.state.log_history)
