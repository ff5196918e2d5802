"""Generation against vLLM's OpenAI-compatible server (``vllm serve`` / ``trl vllm-serve``).

Turns are sampled with ``POST /v1/completions``, the token ids as ``prompt``; the sampled ids come back as
``logprobs.tokens`` (``"token_id:<id>"``, with ``return_tokens_as_token_ids``; ``return_token_ids`` would also
echo every prompt's ids, O(context) per turn) and are used verbatim with ``logprobs.token_logprobs``.
The turns of one ``submit`` call that share their sampling parameters (``max_tokens``, stop ids) go as
ONE request whose ``prompt`` is the list of their token-id prompts (vLLM answers one choice per prompt, in
order): the engine hands over every turn that became ready together, so the per-request HTTP/JSON cost is
paid once per batch, not once per episode. Requests run on a pool of ``max_in_flight`` threads over one
pooled HTTP session, so batches are in flight independently and the server batches them further
(continuous batching). Several base URLs are data-parallel servers: a batch is split between them, and
each part goes to the server with the fewest prompts in flight. A request that fails on a server (connection
error, timeout, 5xx) is retried on another one at once, and requests avoid that server for a few seconds.
"""

from __future__ import annotations

import functools
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import requests

from trl_env.backends.base import (
    Generation,
    GenerationRequest,
    GeneratorBase,
    Sampling,
    vllm_sampling,
)
from trl_env.backends.lora_sync import LoraSync, sync_lora
from trl_env.backends.vllm_http import (
    abandon,
    check_logprobs_mode,
    http_session,
    is_unreachable,
    parse_completion,
    parse_completions,
    served_model,
    settle_abandoned,
)
from trl_env.errors import ConfigError, ServerError

__all__ = ["VLLMServerGenerator", "parse_completion", "parse_completions"]

AVOID_FAILED_S = 5.0
"""Seconds during which requests prefer other servers to one that a request just failed on."""

T = TypeVar("T")
PostFn = Callable[..., Any]
"""``post(url, json=..., timeout=...) -> response`` with ``.status_code``, ``.text``, ``.json()`` (requests' shape)."""


