"""Fault injection for the reliability suite: an env that misbehaves by seed, and an HTTP proxy that breaks requests.

The proxy listens on 127.0.0.1 only, forwards to a real vLLM server, and answers a chosen share of
requests with a 5xx, a dropped connection, or a malformed 200; it counts what it injected.
"""

from __future__ import annotations

import http.server
import json
import math
import random
import threading
from collections import Counter
from collections.abc import Callable

import requests

ENV_FAULTS = {
    "env_exception": 0.10,
    "env_hang": 0.05,
    "env_bad_return": 0.02,
    "env_nan_reward": 0.01,
    "reset_exception": 0.02,
    "close_hang": 0.02,
    "close_exception": 0.02,
}
"""Share of episodes per fault, drawn from the seed. Seed "0" (the first row) always fails at reset."""
FACTORY_FAULT_EVERY = {"factory_exception": 53, "factory_none": 71}
"""Every N-th ``FaultyFactory`` call fails this way (the factory cannot see the seed)."""
HANG = threading.Event()  # set at the end of a test to let abandoned threads finish


def env_fault_of(seed: str) -> tuple[str | None, int]:
    """The fault an episode's env will inject, and at which step (1-3); deterministic in the seed."""
    if seed == "0":
        return "reset_exception", 0
    rng = random.Random(f"env-{seed}")
    r, at, edge = rng.random(), rng.randint(1, 3), 0.0
    for kind, share in ENV_FAULTS.items():
        edge += share
        if r < edge:
            return kind, at
    return None, at


class FaultyEnv:
    """Three turns of echo; injects the fault ``env_fault_of(seed)`` at its step."""

    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        self.fault, self.at = env_fault_of(seed)
        if self.fault == "reset_exception":
            raise RuntimeError("injected reset crash")
        return self, f"episode {seed}: say anything"

    def close(self):
        if self.fault == "close_hang":
            HANG.wait()
        if self.fault == "close_exception":
            raise RuntimeError("injected close crash")

    def step(self, action):
        self.turn += 1
        if self.turn == self.at:
            if self.fault == "env_exception":
                raise RuntimeError("injected env crash")
            if self.fault == "env_hang":
                HANG.wait()
            if self.fault == "env_bad_return":
                return "not a tuple"
            if self.fault == "env_nan_reward":
                self.reward = math.nan
                return self, "nan"
        self.reward += 0.5 if action else 0.0
        self.alive = self.turn < 3
        return self, f"turn {self.turn} ok"


class FaultyFactory:
    """Builds ``FaultyEnv``s; every N-th call raises or returns None (``FACTORY_FAULT_EVERY``), counted."""

    def __init__(self) -> None:
        self.calls, self.injected, self._lock = 0, Counter(), threading.Lock()

    def __call__(self):
        with self._lock:
            self.calls += 1
            n = self.calls
        for kind, every in FACTORY_FAULT_EVERY.items():
            if n % every == 0:
                with self._lock:
                    self.injected[kind] += 1
                if kind == "factory_exception":
                    raise RuntimeError("injected factory crash")
                return None
        return FaultyEnv()


class FaultProxy:
    """``with FaultProxy(upstream, shares) as proxy:`` then point the client at ``proxy.url``.

    ``poison(prompt_ids)``: a prompt the "engine" fails on: every completion request carrying it gets a 500.
    ``script``: faults for the first completion requests, in order (a transient outage), before ``shares`` apply.
    """

    def __init__(
        self,
        upstream: str,
        shares: dict[str, float],
        *,
        seed: int = 0,
        poison: Callable[[list[int]], bool] | None = None,
        script: list[str] = (),
    ) -> None:
        self.upstream, self.shares, self.poison, self.script = upstream.rstrip("/"), shares, poison, list(script)
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.injected: Counter[str] = Counter()
        self.forwarded, self.dead = 0, False
        self.largest_batch = 1  # most prompts in one completion request seen
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                upstream = requests.get(proxy.upstream + self.path, timeout=30)
                self._send(upstream.status_code, upstream.content)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fault = proxy.pick() if self.path == "/v1/completions" else None
                if self.path == "/v1/completions":
                    prompt = json.loads(body)["prompt"]
                    prompts = prompt if isinstance(prompt[0], list) else [prompt]
                    with proxy.lock:
                        proxy.largest_batch = max(proxy.largest_batch, len(prompts))
                    if proxy.poison is not None and any(map(proxy.poison, prompts)):
                        fault = "poisoned"
                if proxy.dead:  # gone: even kept-alive connections get no answer
                    fault = "dropped_connection"
                if fault == "http_5xx":
                    self._send(503, b'{"error": "injected overload"}')
                elif fault == "poisoned":
                    self._send(500, b'{"error": "injected engine error on a poisoned prompt"}')
                elif fault == "dropped_connection":
                    self.close_connection = True
                    self.connection.shutdown(2)
                elif fault == "malformed_output":
                    self._send(
                        200, json.dumps({"choices": [{"text": "no ids here", "finish_reason": "stop"}]}).encode()
                    )
                else:
                    upstream = requests.post(
                        proxy.upstream + self.path, data=body, timeout=120, headers={"Content-Type": "application/json"}
                    )
                    with proxy.lock:
                        proxy.forwarded += 1
                    self._send(upstream.status_code, upstream.content)

            def _send(self, status, payload):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def pick(self) -> str | None:
        with self.lock:
            if self.script:
                self.injected[self.script[0]] += 1
                return self.script.pop(0)
            r, edge = self.rng.random(), 0.0
            for kind, share in self.shares.items():
                edge += share
                if r < edge:
                    self.injected[kind] += 1
                    return kind
        return None

    def __enter__(self) -> FaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def kill(self) -> None:
        """The server goes away: no new connections, and open ones are dropped."""
        self.dead = True
        self.server.shutdown()
        self.server.server_close()

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
