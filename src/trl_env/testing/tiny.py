"""Tiny, offline tokenizer and model builders for tests and smoke runs.

Everything is built locally in well under a second (no hub access): a Qwen2-style byte-level BPE
tokenizer trained on a small generated corpus, with ChatML special tokens and chat template, and a
randomly initialised two-layer ``Qwen2ForCausalLM`` that can be saved and loaded with the Auto classes.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

__all__ = ["CHATML_TEMPLATE", "build_tiny_model", "build_tiny_tokenizer", "save_tiny_model"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]

#: Qwen2.5-style ChatML template without a default system message.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORDS = (
    "the a an I you we they it is are was were be been to of and or not in on at for with from by as "
    "guess guessed guessing number numbers answer answers higher lower correct incorrect wrong right try "
    "again think thinking step steps first second next then so my your game games between secret range "
    "low high value final please reply only one two three four five ten hundred more less than equal "
    "too close far left start end system user assistant hello yes no ok good great done because "
    "therefore which what when where who why how this that these those can will should must let me "
    "middle half binary search interval bound bounds upper previous feedback turn turns win lose"
).split()
_EXTRAS = ["é", "café", "naïve", "→", "←", "日本", "日本語", "ü", "ß", "—", "…", "✓", "€", "°", "π", "😀"]
_PUNCT = list(".,!?:;'\"()[]{}-+=*/#<>_%$@&|`~\\^")


def _corpus(n_lines: int = 600, seed: int = 0) -> list[str]:
    """Generate a deterministic English-like corpus with numbers, punctuation and some unicode.

    Args:
        n_lines: Number of generated lines (some lines contain newlines).
        seed: Seed of the private random generator (the global ``random`` state is untouched).

    Returns:
        The corpus as a list of strings.
    """
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 16)):
            r = rng.random()
            if r < 0.65:
                word = rng.choice(_WORDS)
                parts.append(word.capitalize() if rng.random() < 0.15 else word)
            elif r < 0.82:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 4))))
            elif r < 0.92:
                parts.append(rng.choice(_PUNCT) * rng.randint(1, 2))
            else:
                parts.append(rng.choice(_EXTRAS))
        line = " ".join(parts)
        if i % 5 == 0:
            line = f"My guess is {rng.randint(1, 100)}.\nHigher!\n  Lower? {line}\n\n"
        if i % 9 == 0:
            line = f"<think>\n{line}\n</think>\n\nThe answer is {rng.randint(0, 999)} → correct\t"
        lines.append(line)
    lines.append("0123456789 " + "".join(_PUNCT) + " " + " ".join(_EXTRAS))
    return lines


def build_tiny_tokenizer(*, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a small Qwen2-style byte-level BPE tokenizer with ChatML tokens and chat template.

    The pipeline is exactly the one ``Qwen2Tokenizer`` builds (NFC normaliser, Qwen2 split regex,
    ByteLevel without regex), so a saved copy loaded by ``AutoTokenizer`` encodes identically.
    Decoding returns the NFC form of the input: ``decode(encode(s)) == unicodedata.normalize("NFC", s)``.

    Args:
        vocab_size: Target size of the BPE vocabulary (the corpus may yield slightly fewer merges).

    Returns:
        A ``Qwen2Tokenizer`` with ``eos_token="<|im_end|>"``, ``pad_token="<|endoftext|>"``, no BOS or
        UNK, ``<|im_start|>`` as extra special token, ``<think>``/``</think>`` as added tokens, and a
        ChatML ``chat_template``. ``encode(text, add_special_tokens=False)`` adds nothing.
    """
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    bpe = json.loads(backend.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=bpe["vocab"],
        merges=[tuple(merge) for merge in bpe["merges"]],  # type: ignore[misc]  # pairs, as tokenizers stores them
        unk_token=None,  # type: ignore[arg-type]  # byte-level BPE: no unknown token
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tokenizer.add_tokens(THINK_TOKENS)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> Qwen2ForCausalLM:
    """Build a randomly initialised, tiny float32 ``Qwen2ForCausalLM`` matching ``tokenizer``.

    The weights depend only on ``seed``; the global torch RNG state is left untouched.

    Args:
        tokenizer: Tokenizer whose length and bos/eos/pad ids configure the model.
        seed: Seed for the weight initialisation.

    Returns:
        The model (2 layers, hidden size 128, 4 heads / 2 KV heads, tied embeddings) in eval mode.
    """
    special_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2Config(  # type: ignore[call-arg]  # head_dim is a Qwen2Config field the stubs lack
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        dtype="float32",
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # .to(dtype) is valid
    model.generation_config = GenerationConfig(**special_ids)
    return model.eval()


_SAVED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def save_tiny_model(path: str | os.PathLike[str]) -> str:
    """Build the tiny tokenizer and model (default seed) and save both to ``path``.

    Idempotent: returns at once if ``path`` already holds a saved tiny model. Files are written to a
    temporary sibling directory and then moved into place (one atomic rename when ``path`` is absent or empty).

    Args:
        path: Target directory; created if missing (an existing empty directory is fine).

    Returns:
        ``path`` as a string, loadable with ``AutoTokenizer`` and ``AutoModelForCausalLM``.
    """
    out = Path(path)
    if all((out / name).is_file() for name in _SAVED_FILES):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp)
    try:
        os.rename(tmp, out)  # atomic; also replaces an existing empty directory
    except OSError:  # `out` holds other files: move ours in one by one
        for file in tmp.iterdir():
            os.replace(file, out / file.name)
        tmp.rmdir()
    return str(out)
