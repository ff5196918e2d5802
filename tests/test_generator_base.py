"""``as_generator``: a minimal generator object keeps what it has of the optional ``Generator`` capabilities."""

from __future__ import annotations

import contextlib

from helpers import ScriptedGenerator

from trl_env.backends.base import GenerationRequest, Generator, as_generator


class Limited:
    """``continuous``, ``submit`` and ``context_limit``, but no ``session()``: not a full ``Generator``."""

    continuous = True
    context_limit = 64

    def __init__(self) -> None:
        self.inner = ScriptedGenerator(range(5, 9), 2, p_stop=1.0)

    def submit(self, requests):
        return self.inner.submit(requests)


def test_a_minimal_generator_keeps_its_context_limit_and_gets_the_default_session():
    limited = Limited()
    assert not isinstance(limited, Generator)
    generator = as_generator(limited)
    assert generator.context_limit == 64  # before: None, so budgets ignored the model's context length
    with generator.session():
        [future] = generator.submit([GenerationRequest([5, 6], 4, (2,))])
    assert future.result().token_ids == [2] and limited.inner.requests[0].prompt_ids == [5, 6]
    assert isinstance(generator.session(), contextlib.nullcontext)
