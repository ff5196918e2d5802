"""Shared fixtures: the tiny local model and tokenizer (built in seconds, no hub), and toy envs."""

from __future__ import annotations

import pytest
from helpers import GuessEnv
from vllm_server import vllm_server, vllm_tiny_model  # noqa: F401  # session fixtures: one server per run

from trl_env.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def model(tokenizer):
    """A fresh model per test: training (and accelerate's autocast patch of forward under bf16) mutates it."""
    return build_tiny_model(tokenizer)


@pytest.fixture
def guess_env():
    GuessEnv.instances.clear()
    return GuessEnv
