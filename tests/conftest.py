"""Shared fixtures: the tiny local model and tokenizer (built in seconds, no hub), and toy envs; the test tiers.

Tiers (markers registered in pyproject.toml): ``vllm`` is set here on every test that uses the real vLLM server
(its fixtures all rest on ``vllm_tiny_model``); ``slow`` is set by the module (``pytestmark``) or the test; ``gpu``
tests skip without CUDA. The fast tier is ``python -m pytest -m "not slow and not vllm"``.
"""

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


def pytest_collection_modifyitems(config, items):
    """Mark every test that needs the real vLLM server ``vllm``; skip ``gpu`` tests without a CUDA device."""
    cuda = None
    for item in items:
        if "vllm_tiny_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("gpu") is not None:
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
