"""The action field of an OpenEnv server: read once per server from its ``GET /schema``, a failure remembered.

``OpenEnvAdapter`` sends the model's text as the action's only string field; ``action_field`` names it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import requests

from trl_env.errors import ConfigError, EnvTimeoutError

SCHEMA_RETRY_S = 10.0
"""Seconds a failed ``GET /schema`` is remembered: until then, episodes needing its action field fail at once."""


@dataclass
class _Schema:
    """What one server's ``GET /schema`` gave: the action's text field, or the last failure and when."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held across the request: one request per server at a time; the others wait for its answer."""
    name: str | None = None
    failure: tuple[type[Exception], str, float] | None = None
    """(type, message, ``time.monotonic()``) of the last failed read."""


_schemas: dict[str, _Schema] = {}  # base URL -> its schema; guarded by _schemas_lock, never held across a request
_schemas_lock = threading.Lock()


def action_field(base_url: str, timeout_s: float, headers: Mapping[str, str] | None, *, stale: str = "") -> str:
    """The name of the action's only string field, from the server's ``GET /schema``.

    Read once per server (``stale``: a field the server rejected, read again); look-ups of different servers never
    wait on each other, and a failure is remembered for ``SCHEMA_RETRY_S``, so a server that never answers costs
    its episodes one ``timeout_s``, not one each.

    Raises:
        EnvTimeoutError: no answer within ``timeout_s``.
        ConnectionError: the request failed.
        ConfigError: the action is not one text field.
    """
    with _schemas_lock:
        schema = _schemas.setdefault(base_url, _Schema())
    if not schema.lock.acquire(timeout=timeout_s):
        raise EnvTimeoutError(
            f"OpenEnv server {base_url} did not answer GET /schema within connect_timeout_s={timeout_s} s "
            "(another episode's request to it is still waiting); raise it if the server is just slow.",
            method="reset",
        )
    try:
        if stale and schema.name == stale:
            schema.name = None
        if schema.name is not None:
            return schema.name
        if schema.failure is not None and time.monotonic() - schema.failure[2] < SCHEMA_RETRY_S:
            kind, message, failed_at = schema.failure
            raise kind(  # a fresh exception: one shared by threads would share (and keep) its traceback
                f"{message} (failed {time.monotonic() - failed_at:.1f} s ago; GET /schema is tried again "
                f"SCHEMA_RETRY_S={SCHEMA_RETRY_S} s after a failure)"
            )
        try:
            schema.name = _read_action_field(base_url, timeout_s, headers)
        except (EnvTimeoutError, ConnectionError, ConfigError) as e:
            schema.failure = (type(e), str(e), time.monotonic())
            raise
        schema.failure = None
        return schema.name
    finally:
        schema.lock.release()


def _read_action_field(base_url: str, timeout_s: float, headers: Mapping[str, str] | None) -> str:
    http_url = re.sub(r"^ws(s?)://", r"http\1://", base_url)
    try:
        response = requests.get(f"{http_url}/schema", timeout=timeout_s, headers=dict(headers or {}))
        response.raise_for_status()
        schema = response.json().get("action", {})
    except requests.Timeout as e:
        raise EnvTimeoutError(
            f"OpenEnv server {base_url} did not answer GET /schema within connect_timeout_s={timeout_s} s; "
            "raise it if the server is just slow.",
            method="reset",
        ) from e
    except (requests.RequestException, ValueError, AttributeError) as e:
        raise ConnectionError(f"OpenEnv server {base_url}: GET /schema failed ({type(e).__name__}: {e}).") from e
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    texts = [k for k, v in properties.items() if v.get("type") == "string"]
    others = [k for k in schema.get("required", []) if k not in texts]
    if len(texts) != 1 or others:
        raise ConfigError(
            f"the action of the OpenEnv env at {base_url} has fields {sorted(properties)}, not one text field; "
            "pass action= to build it from the model's text, e.g. `action=lambda text: {'code': text}`."
        )
    return str(texts[0])
