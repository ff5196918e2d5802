"""The same 4-turn task as an ``Env`` and as an openai-SDK agent through the gateway, side by side (issue 33 item 2).

One real vLLM CPU server (the tiny model; ``--url`` reuses a running one). Both paths run ``batch_rollout`` with
``history="deployed"``, the same ``VLLMServerGenerator``, the same budgets and ``env_workers``:

* ``env``: ``_common.BenchEnv`` (4 turns, plain observations) written as an ``Env``;
* ``env-sdk``: ``SdkEnv``, the env path plus, in each step, the openai SDK's own work of the agent's call (a ``create``
  answered at once by an ``httpx.MockTransport``, no gateway): what a gateway costing nothing would reach, so
  ``agent`` / ``env-sdk`` is the gateway's share of the ratio and ``env-sdk`` / ``env`` the SDK's;
* ``agent``: the same task as an agent program on the real ``openai`` SDK, one ``chat.completions.create`` per turn,
  through the process's gateway (``agent_env_factory``), a fresh ``openai.OpenAI`` per episode from ``run.openai()``
  (as an unmodified program gets it): in the gateway's process its calls are served in-process (agents/local.py);
* ``agent-http``: the same program on ``openai.OpenAI(base_url=run.base_url, api_key=run.api_key)``, a fresh client
  per episode over loopback HTTP (what ``run.openai()`` gave before agents/local.py, and what a program in another
  process gets): the SDK's httpx client with its own SSL context and connection pool, uvicorn and Starlette;
* ``agent-proc``: the ``agent`` program with each episode's env and program in a worker process of its own
  (``isolated(agent_env_factory(...), pool_size=...)``, as ``env_executor="process"`` builds, which keeps
  ``env_workers`` idle workers; here ``--proc-pool``, default 64, so that after the warm-up every episode gets a
  reused worker, as every training step after the first would; run only at N <= ``--proc-pool``: each idle worker
  holds ~30 MB of its own): the SDK's work leaves the trainer's interpreter (its GIL); the program calls its
  worker's own gateway in-process, and the engine hands each call and reply across the process boundary (pickled
  ``ChatRequest`` / ``Reply``).

Every turn samples exactly ``--tokens`` tokens (``ignore_eos``; cut turns go on: ``parse_truncated_turns=True``), so
both paths ask the server for the same work. After a warm-up, repetitions run in rounds: each round runs every
(path, N) once, in shuffled order, and ``/ env per round`` is a path's wall over the env's of the same round (runs at
most a minute apart: the ratio the box's slow drifts in speed leave alone).

Printed per N: wall time of each path, the ratio agent/env (target <= 1.15x), the server's completion requests
(counted by a ``post`` wrapper around the generator's HTTP calls) and prompts per request, so requests per turn
(requests / (N x turns): 1/N would be one batched request per turn level), and the gateway's added latency per call:
for each call, the agent's client-side time around ``create`` minus the time the engine held that turn (from
``AgentEnv.reset``/``step`` returning the call to the engine, to the engine's next ``step`` handing it the sampled
reply: rendering, queueing, generation, parsing). What is left is: the openai SDK building and sending the request,
the gateway reading and validating it and handing it to the waiting env worker, and, on the way back, the gateway
building the response, the SDK reading and parsing it (loopback HTTP both ways).

    python benchmarks/bench_agents.py --episodes 64 256 --repeat 3

``--pin``: the server on core 0 and the benchmark on the other cores (``_agents_machine.pin_cores``), a stand-in for a
GPU server whose generation does not take the trainer's CPU; without it, on a 2-core box, every path's CPU competes
with the server's (the ``machine busy CPU s`` column).

``--scripted``: no server; an instant generator answers every turn with the same ``--tokens`` ids at once, so the
wall and the process's CPU are the paths' own (rendering, parsing, the engine; for the agents, the SDK, HTTP and the
gateway too). The CPU per call, agent minus env, is what the agent path adds on the trainer's process:

    python benchmarks/bench_agents.py --scripted --episodes 64 256 --repeat 3

The other dialects (opt-in paths, ``--paths env agent agent-responses agent-messages``): ``agent-responses`` is the
``agent`` program on the Responses API (``run.openai().responses.create``, the answer's output items sent back as
input items) and ``agent-messages`` on Anthropic Messages (``run.anthropic().messages.create``, the answer's content
blocks sent back), both in-process as ``agent``: their trainer CPU per call beside the chat route's (issue 45);
``agent-responses-proc`` runs the Responses program in worker processes, as ``agent-proc`` does the chat one:

    python benchmarks/bench_agents.py --scripted --paths env agent agent-responses agent-messages --episodes 64
    python benchmarks/bench_agents.py --scripted --paths env agent agent-proc agent-responses agent-responses-proc --episodes 64
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import _common as C
import requests
from _agents_machine import engine_steps, machine_cpu, pin_cores
from _agents_report import percentile, report

from trl_env import Budgets, Ending, VLLMServerGenerator, batch_rollout
from trl_env.agents import AgentEnv
from trl_env.agents.env import AgentEnvFactory
from trl_env.agents.run import AgentRun
from trl_env.rollout.isolation import isolated

PATHS = ["env", "env-sdk", "agent", "agent-http", "agent-proc"]
DIALECT_PATHS = ["agent-responses", "agent-messages", "agent-responses-proc"]
"""Opt-in (``--paths``): the ``agent`` program in the gateway's other dialects."""
_client_times: dict[str, list[tuple[float, float]]] = {}
_client_lock = threading.Lock()
_errors: list[str] = []


