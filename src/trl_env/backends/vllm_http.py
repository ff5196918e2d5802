"""The HTTP side of the vLLM server client: its pooled session, start-up checks, which failures mean no answer, answers.

``parse_completions`` reads a batched ``/v1/completions`` answer (one result per prompt), ``parse_completion`` one
choice; anything missing or inconsistent is a ``ServerError``, not data. ``VLLMServerGenerator`` (vllm_server.py)
sends the requests.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import requests
import urllib3

from trl_env.backends.base import FinishReason, Generation, GenerationRequest
from trl_env.errors import ConfigError, ServerError

logger = logging.getLogger("trl_env.backends.vllm_server")  # the client's warnings, under the client's name


def http_session(n_servers: int, max_in_flight: int) -> requests.Session:
    """A pooled session with a connection per request in flight."""
    session = requests.Session()
    # requests' default re-reads proxy settings from os.environ on every request (~20% of client CPU per
    # turn, benchmarks/README.md); a vLLM server is addressed directly, with no auth from .netrc.
    session.trust_env = False
    adapter = requests.adapters.HTTPAdapter(pool_connections=n_servers, pool_maxsize=max_in_flight)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def is_unreachable(error: requests.RequestException) -> bool:
    """The server was not reached or did not answer in time, as opposed to a connection dropped mid-answer.

    Not reached: connection refused, unresolvable, connect timeout; not in time: a read timeout.
    """
    if isinstance(error, requests.Timeout):
        return True
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


def served_model(get: Callable[..., Any], url: str, timeout: float, model: str | None) -> tuple[str, int | None]:
    """The served model's name (``model``, or the first ``/v1/models`` lists) and its ``max_model_len``.

    Raises:
        ConfigError: no server answers at ``url``, it does not serve ``model``, or it lists no model.
    """
    try:
        response = get(f"{url}/v1/models", timeout=timeout)
        cards = response.json()["data"]
        card = next((c for c in cards if c["id"] == model), None) if model else cards[0]
        if card is None:
            raise ConfigError(f"{url} does not serve model {model!r}; it serves {[c['id'] for c in cards]}.")
        return str(card["id"]), card.get("max_model_len")
    except (requests.ConnectionError, requests.Timeout) as e:
        raise ConfigError(
            f"no vLLM server answers at {url} ({type(e).__name__}). Start one, e.g. `trl vllm-serve --model "
            f"MODEL` or `vllm serve MODEL --logprobs-mode processed_logprobs`, or fix the URL (GRPOConfig "
            "vllm_server_base_url, or base_url=)."
        ) from e
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ConfigError(f"{url}/v1/models did not list a model; is this a vLLM server?") from e


def logprobs_mode(get: Callable[..., Any], url: str, timeout: float) -> Any:
    """The ``logprobs_mode`` the server reports in ``/server_info``; ``None`` where it reports none."""
    try:
        response = get(f"{url}/server_info", timeout=timeout)
        return _find_key(response.json(), "logprobs_mode") if response.status_code == 200 else None
    except Exception:  # noqa: BLE001  # /server_info is optional (dev mode only)
        return None


def check_logprobs_mode(get: Callable[..., Any], url: str, timeout: float) -> None:
    """Warn when the server at ``url`` reports a ``logprobs_mode`` other than processed logprobs."""
    mode = logprobs_mode(get, url, timeout)
    if mode is not None and "processed" not in str(mode):
        logger.warning(
            "The vLLM server at %s reports logprobs_mode=%s: its logprobs ignore temperature and other "
            "sampling processors, which biases TRL's importance-sampling correction. Restart it with "
            "`--logprobs-mode processed_logprobs` (what `trl vllm-serve` sets).",
            url,
            mode,
        )


def parse_completions(
    data: Any, *, url: str, requests: Sequence[GenerationRequest], policy: str | None = None
) -> list[Generation | ServerError]:
    """Read the answer to a batched request: one result per prompt, in order; a bad choice is that prompt's error.

    ``policy``: the model name the request gave, recorded on each ``Generation``.
    """
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != len(requests):
        error = ServerError(
            f"{url} returned a completion without usable choices: {len(choices) if isinstance(choices, list) else 0} "
            f"for {len(requests)} prompts. Body: {str(data)[:300]}",
            url=url,
            body=str(data),
        )
        return [error] * len(requests)
    if any(isinstance(c, dict) and "index" in c for c in choices):
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
    results: list[Generation | ServerError] = []
    for choice, request in zip(choices, requests, strict=True):
        try:
            results.append(
                parse_completion({"choices": [choice]}, url=url, max_tokens=request.max_tokens, policy=policy)
            )
        except ServerError as e:
            results.append(e)
    return results


_TOKEN_ID = "token_id:"


def _token_id(token: str) -> int:
    """The id in a ``"token_id:<id>"`` logprob token."""
    if not token.startswith(_TOKEN_ID):
        raise ValueError(f"logprob token {token[:40]!r} is not 'token_id:<id>'")
    return int(token[len(_TOKEN_ID) :])


def parse_completion(data: Any, *, url: str, max_tokens: int, policy: str | None = None) -> Generation:
    """Read one ``/v1/completions`` answer; anything missing or inconsistent is a ``ServerError``, not data.

    ``policy``: the model name the request gave, recorded on the ``Generation``.
    """
    try:
        choice = data["choices"][0]
        logprobs_ = choice["logprobs"]
        if logprobs_.get("tokens") is not None:  # return_tokens_as_token_ids: each token is "token_id:<id>"
            token_ids = [_token_id(t) for t in logprobs_["tokens"]]
        else:  # a server that sends only `token_ids` (vLLM does with return_token_ids)
            token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = [math.nan if x is None else float(x) for x in logprobs_["token_logprobs"]]
        finish = FinishReason(choice["finish_reason"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ServerError(
            f"{url} returned a completion without usable token_ids / logprobs.tokens / logprobs.token_logprobs / "
            f"finish_reason ({type(e).__name__}: {e}); trl_env needs vLLM >= 0.10, which answers "
            f"`return_tokens_as_token_ids` with 'token_id:<id>' tokens. Body: {str(data)[:300]}",
            url=url,
            body=str(data),
        ) from e
    if not 0 < len(token_ids) == len(logprobs) <= max_tokens:
        raise ServerError(
            f"{url} returned {len(token_ids)} token ids and {len(logprobs)} logprobs for max_tokens={max_tokens}.",
            url=url,
            body=str(data),
        )
    return Generation(token_ids, logprobs, finish, policy)


def _find_key(tree: Any, key: str) -> Any:
    """First value of ``key`` anywhere in a nested JSON object."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            found = _find_key(item, key)
            if found is not None:
                return found
    return None


def settle_abandoned(members: list[tuple[GenerationRequest, Future[Generation]]], task: Future[None]) -> None:
    """Fail the members of a batch whose task was cancelled (``close``) or died before settling them.

    A task that returned has settled its members or handed them to its halves' tasks, which settle them.
    """
    if task.cancelled():
        abandon(members, "generator closed")
    elif task.exception() is not None:
        abandon(members, str(task.exception()))


def abandon(members: list[tuple[GenerationRequest, Future[Generation]]], why: str) -> None:
    """Fail each member of a batch not yet settled with a ``ServerError`` saying why."""
    for _, future in members:
        if not future.done():
            future.set_exception(ServerError(f"the request was abandoned ({why})"))
