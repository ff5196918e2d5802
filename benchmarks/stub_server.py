"""A fast local stand-in for vLLM's OpenAI-compatible server: answers ``/v1/completions`` with fixed ids.

It speaks the subset ``VLLMServerGenerator`` uses (``GET /v1/models``, ``GET /health``,
``POST /v1/completions`` with token-id prompts, one or a batch), answers every prompt with ``max_tokens`` ids
after ``--delay-ms`` (a stand-in for generation time; the delay does not grow with load) in vLLM's shape: with
``return_token_ids`` it echoes each prompt's ids as vLLM does, and ``logprobs`` carries tokens, top logprobs and
offsets. It runs in its own process so that its CPU time is not counted as the client's. Faults for recovery
benchmarks: ``--poison-id`` fails every request holding a prompt with that id (HTTP 500 after the delay, as an
engine error would), ``--slow-over N --slow-ms M`` makes a request of more than N prompts take M ms more.

    python benchmarks/stub_server.py --port 8001 --delay-ms 50
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like vLLM (uvicorn)
    disable_nagle_algorithm = True  # else the body waits ~40 ms for the ACK of the headers (delayed ACK)
    delay_s = 0.0
    poison_id: int | None = None
    slow_over, slow_s = 1 << 30, 0.0

    def log_message(self, format: str, *args) -> None:  # noqa: A002  # silence per-request logs
        pass

    def _send(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its read timeout): nothing to answer
            pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "stub", "root": "stub", "max_model_len": 1 << 20}]})
        elif self.path.startswith("/health"):
            self._send(200, {})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.startswith("/v1/completions"):
            self._send(404, {"error": "not found"})
            return
        prompt = body.get("prompt") or [0]
        batch = prompt if isinstance(prompt[0], list) else [prompt]
        delay_s = self.delay_s + (self.slow_s if len(batch) > self.slow_over else 0.0)
        if delay_s:
            time.sleep(delay_s)
        if self.poison_id is not None and any(self.poison_id in p for p in batch):
            self._send(500, {"error": "stub engine error on a poisoned prompt"})
            return
        n = int(body.get("max_tokens", 16))
        ids = [(7 + 13 * i) % 900 + 10 for i in range(n)]  # ordinary ids of the tiny vocab, never a stop id
        echo = bool(body.get("return_token_ids"))  # vLLM then echoes each prompt's ids, and gives the sampled ids
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        self._send(200, {
            "choices": [{
                "index": k, "text": "", "finish_reason": "length",
                **({"token_ids": ids, "prompt_token_ids": p} if echo else {}),
                "logprobs": {
                    "token_logprobs": [-1.0] * n,
                    "tokens": [f"token_id:{i}" if as_ids else "x" for i in ids],
                    "top_logprobs": [{f"token_id:{i}" if as_ids else "x": -1.0} for i in ids],
                    "text_offset": list(range(n)),
                },
            } for k, p in enumerate(batch)],
        })  # fmt: skip


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096


def serve(
    port: int, delay_ms: float, poison_id: int | None = None, slow_over: int = 1 << 30, slow_ms: float = 0.0
) -> None:
    """Serve until killed."""
    _Handler.delay_s = delay_ms / 1000.0
    _Handler.poison_id, _Handler.slow_over, _Handler.slow_s = poison_id, slow_over, slow_ms / 1000.0
    with _Server(("127.0.0.1", port), _Handler) as server:
        server.serve_forever()


@contextlib.contextmanager
def stub_server(
    delay_ms: float = 0.0, *, poison_id: int | None = None, slow_over: int | None = None, slow_ms: float = 0.0
) -> Iterator[str]:
    """Start the stub in a subprocess; yield its base URL; stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    faults = [] if poison_id is None else ["--poison-id", str(poison_id)]
    faults += [] if slow_over is None else ["--slow-over", str(slow_over), "--slow-ms", str(slow_ms)]
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--port", str(port), "--delay-ms", str(delay_ms), *faults],
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the stub server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--poison-id", type=int, default=None, help="fail (500) every request with this id in a prompt")
    parser.add_argument("--slow-over", type=int, default=1 << 30, help="requests of more prompts take --slow-ms more")
    parser.add_argument("--slow-ms", type=float, default=0.0)
    a = parser.parse_args()
    serve(a.port, a.delay_ms, a.poison_id, a.slow_over, a.slow_ms)
