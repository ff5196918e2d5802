"""The whole exception hierarchy of trl_env.

Every error carries its context as keyword-only attributes and pickles (``__reduce__``),
so it survives worker threads and processes::

    TrlEnvError(Exception)                      root; catch-all for callers
      ConfigError(TrlEnvError, ValueError)      bad arguments or an unsupported install
      ProcessorError(TrlEnvError, ValueError)   a processor broke its contract
      EnvError(TrlEnvError, RuntimeError)       a user Env raised or returned the wrong thing
        EnvTimeoutError(EnvError)               a user Env call did not return in time
        AgentError(EnvError)                    an agent program raised, exited or never called the model
      ServerError(TrlEnvError, RuntimeError)    a generator backend failed
      SandboxUnavailableError(TrlEnvError, RuntimeError)  no kernel isolation for trl_env.sandbox here
      EpisodeFailure(TrlEnvError)               what ended one episode, classified where it happened
"""

from __future__ import annotations

from typing import Any


class TrlEnvError(Exception):
    """Root of every error raised by trl_env."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only context would be lost by the default reduce: rebuild it explicitly.
        context = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return (_rebuild, (type(self), self.args, context))


def _rebuild(cls: type[TrlEnvError], args: tuple[Any, ...], context: dict[str, Any]) -> TrlEnvError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(context)
    return error


class ConfigError(TrlEnvError, ValueError):
    """A bad argument, a bad combination of options, or an unsupported dependency version."""


class ProcessorError(TrlEnvError, ValueError):
    """A processor is missing a method or returned something the engine cannot use."""


class EnvError(TrlEnvError, RuntimeError):
    """A user Env raised, hung, or returned values of the wrong type.

    Attributes are ``None`` where unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        env_index: int | None = None,
        turn: int | None = None,
        method: str | None = None,
    ) -> None:
        super().__init__(message)
        self.env_index = env_index
        """Index of the episode in the batch."""
        self.turn = turn
        """Turn number (0 = reset)."""
        self.method = method
        """The Env method that failed: ``"reset"`` or ``"step"``."""


class EnvTimeoutError(EnvError):
    """A user Env call ran past ``env_timeout``; its episode was abandoned."""


class AgentError(EnvError):
    """An agent program (``trl_env.agents``) raised, exited, or returned before its first model call."""


class ServerError(TrlEnvError, RuntimeError):
    """A generation backend failed or answered with something unusable."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status_code: int | None = None,
        body: str = "",
        unreachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.url = url
        """The URL that was called, if any."""
        self.status_code = status_code
        """HTTP status, if any."""
        self.body = body[:2000]
        """Start of the response body."""
        self.unreachable = unreachable
        """No server could be reached or answered in time (refused, connect or read timeout), as opposed to a bad
        answer or a dropped connection; re-sending parts of the request would only wait again."""


class SandboxUnavailableError(TrlEnvError, RuntimeError):
    """The kernel isolation of ``trl_env.sandbox`` cannot be set up here (no ``bwrap``, or namespaces refused).

    The sandbox refuses to run rather than run code without its boundary; the message says what failed.
    """


ERROR_KINDS = (
    "env_exception", "env_bad_return", "env_timeout", "processor_error", "server_error", "prompt_error", "agent_error"
)  # fmt: skip
"""Why an episode failed, by where it happened: env code raised, env code returned something unusable, env
code ran past ``env_timeout``, a processor method raised or broke its contract, the generator failed, the
dataset row could not become a seed, an agent program raised, exited or never called the model."""


class EpisodeFailure(TrlEnvError):
    """A failure that ends one episode, with its kind decided at the call site (not by the exception's type).

    An env that raises a ``ProcessorError`` is still ``env_exception``; a processor that raises a
    ``KeyError`` is ``processor_error``. ``cause`` is the original exception (also ``__cause__``).
    """

    def __init__(self, kind: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r}; one of {ERROR_KINDS}")
        self.kind = kind
        """One of ``ERROR_KINDS``."""
        self.cause = cause
        """The exception that ended the episode."""


def error_kind(error: BaseException) -> str:
    """The failure class of an episode error, as counted in the logged metrics."""
    if isinstance(error, EpisodeFailure):
        return error.kind
    if isinstance(error, EnvTimeoutError):
        return "env_timeout"
    if isinstance(error, EnvError):
        return "env_bad_return"
    if isinstance(error, ProcessorError):
        return "processor_error"
    if isinstance(error, ServerError):
        return "server_error"
    return "env_exception"