class VLLMServerGenerator(GeneratorBase):
    """Samples each turn with its own HTTP request to one or more vLLM servers (``continuous = True``)."""

    continuous = True
    request_sampling = frozenset({"temperature", "top_p"})
    """Sent in the request's body over the generator's (an agent's own, ``agent_env_factory(sampling="agent")``)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        model: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        generation_kwargs: dict[str, Any] | None = None,
        max_in_flight: int = 256,
        max_batch: int = 256,
        timeout: float = 300.0,
        connect_timeout: float = 5.0,
        retries: int = 4,
        backoff: float = 0.5,
        extra_body: dict[str, Any] | None = None,
        post: PostFn | None = None,
        get: PostFn | None = None,
    ) -> None:
        """Connect to the server(s) and check they answer.

        Args:
            base_url: one URL (``http://127.0.0.1:8000``) or several data-parallel servers.
            model: the served model name; default: the first of ``GET /v1/models``.
            temperature: sampling settings, as in GRPOConfig.
            top_p: nucleus sampling; 1.0 disables it.
            top_k: 0 disables it.
            min_p: 0.0 disables it.
            repetition_penalty: 1.0 disables it.
            generation_kwargs: more vLLM sampling fields for every request (``GRPOConfig.generation_kwargs``);
                they override the ones above. Keys trl-env sets itself or vLLM does not sample with are refused.
            max_in_flight: most requests in flight at once (threads of the request pool).
            max_batch: most prompts in one request; 1 sends every turn on its own.
            timeout: seconds one request may take (connect and read) before it is retried.
            connect_timeout: seconds to wait for a server to answer at start.
            retries: attempts after the first, on connection errors, timeouts and 5xx answers.
            backoff: base of the exponential backoff between attempts, in seconds (with jitter).
            extra_body: more fields for every completion request (e.g. ``{"seed": 0}``).
            post: replaces ``requests.Session.post`` (a seam for unit tests).
            get: replaces ``requests.Session.get`` (a seam for unit tests).

        Raises:
            ConfigError: for bad settings, or when no server answers within ``connect_timeout``.
        """
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ConfigError("base_url is empty; pass a URL such as 'http://127.0.0.1:8000'.")
        if max_in_flight < 1 or max_batch < 1 or retries < 0 or timeout <= 0:
            raise ConfigError(
                f"max_in_flight={max_in_flight}, max_batch={max_batch}, retries={retries}, timeout={timeout}: need "
                "max_in_flight >= 1, max_batch >= 1, retries >= 0 and timeout > 0."
            )
        self.max_batch = max_batch
        self.urls = [u.rstrip("/") for u in urls]
        self.sampling = vllm_sampling(
            "vLLM server",
            generation_kwargs,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
        )
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.extra_body = dict(extra_body or {})
        session = http_session(len(self.urls), max_in_flight)
        self._session = session
        self._post = post or session.post
        self._get = get or session.get
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="trl-env-http")
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._failed_at = dict.fromkeys(self.urls, -math.inf)  # when a request last failed there (monotonic s)
        self.served_model, self._context_limit = served_model(self._get, self.urls[0], connect_timeout, model)
        self.model = self.served_model
        """The ``model`` field of requests: the served model, or a LoRA adapter's name once one is loaded."""
        self.lora = LoraSync()
        """``sync_lora``'s record: the step whose adapter is served, the run token of the adapter names."""
        check_logprobs_mode(self._get, self.urls[0], connect_timeout)

    @classmethod
    def from_trainer(
        cls, trainer: Any, *, base_url: str | Sequence[str] | None = None, **options: Any
    ) -> VLLMServerGenerator:
        """Use the server named in ``trainer.args`` (``vllm_server_base_url``, or host and port) and its sampling."""
        args = trainer.args
        if base_url is None:
            base_url = getattr(args, "vllm_server_base_url", None) or (
                f"http://{args.vllm_server_host}:{args.vllm_server_port}"
            )
        return cls(base_url, **(Sampling.from_args(args).as_kwargs() | options))

    @property
    def context_limit(self) -> int | None:
        """The server's ``max_model_len``, from ``/v1/models``."""
        return self._context_limit

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[Generation]]:
        """Send the requests as few batched requests; each future resolves when its batch's answer arrives."""
        futures: list[Future[Generation]] = [Future() for _ in requests]
        for batch in self._batches(requests):
            self._send([(requests[i], futures[i]) for i in batch])
        return futures

    def close(self) -> None:
        """Stop the request threads (pending requests are abandoned) and close the pooled connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._session.close()  # give the pooled sockets back now, not at garbage collection

    # -- batched requests -------------------------------------------------------------------------

    def _batches(self, requests: Sequence[GenerationRequest]) -> list[list[int]]:
        """Indices of ``requests`` grouped by sampling parameters, in parts for one request each.

        Requests share a group when their budget, stop ids and own sampling (``GenerationRequest.sampling``) match.
        A group is cut into parts of at most ``max_batch`` prompts, and into one part per server at least
        (so that data-parallel servers share it).
        """
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_tokens, r.stop_token_ids, *sorted(r.sampling.items())), []).append(i)
        batches = []
        for group in groups.values():
            size = min(self.max_batch, -(-len(group) // len(self.urls)))
            batches += [group[k : k + size] for k in range(0, len(group), size)]
        return batches

    def _send(
        self,
        members: list[tuple[GenerationRequest, Future[Generation]]],
        resend: list[int] | None = None,
        *,
        again: bool = True,
        split_timeout: bool = True,
    ) -> None:
        """Hand one batch to the request pool (``_complete``); once ``close`` shut the pool, fail it at once."""
        try:
            task = self._pool.submit(self._complete, members, resend, again=again, split_timeout=split_timeout)
        except RuntimeError:  # the pool was shut down while a failed batch was being split
            abandon(members, "generator closed")
            return
        task.add_done_callback(functools.partial(settle_abandoned, members))

    def _complete(
        self,
        members: list[tuple[GenerationRequest, Future[Generation]]],
        resend: list[int] | None = None,
        *,
        again: bool = True,
        split_timeout: bool = True,
    ) -> None:
        """Sample one batch and settle each member's future: a bad choice fails only its own episode.

        A batch that fails as a whole (after its retries: an HTTP error, a dropped connection, an answer without
        one usable choice per prompt) is split in two and both halves are sent again at once (one retry each), down
        to single prompts: a transient failure costs no episode, a prompt the server cannot serve fails only its
        own, and a healthy half is answered while the other is still narrowed down. A single prompt answered with
        nothing usable is sent once more (``again``). ``resend`` counts the re-sends left to the original batch
        (about four per halving), so a server that fails everything costs bounded time. One that cannot be reached
        (refused, timed out) fails the batch at once, since re-sending would only wait; but a read timeout on
        several prompts may be the batch's size, so such a batch is split once (``split_timeout``) before that.
        Returns once the members are settled or handed to their halves' tasks.
        """
        results = self._sample(members, retries=self.retries if resend is None else min(self.retries, 1))
        if isinstance(results, ServerError):
            resend = [4 * len(members).bit_length() + 1] if resend is None else resend
            unusable = results.status_code == 200  # answered, but with nothing usable (a 5xx was retried already)
            timed_out = split_timeout and len(members) > 1 and isinstance(results.__cause__, requests.ReadTimeout)
            parts = _halves(members) if len(members) > 1 else [members] if again and unusable else []
            if parts and (timed_out or not results.unreachable) and self._spend(resend, len(parts)):
                for part in parts:
                    again_ = len(part) > 1 or part is not members
                    self._send(part, resend, again=again_, split_timeout=split_timeout and not timed_out)
                return
            results = [results] * len(members)
        for (_, future), result in zip(members, results, strict=True):
            if isinstance(result, Generation):
                future.set_result(result)
            else:
                future.set_exception(result)

    def _spend(self, resend: list[int], n: int) -> bool:
        """Take ``n`` re-sends from the original batch's count (shared by its halves' tasks), if it has them."""
        with self._lock:
            if resend[0] < n:
                return False
            resend[0] -= n
            return True

    def _sample(
        self, members: list[tuple[GenerationRequest, Future[Generation]]], *, retries: int
    ) -> list[Generation | ServerError] | ServerError:
        """One request for the batch: a result per member, or the ``ServerError`` that failed it as a whole."""
        first, model = members[0][0], self.model  # the policy this batch is sampled with, read once
        prompts = [r.prompt_ids for r, _ in members]
        body = {
            "model": model,
            "prompt": prompts if len(prompts) > 1 else prompts[0],
            "max_tokens": first.max_tokens,
            "stop_token_ids": list(first.stop_token_ids),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,  # the ids, without `return_token_ids`' echo of every prompt's ids
            "skip_special_tokens": False,
            **self.sampling,
            **first.sampling,  # the batch's own (``_batches`` groups by it), e.g. an agent's temperature
            **self.extra_body,
        }
        try:
            url, data = self._post_json("/v1/completions", body, prompts=len(members), retries=retries)
        except ServerError as e:
            return e
        results = parse_completions(data, url=url, requests=[r for r, _ in members], policy=model)
        if all(isinstance(r, ServerError) for r in results):  # nothing usable: the answer failed as a whole
            error = results[0]
            assert isinstance(error, ServerError)
            error.status_code = 200
            return error
        return results

    def _acquire(self, prompts: int, tried: Sequence[str]) -> str:
        """The server for a request: one it has not failed on, then one no request failed on lately, then least loaded.

        "Lately": in the last ``AVOID_FAILED_S`` seconds. Load is counted in prompts in flight. With every server
        failed, any will do.
        """
        with self._lock:
            recent = time.monotonic() - AVOID_FAILED_S
            url = min(self.urls, key=lambda u: (u in tried, self._failed_at[u] > recent, self._in_flight[u]))
            self._in_flight[url] += prompts
        return url

    def _post_json(self, path: str, body: dict[str, Any], *, prompts: int, retries: int) -> tuple[str, Any]:
        url, response = self._post_ok(path, body, prompts=prompts, retries=retries)
        try:
            return url, response.json()
        except ValueError as e:
            raise ServerError(
                f"{url} answered with invalid JSON: {response.text[:300]!r}", url=url, status_code=200
            ) from e

    def _post_ok(
        self,
        path: str,
        body: dict[str, Any],
        *,
        url: str | None = None,
        prompts: int = 0,
        retries: int | None = None,
    ) -> tuple[str, Any]:
        """POST to ``url``, or to the server ``_acquire`` picks; return the server and its 200 answer.

        Connection errors, timeouts and 5xx answers are retried (``retries`` times, default ``self.retries``), on
        another server where there is one (a data-parallel server that dies costs its requests one failed attempt
        each, not their episodes), with exponential backoff once every server has failed this request. Other
        non-200 answers fail at once.
        """
        retries = self.retries if retries is None else retries
        tried: list[str] = []
        last: str = ""
        unreachable = False
        cause: Exception | None = None  # the last attempt's exception: ``_complete`` splits on a read timeout
        for attempt in range(retries + 1):
            if attempt and (url is not None or len(set(tried)) >= len(self.urls)):
                time.sleep(self.backoff * 2 ** (attempt - 1) * (0.5 + random.random()))  # noqa: S311  # jitter
            target = url or self._acquire(prompts, tried)
            try:
                response = self._post(f"{target}{path}", json=body, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                response, last, unreachable, cause = None, f"{type(e).__name__}: {e}", is_unreachable(e), e
            finally:
                with self._lock:
                    self._in_flight[target] -= prompts  # 0 where ``url`` was given: nothing was acquired
            if response is not None and response.status_code == 200:
                return target, response
            if response is not None and response.status_code < 500:
                raise ServerError(
                    f"{target}{path} answered HTTP {response.status_code}: {response.text[:500]}",
                    url=target,
                    status_code=response.status_code,
                    body=response.text,
                )
            if response is not None:
                last, unreachable, cause = f"HTTP {response.status_code}: {response.text[:300]}", False, None
            tried.append(target)
            with self._lock:
                self._failed_at[target] = time.monotonic()
        where = ", ".join(f"{u}{path}" for u in dict.fromkeys(tried))
        raise ServerError(
            f"{where} failed {retries + 1} times; last: {last}. Is the vLLM server running and reachable?",
            url=tried[-1],
            unreachable=unreachable,
        ) from cause

    # -- LoRA adapters served at run time (policy sync without NCCL or CUDA, frozen snapshots) ------

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter saved at ``path`` into every server under ``name`` (``POST /v1/load_lora_adapter``).

        A request samples with it once it names it as ``model`` (set ``self.model``). The servers need
        ``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, and must read ``path``.

        Raises:
            ServerError: a server refused it (HTTP 4xx, e.g. a name already loaded) or failed after the retries.
        """
        for url in self.urls:
            self._post_ok("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, url=url)

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter ``name`` from every server (``POST /v1/unload_lora_adapter``); requests naming it then fail.

        Raises:
            ServerError: a server refused it (e.g. no such adapter) or failed after the retries.
        """
        for url in self.urls:
            self._post_ok("/v1/unload_lora_adapter", {"lora_name": name}, url=url)

    def sync_lora(self, trainer: Any, adapter_dir: str) -> None:
        """Serve the trainer's PEFT adapter if the global step changed since the last sync (``backends.lora_sync``)."""
        sync_lora(self, trainer, adapter_dir)


def _halves(members: list[T]) -> list[list[T]]:
    half = (len(members) + 1) // 2
    return [members[:half], members[half:]]
