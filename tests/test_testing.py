"""Tests for ``trl_env.testing``: the tiny offline tokenizer and model builders."""

from __future__ import annotations

import os
import time
import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from trl_env.testing import (
    CHATML_TEMPLATE,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINKS = ["<think>", "</think>"]

VARIED_STRINGS = [
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    "\t \n \r\n",
    "Hello world",
    " leading and trailing spaces  ",
    "My guess is 42.",
    "higher lower correct number answer guess",
    "0123456789",
    "3.14159 -273 1e10 1,000,000 007",
    "x = 12345678901234567890",
    "I'm sure it's 50; we'll see, they've said, you'd know.",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& |||",
    "café naïve résumé é",
    "e\u0301 (decomposed) vs \u00e9",
    "→ ← ↑ ↓ ✓ — … € ° π",
    "日本 日本語 中文 한국어 Ελληνικά русский עברית العربية",
    "emoji 😀🎉👍🏽 👨‍👩‍👧",
    "\x00\x01\x7f control chars \u200b zero-width",
    "<|im_start|>user\nWhat is my number?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think: 50 is too high.\n</think>\n\nMy guess is 25.<|im_end|>",
    "<|endoftext|><|endoftext|>",
    "<|im_end|> not <|im_end| or |im_end|> or <im_end>",
    "tabs\tand\tmixed \t\n   indentation\n    code():\n        return 1",
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def loaded_tok(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


# ----------------------------------------------------------------------------- tokenizer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_roundtrip_arbitrary_text(tok: PreTrainedTokenizerFast, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert all(isinstance(i, int) and 0 <= i < len(tok) for i in ids)
    # Byte-level: nothing is lost, only the canonical (NFC) normalisation that Qwen2 applies.
    assert tok.decode(ids) == _nfc(text)
    nfc = _nfc(text)
    assert tok.decode(tok.encode(nfc, add_special_tokens=False)) == nfc


# Text pieces that cannot fuse with a neighbouring "<...>" token under NFC (e.g. ">" + U+0338).
_PIECES = st.text().map(_nfc).filter(lambda s: not s or unicodedata.combining(s[0]) == 0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(_PIECES, st.sampled_from(SPECIALS + THINKS + ["\n", " ", "42", "é"]))))
def test_roundtrip_text_mixed_with_special_tokens(tok: PreTrainedTokenizerFast, parts: list[str]) -> None:
    text = "".join(parts)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("text", VARIED_STRINGS)
def test_roundtrip_varied_strings(tok: PreTrainedTokenizerFast, text: str) -> None:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == _nfc(text)


def test_special_and_think_tokens_are_single_ids(tok: PreTrainedTokenizerFast) -> None:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS + THINKS}
    assert len(set(ids.values())) == len(ids)
    for token, token_id in ids.items():
        assert tok.encode(token, add_special_tokens=False) == [token_id]
        in_context = tok.encode(f"hello{token} world 12", add_special_tokens=False)
        assert in_context.count(token_id) == 1
        assert tok.decode(in_context) == f"hello{token} world 12"
    assert set(SPECIALS) <= set(tok.all_special_tokens)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == ids["<|im_end|>"]
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == ids["<|endoftext|>"]
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.decode(tok.encode("a<|im_end|>b<think>c"), skip_special_tokens=True) == "ab<think>c"


def test_encode_adds_no_special_tokens(tok: PreTrainedTokenizerFast) -> None:
    assert tok.encode("", add_special_tokens=False) == []
    assert tok.encode("", add_special_tokens=True) == []
    for text in VARIED_STRINGS:
        plain = tok.encode(text, add_special_tokens=False)
        assert tok.encode(text, add_special_tokens=True) == plain
        assert tok(text)["input_ids"] == plain


def test_vocab_is_byte_level_and_sized(tok: PreTrainedTokenizerFast) -> None:
    assert len(tok) == 1024 + len(THINKS)
    assert build_tiny_tokenizer(vocab_size=512).vocab_size <= 512
    # Digits are split one by one (Qwen2 split regex), so numbers tokenise compositionally.
    assert tok.tokenize("2025") == ["2", "0", "2", "5"]
    assert tok.backend_tokenizer.normalizer is not None  # NFC, exactly like Qwen2Tokenizer


def test_tokenizer_build_is_deterministic() -> None:
    start = time.perf_counter()
    first = build_tiny_tokenizer()
    elapsed = time.perf_counter() - start
    print(f"build_tiny_tokenizer took {elapsed:.3f}s")
    second = build_tiny_tokenizer()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert first.get_vocab() == second.get_vocab()


def test_chat_template_renders_chatml(tok: PreTrainedTokenizerFast) -> None:
    assert tok.chat_template == CHATML_TEMPLATE
    messages = [
        {"role": "system", "content": "You guess numbers."},
        {"role": "user", "content": "Guess a number between 1 and 100."},
        {"role": "assistant", "content": "<think>\nMiddle.\n</think>\n\n50"},
        {"role": "user", "content": "Higher."},
    ]
    expected = (
        "<|im_start|>system\nYou guess numbers.<|im_end|>\n"
        "<|im_start|>user\nGuess a number between 1 and 100.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nMiddle.\n</think>\n\n50<|im_end|>\n"
        "<|im_start|>user\nHigher.<|im_end|>\n"
    )
    assert tok.apply_chat_template(messages, tokenize=False) == expected
    with_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert with_prompt == expected + "<|im_start|>assistant\n"
    # No default system message is injected.
    user_only = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert user_only == "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == tok.encode(with_prompt, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


# ----------------------------------------------------------------------------- model


def test_model_config(tok: PreTrainedTokenizerFast) -> None:
    model = build_tiny_model(tok)
    assert isinstance(model, Qwen2ForCausalLM)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (128, 2, 256)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert cfg.vocab_size == len(tok) and cfg.max_position_embeddings == 2048
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for conf in (cfg, model.generation_config):
        assert conf.eos_token_id == tok.eos_token_id
        assert conf.pad_token_id == tok.pad_token_id
        assert conf.bos_token_id is None


def test_model_forward_and_determinism(tok: PreTrainedTokenizerFast) -> None:
    rng_before = torch.get_rng_state()
    model_a = build_tiny_model(tok, seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before)  # global RNG untouched
    model_b = build_tiny_model(tok, seed=0)
    model_c = build_tiny_model(tok, seed=1)
    ids = torch.tensor([tok.encode("My guess is 50.<|im_end|>", add_special_tokens=False)])
    with torch.no_grad():
        logits_a, logits_b, logits_c = (m(input_ids=ids).logits for m in (model_a, model_b, model_c))
    assert logits_a.shape == (1, ids.shape[1], len(tok))
    assert logits_a.dtype == torch.float32 and torch.isfinite(logits_a).all()
    assert torch.equal(logits_a, logits_b)
    assert not torch.equal(logits_a, logits_c)
    out = model_a.generate(ids, max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(ids))
    assert out.shape[0] == 1 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 4


# ----------------------------------------------------------------------------- save / load


def test_save_load_parity(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    path = save_tiny_model(tmp_path)  # an existing, empty directory
    assert path == str(tmp_path)
    loaded_tok = AutoTokenizer.from_pretrained(path)
    loaded_model = AutoModelForCausalLM.from_pretrained(path)
    # transformers picks Qwen2Tokenizer for model_type="qwen2" and rebuilds its pipeline: it must match.
    for attr in ("normalizer", "pre_tokenizer", "decoder"):
        assert str(getattr(loaded_tok.backend_tokenizer, attr)) == str(getattr(tok.backend_tokenizer, attr))
    assert loaded_tok.get_vocab() == tok.get_vocab()
    assert loaded_tok.all_special_tokens == tok.all_special_tokens
    assert (loaded_tok.eos_token, loaded_tok.pad_token, loaded_tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert loaded_tok.chat_template == tok.chat_template
    for text in VARIED_STRINGS:
        assert loaded_tok.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
        assert loaded_tok(text)["input_ids"] == tok(text)["input_ids"]

    model = build_tiny_model(tok)
    assert loaded_model.dtype == torch.float32
    assert loaded_model.generation_config.eos_token_id == tok.eos_token_id
    assert loaded_model.generation_config.pad_token_id == tok.pad_token_id
    ids = torch.tensor([tok.encode(" ".join(VARIED_STRINGS), add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded_model(input_ids=ids).logits)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_save_load_encoding_parity_arbitrary_text(
    tok: PreTrainedTokenizerFast, loaded_tok: PreTrainedTokenizerFast, text: str
) -> None:
    assert loaded_tok.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_save_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "nested" / "tiny"
    path = save_tiny_model(target)
    assert path == str(target)
    mtimes = {f.name: f.stat().st_mtime_ns for f in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(mtimes)
    assert save_tiny_model(os.fspath(target)) == path
    assert {f.name: f.stat().st_mtime_ns for f in target.iterdir()} == mtimes
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]  # no temporary directory left behind