def agent_program(run: AgentRun, http: bool = False, turns: int = 4, dialect: str = "chat") -> float:
    """``BenchEnv``'s task (``turns`` turns, the same observations) on the openai SDK; records each call's client
    time (in this process's ``_client_times``: ``TimedAgentEnv`` puts them in its info). ``dialect``: ``"chat"``,
    or the same task on ``"responses"`` / ``"messages"`` (``dialect_program``)."""
    if dialect != "chat":
        return dialect_program(run, turns, dialect)
    if http:
        import openai

        client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0, timeout=600)
    else:
        client = run.openai(max_retries=0, timeout=600)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Episode {run.seed}. Say anything; this game lasts {turns} turns."}
    ]
    times = []
    for turn in range(1, turns + 1):
        t0 = time.perf_counter()
        try:
            answer = client.chat.completions.create(model=run.model, messages=messages).choices[0].message  # type: ignore[arg-type]
        except Exception as e:  # recorded for the error message (the SDK's own hides its cause)
            with _client_lock:
                _errors.append(
                    f"call {turn}: {type(e).__name__}: {e}; cause {type(e.__cause__).__name__}: {e.__cause__}"
                )
            raise
        times.append((t0, time.perf_counter()))
        messages.append(answer.model_dump(exclude_none=True))
        if turn < turns:
            messages.append({"role": "user", "content": f"Turn {turn} noted. Next."})
    with _client_lock:
        _client_times[run.seed] = times
    client.close()
    return float(turns)


def dialect_program(run: AgentRun, turns: int, dialect: str) -> float:
    """``agent_program``'s task on the Responses API (``run.openai()``) or Anthropic Messages (``run.anthropic()``),
    each answer sent back as its SDK returns it (output items; content blocks)."""
    first = f"Episode {run.seed}. Say anything; this game lasts {turns} turns."
    items: list[Any] = [{"role": "user", "content": first}]
    make = run.openai if dialect == "responses" else run.anthropic
    client: Any = make(max_retries=0, timeout=600)
    times = []
    for turn in range(1, turns + 1):
        t0 = time.perf_counter()
        if dialect == "responses":
            output = client.responses.create(model=run.model, input=items).output
        else:
            output = client.messages.create(model=run.model, max_tokens=4096, messages=items).content
        times.append((t0, time.perf_counter()))
        dumped = [part.model_dump(exclude_none=True) for part in output]
        items += dumped if dialect == "responses" else [{"role": "assistant", "content": dumped}]
        if turn < turns:
            items.append({"role": "user", "content": f"Turn {turn} noted. Next."})
    with _client_lock:
        _client_times[run.seed] = times
    client.close()
    return float(turns)


class SdkEnv(C.BenchEnv):
    """``BenchEnv`` doing in each step the openai SDK's work of one agent call, with no gateway (the ``env-sdk`` path).

    A ``create`` with the episode's messages so far, answered at once by an ``httpx.MockTransport`` with the sampled
    text, then a ``model_dump`` of the reply, on one ``openai.OpenAI`` per episode built as ``run.openai()`` builds it:
    the agent program's own CPU (as ``agent_program`` spends it) on an Env, so a gateway that cost nothing would give
    this path's wall time. ``agent`` / ``env-sdk`` is the gateway's share; ``env-sdk`` / ``env`` the SDK's.
    """

    def reset(self, seed: str) -> tuple[C.BenchEnv, str]:
        import httpx
        import openai

        env, first = super().reset(seed)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
        self.answer = b""
        http = httpx.Client(transport=httpx.MockTransport(self._answer), trust_env=False)
        self.client = openai.OpenAI(base_url="http://sdk.invalid/v1", api_key="k", max_retries=0, timeout=600,
                                    http_client=http)  # fmt: skip
        return env, first

    def step(self, action: str) -> tuple[C.BenchEnv, str]:
        message = {"role": "assistant", "content": action}
        self.answer = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "message": message, "finish_reason": "length", "logprobs": None}]}).encode()  # fmt: skip
        reply = self.client.chat.completions.create(model="m", messages=self.messages).choices[0].message  # type: ignore[arg-type]
        self.messages.append(reply.model_dump(exclude_none=True))
        env, observation = super().step(action)
        if self.alive:
            self.messages.append({"role": "user", "content": observation})
        else:
            self.client.close()
        return env, observation

    def _answer(self, request: Any) -> Any:
        import httpx

        return httpx.Response(200, content=self.answer, headers={"content-type": "application/json"})


