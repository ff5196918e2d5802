"""What an agent program receives: its episode's task and a client bound to that episode through the gateway.

An agent program is unmodified code written against an OpenAI-compatible client. trl-env runs one program per
episode; every model call it makes through ``AgentRun``'s client is a turn of that episode (docs/agents.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # the `openai` package is the "agents" extra, `anthropic` the "agents-dialects" one
    from anthropic import Anthropic, AsyncAnthropic
    from openai import AsyncOpenAI, OpenAI

__all__ = ["AgentProgram", "AgentRun"]


@dataclass(frozen=True)
class AgentRun:
    """One episode as its agent program sees it: the task, and where (and as whom) to call the model."""

    task: Any
    """The episode's task: the dataset row's ``prompt`` value as the dataset holds it (a string or a list of chat
    messages) where the trainer passes whole rows (``EpisodeGRPOTrainer``, ``TrlEnvRolloutWorker`` given rows);
    else the seed."""
    seed: str
    """The episode's seed (the same rule as an ``Env``'s ``reset(seed)``)."""
    base_url: str
    """The gateway's OpenAI-compatible base URL, e.g. ``http://127.0.0.1:43121/v1``."""
    api_key: str
    """This episode's key: unguessable, valid only for this episode and only while it runs."""
    model: str
    """The model name to send (any name is answered by the policy being trained; this one is reported)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The dataset row's other columns (all but ``prompt``), read-only by convention; empty where the seed carries no
    row (``RowSeed``): GRPOTrainer's ``rollout_func`` is given the prompts only."""
    reported: list[float] = field(default_factory=list, repr=False, compare=False)
    """What ``report`` recorded, in order (read by the episode after each call)."""

    def report(self, reward: float) -> None:
        """Report the episode's reward so far: it becomes the reward of the turn the program last got a reply for.

        Per-turn rewards for the credit estimators (``credit="discounted"``, ...): an ``Env`` reports the same through
        its ``reward`` after each ``step``. What the program returns (if not ``None``) is the episode's final reward.
        """
        self.reported.append(float(reward))

    def openai(self, **kwargs: Any) -> OpenAI:
        """A real ``openai.OpenAI`` client bound to this episode (``kwargs`` go to its constructor).

        In the gateway's process its ``http_client`` (unless given) hands calls to the gateway in-process, without
        HTTP (``agents/local.py``): the same answers, a fraction of the CPU per call.
        """
        import openai  # loaded already (gateway.import_stack): no program thread imports the client stack

        from trl_env.agents.local import local_client

        kwargs.setdefault("http_client", local_client(self.base_url))
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai(self, **kwargs: Any) -> AsyncOpenAI:
        """A real ``openai.AsyncOpenAI`` client bound to this episode (``kwargs`` as for ``openai``, in-process too)."""
        import openai  # loaded already, as for openai()

        from trl_env.agents.local import local_async_client

        kwargs.setdefault("http_client", local_async_client(self.base_url))
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def anthropic(self, **kwargs: Any) -> Anthropic:
        """A real ``anthropic.Anthropic`` client bound to this episode (Messages, ``POST /v1/messages``).

        Needs the ``anthropic`` package (``pip install 'trl-env[agents-dialects]'``); in-process as ``openai``.
        """
        import anthropic

        from trl_env.agents.local import local_client

        kwargs.setdefault("http_client", local_client(self.base_url, http=_anthropic_http()))
        return anthropic.Anthropic(base_url=self.root_url, api_key=self.api_key, **kwargs)

    def async_anthropic(self, **kwargs: Any) -> AsyncAnthropic:
        """A real ``anthropic.AsyncAnthropic`` client bound to this episode (``kwargs`` as for ``anthropic``)."""
        import anthropic

        from trl_env.agents.local import local_async_client

        kwargs.setdefault("http_client", local_async_client(self.base_url, http=_anthropic_http()))
        return anthropic.AsyncAnthropic(base_url=self.root_url, api_key=self.api_key, **kwargs)

    @property
    def root_url(self) -> str:
        """The gateway's root, ``base_url`` without ``/v1``: what the Anthropic SDK takes (it adds ``/v1/messages``)."""
        return self.base_url.removesuffix("/v1")


def _anthropic_http() -> Any:
    """The ``httpx`` package the installed Anthropic SDK builds its clients on (``httpx2`` from 2.x, else ``httpx``)."""
    import importlib

    import anthropic

    # its public DefaultHttpxClient subclasses that package's Client (no private module of the SDK is read)
    return importlib.import_module(anthropic.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])


AgentProgram: TypeAlias = Callable[[AgentRun], "float | None"] | Callable[[AgentRun], Awaitable["float | None"]]
"""An agent: called once per episode with its ``AgentRun``; returns the episode's reward, or ``None`` to leave the
reward to the trainer's reward functions (or a verifier callback). Sync functions run on a worker thread of their own;
``async`` ones on an event loop of their own."""
