"""Processors for model families, and a registry by name.

Each module holds one family; ``PROCESSORS`` maps a registry name to its factory.
"""

from __future__ import annotations

from collections.abc import Callable

from trl_env.errors import ConfigError
from trl_env.processor import Processor
from trl_env.processors.chatml import ChatMLProcessor

PROCESSORS: dict[str, Callable[..., Processor]] = {
    "chatml": ChatMLProcessor,
    "qwen2_5": ChatMLProcessor,
    "smollm2": ChatMLProcessor,
}


def get_processor(name: str, *, system_prompt: str | None = None) -> Processor:
    """Build the processor registered as ``name``.

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    try:
        factory = PROCESSORS[name]
    except KeyError:
        raise ConfigError(f"unknown processor {name!r}; known processors: {', '.join(sorted(PROCESSORS))}.") from None
    return factory(system_prompt=system_prompt)


__all__ = ["PROCESSORS", "ChatMLProcessor", "get_processor"]