class TimedAgentEnv(AgentEnv):
    """``AgentEnv`` recording, per call, when the engine got it and when the engine answered it (``info["spans"]``),
    and, once its program has returned, the program's client times (``info["calls"]``: they cross a process boundary
    with the info; ``perf_counter`` is the system's monotonic clock, the same in every process)."""

    def reset(self, seed):  # type: ignore[no-untyped-def]
        out = super().reset(seed)
        self.info["seed"], self.info["spans"] = seed, [[time.perf_counter(), None]]
        self.info["cpu"], self.info["pid"] = time.process_time(), os.getpid()
        return out

    def step(self, action):  # type: ignore[no-untyped-def]
        self.info["spans"][-1][1] = time.perf_counter()
        out = super().step(action)
        if self.alive:
            self.info["spans"].append([time.perf_counter(), None])
        else:
            self._keep_calls()
        return out

    def truncate(self, reason: str) -> None:
        super().truncate(reason)
        self._keep_calls()

    def _keep_calls(self) -> None:
        with _client_lock:
            calls = _client_times.pop(self.info["seed"], None)
        if calls is not None:
            self.info["calls"] = calls
            self.info["cpu"] = time.process_time() - self.info["cpu"]  # a worker process's: its one episode's


class TimedFactory(AgentEnvFactory):
    """``agent_env_factory``'s factory building ``TimedAgentEnv``s; it pickles as itself (agent-proc's workers)."""

    def __call__(self) -> AgentEnv:
        return TimedAgentEnv(self.program, gateway=self.gateway, verify=self.verify, settle_s=self.settle_s,
                             sampling=self.sampling)  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        return (TimedFactory, (self.program, self.gateway, self.verify, self.settle_s, self.sampling))


class InstantGenerator:
    """A generator that answers every request with the same ``tokens`` ids, cut by the budget (``--scripted``).

    At once (a wave generator: the engine hands it every waiting episode), or with ``latency_s`` > 0 after that
    long, as a continuous one (the engine coalesces as for a server: ``--scripted-latency-ms``).
    ``requests``/``prompts`` count its ``submit`` calls and their requests, as ``CountingPost`` counts the server's.
    """

    context_limit = None

    def __init__(self, tokenizer: Any, tokens: int, latency_s: float = 0.0) -> None:
        text = " ".join(["word"] * tokens * 2)
        self.ids = list(tokenizer.encode(text, add_special_tokens=False))[:tokens]
        self.requests = self.prompts = 0
        self.lock = threading.Lock()
        self.latency_s, self.continuous = latency_s, latency_s > 0

    def submit(self, requests: Sequence[Any]) -> list[Any]:
        from trl_env.backends.base import FinishReason, Generation, resolved

        with self.lock:
            self.requests += 1
            self.prompts += len(requests)
        out = []
        for r in requests:
            ids = self.ids[: r.max_tokens]
            out.append(resolved(Generation(ids, [-0.5] * len(ids), FinishReason.LENGTH)))
        if not self.continuous:
            return out
        later = [Future() for _ in out]  # type: ignore[var-annotated]
        timer = threading.Timer(self.latency_s, lambda: [f.set_result(o.result()) for f, o in zip(later, out)])
        timer.daemon = True
        timer.start()
        return later

    def take(self) -> tuple[int, int]:
        with self.lock:
            out, self.requests, self.prompts = (self.requests, self.prompts), 0, 0
            return out


class CountingPost:
    """The generator's ``post``: a pooled ``requests`` session, counting completion requests and their prompts."""

    def __init__(self, pool: int) -> None:
        self.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=pool)
        self.session.mount("http://", adapter)
        self.requests = self.prompts = 0
        self.lock = threading.Lock()

    def __call__(self, url: str, json: dict, timeout: float) -> Any:
        if url.endswith("/v1/completions"):
            with self.lock:
                self.requests += 1
                self.prompts += len(json["prompt"]) if isinstance(json["prompt"][0], list) else 1
        return self.session.post(url, json=json, timeout=timeout)

    def take(self) -> tuple[int, int]:
        with self.lock:
            out, self.requests, self.prompts = (self.requests, self.prompts), 0, 0
            return out


def check(rollouts: list, n: int, turns: int, path: str) -> None:
    bad = [r for r in rollouts if r.ending not in (Ending.ENV_DONE, Ending.MAX_TURNS) or len(r.turns) != turns]
    if bad or len(rollouts) != n:
        raise RuntimeError(f"{path} N={n}: {len(bad)} bad episodes of {len(rollouts)}, e.g. {bad[0].ending} "
                           f"{bad[0].error[:500]}; client errors: {_errors[:5]}")  # fmt: skip


def added_latency(rollouts: list) -> tuple[list[float], list[float], list[float]]:
    """Per call: (client time - engine time, client time, engine time), matched by episode and call order."""
    added, client, engine = [], [], []
    for r in rollouts:
        info = r.info["env"]
        calls = info["calls"]
        spans = info["spans"]
        if len(calls) != len(spans) or any(s[1] is None for s in spans):
            raise RuntimeError(f"episode {info['seed']}: {len(calls)} client calls, spans {spans}")
        for (t0, t1), (got, answered) in zip(calls, spans, strict=True):
            client.append(t1 - t0)
            engine.append(answered - got)
            added.append((t1 - t0) - (answered - got))
    return added, client, engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=None, help="concurrent episodes (default 64 256)")
    parser.add_argument("--repeat", type=int, default=None, help="timed repetitions per (path, N) (default 3)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="sampled tokens per turn (exactly)")
    parser.add_argument("--env-workers", type=int, default=16, help="batch_rollout's env_workers (its default: 16)")
    parser.add_argument("--proc-pool", type=int, default=64,
                        help="agent-proc: idle worker processes kept between runs (~30 MB each); run at N <= it")  # fmt: skip
    parser.add_argument("--coalesce-s", default="auto", help="batch_rollout's coalesce_s: 'auto' or seconds")
    parser.add_argument("--paths", nargs="+", choices=PATHS + DIALECT_PATHS, default=list(PATHS),
                        help="which paths (env first; agent-responses and agent-messages only when named)")  # fmt: skip
    parser.add_argument("--scripted", action="store_true", help="no server: an instant generator (CPU per call)")
    parser.add_argument("--scripted-latency-ms", type=float, default=0.0,
                        help="--scripted: answer each request after this long, as a continuous generator")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="4 episodes x 2 turns, one repetition: a smoke test")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results/agents)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    parser.add_argument("--url", "--base-url", dest="base_url", default=None, help="reuse this running vLLM server")
    parser.add_argument("--pin", action="store_true",
                        help="the server on core 0, this process (and its workers) on the others: see pin_cores")  # fmt: skip
    parser.add_argument("--server-omp", choices=sorted(C.SERVER_OMP), default="1",
                        help="OpenMP threads of a fresh server (see _common.SERVER_OMP)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.turns, args.tokens = min(args.turns, 2), min(args.tokens, 8)
    sizes = args.episodes or ([4] if args.quick else [64, 256])
    reps = args.repeat or (1 if args.quick else 3)
    out = Path(args.out) if args.out else C.RESULTS_DIR / "agents"
    out.mkdir(parents=True, exist_ok=True)
    notes = C.machine_notes()
    if args.paths[0] != "env":
        parser.error("--paths: the env path comes first (the ratios are to it)")
    PATHS[:] = args.paths
    coalesce = args.coalesce_s if args.coalesce_s == "auto" else float(args.coalesce_s)

    from transformers import AutoTokenizer

    from trl_env.render.processors import from_tokenizer
    from trl_env.testing.templates import trl_templates

    serving = contextlib.nullcontext(("", C.tiny_model_dir())) if args.scripted else C.vllm_server(
        args.base_url, extra_args=["--no-enable-prefix-caching"], omp=args.server_omp)  # fmt: skip
    with serving as (base_url, model_dir):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = trl_templates()["qwen2_5"]  # ChatML, as tests/test_agents_vllm.py
        processor = from_tokenizer(tokenizer)
        gen: Any
        if args.scripted:
            server: dict[str, Any] = {"scripted": "an instant generator, no server"}
            gen = counter = InstantGenerator(tokenizer, args.tokens, args.scripted_latency_ms / 1e3)
        else:
            server = C.server_config(base_url)
            if args.pin:
                server["pinned"] = pin_cores(base_url)
            counter = CountingPost(64)
            extra = {"ignore_eos": True, "stop_token_ids": []}  # every turn exactly --tokens long
            gen = VLLMServerGenerator(base_url, model=model_dir, temperature=1.0, extra_body=extra, post=counter)
        budgets = Budgets(max_turns=args.turns, max_new_tokens=args.tokens, max_completion_tokens=4096)
        program = functools.partial(agent_program, turns=args.turns)
        factories = {"env": C.EnvFactory(args.turns), "env-sdk": functools.partial(SdkEnv, args.turns), "agent": TimedFactory(program),
                     "agent-http": TimedFactory(functools.partial(program, http=True)),
                     "agent-responses": TimedFactory(functools.partial(program, dialect="responses")),
                     "agent-messages": TimedFactory(functools.partial(program, dialect="messages"))}  # fmt: skip
        if "agent-proc" in PATHS:  # as make_rollout_func(..., env_executor="process") wraps it, with a larger pool
            factories["agent-proc"] = isolated(TimedFactory(program), pool_size=args.proc_pool)
        if "agent-responses-proc" in PATHS:  # the Responses program in worker processes: its SDK off the trainer
            responses = functools.partial(program, dialect="responses")
            factories["agent-responses-proc"] = isolated(TimedFactory(responses), pool_size=args.proc_pool)

        def run(path: str, n: int) -> dict[str, Any]:
            seeds = [f"{n}-{i}" for i in range(n)]
            counter.take()
            steps0 = engine_steps(base_url)
            machine0, cpu0, t0 = machine_cpu(), time.process_time(), time.perf_counter()
            rollouts = batch_rollout(seeds, factories[path], processor, tokenizer, gen, budgets=budgets,
                                     parse_truncated_turns=True, env_workers=args.env_workers, coalesce_s=coalesce,
                                     history="deployed")  # fmt: skip
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            busy, idle = (after - before for after, before in zip(machine_cpu(), machine0, strict=True))
            steps = engine_steps(base_url) - steps0
            check(rollouts, n, args.turns, path)
            reqs, prompts = counter.take()
            me = os.getpid()
            workers = sum(r.info["env"]["cpu"] for r in rollouts if r.info.get("env", {}).get("pid", me) != me)
            result = dict(
                wall=wall,
                cpu=cpu,
                workers_cpu=workers,
                busy=busy,
                idle=idle,
                steps=steps,
                requests=reqs,
                prompts=prompts,
            )
            if path.startswith("agent"):
                result["added"], result["client"], result["engine"] = added_latency(rollouts)
            return result

        measured = [(path, n) for n in sizes for path in PATHS if not path.endswith("-proc") or n <= args.proc_pool]
        t_start = time.perf_counter()
        for path, n in measured:  # warm-up: each path once per size
            run(path, n)
        print(f"[warm-up] {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
        rng, order = random.Random(args.seed), []
        for _ in range(reps):  # rounds: each runs every (path, N) once, in shuffled order (paired per round)
            order += rng.sample(measured, len(measured))
        results: dict[tuple[str, int], list[dict[str, Any]]] = {key: [] for key in order}
        for i, (path, n) in enumerate(order):
            results[(path, n)].append(run(path, n))
            last = results[(path, n)][-1]
            print(f"[{i + 1}/{len(order)}] {path} N={n}: {last['wall']:.2f} s, {last['requests']} requests",
                  file=sys.stderr)  # fmt: skip
        total = time.perf_counter() - t_start

    text = report(results, PATHS, sizes, reps, args, notes, server, total)
    print(text)
    stem = "bench_agents_scripted" if args.scripted else "bench_agents"
    (out / f"{stem}.md").write_text(text + "\n")
    C.save_json(out / f"{stem}.json", dict(
        args=vars(args), notes=notes, server=server, total_s=total,
        runs={f"{path} {n}": [{k: v for k, v in r.items() if k not in ("added", "client", "engine")} for r in rs]
              for (path, n), rs in results.items()},
        latency_ms={f"{path} {n}" if path != "agent" else str(n): {
            q: percentile([x for r in results[(path, n)] for x in r[key]], p) * 1e3
            for key in ("added", "client", "engine") for q, p in ((f"{key} p50", 50), (f"{key} p99", 99))}
            for n in sizes for path in PATHS if path.startswith("agent") and (path, n) in results},
    ))  # fmt: skip
    return 0


if __name__ == "__main__":  # run as the module `bench_agents`: what agent-proc's worker processes unpickle by name
    import bench_agents

    raise SystemExit(bench_agents.main())
