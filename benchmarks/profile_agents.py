"""Where the agent path's CPU goes: one ``bench_agents --scripted`` rollout of a path under yappi (CPU clock, threads).

An investigation tool, not a benchmark: yappi is not a dependency (``pip install yappi``). Prints the CPU per call and
the CPU of the agent path's parts (the SDK's request building, its answer parsing, httpx, the HTTP server stack, the
gateway's own code, the engine's rendering), as a share of the agent programs' threads; writes the full profile.

    python benchmarks/profile_agents.py --path agent --episodes 64

``--sdk-floor``: the openai SDK's own CPU per ``create`` (and per ``openai.OpenAI()``) against an ``httpx.MockTransport``
that answers at once, by conversation length: what any server's agent path costs on the program's side.

``--dialects``: per dialect (chat, Responses, Messages), the CPU of the gateway's own parse and answer of a call, and
of the SDK's ``create`` (and a ``model_dump`` of what it returns) against a transport that answers at once, with the
4-turn task's 7 messages: where a dialect's trainer CPU per call (``bench_agents --scripted --paths env agent
agent-responses agent-messages``) goes.

``--decode``: the CPU of decoding a 16-token reply once, against decoding each of its tokens on its own (what every
agent call did before ``Reply.tokens`` was decoded only for a call that asks for ``logprobs``).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from typing import Any

import _common as C
import bench_agents as B

PARTS = {  # label: (a fragment of the file's path, the function's name), as yappi names them; summed over matches
    "openai SDK: request to JSON (maybe_transform)": ("openai/_utils/_transform.py", "maybe_transform"),
    "openai SDK: parsing the answer (_process_response)": ("openai/_base_client.py", "OpenAI._process_response"),
    "openai.OpenAI() construction": ("openai/_client.py", "OpenAI.__init__"),
    "httpx/httpx2 client send (its pool and h11, or the in-process transport)": ("_client.py", ".send"),
    "uvicorn + Starlette (gateway HTTP side)": ("h11_impl.py", "RequestResponseCycle.run_asgi"),
    "in-process transport (agents/local.py)": ("agents/local.py", "LocalTransport.handle_request"),
    "engine: a chat request's rendering (Calls._step_chat)": ("rollout/calls.py", "Calls._step_chat"),
}


def decode_cost(calls: int = 2000) -> str:
    """CPU per reply of 16 tokens (``bench_agents``' replies): one ``decode`` of all, and one per token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(C.tiny_model_dir())
    ids = B.InstantGenerator(tokenizer, 16).ids
    costs = {}
    for label, once in (("whole", lambda: tokenizer.decode(ids, skip_special_tokens=False)),
                        ("per token", lambda: [tokenizer.decode([i], skip_special_tokens=False) for i in ids])):  # fmt: skip
        for _ in range(200):
            once()
        t0 = time.process_time()
        for _ in range(calls):
            once()
        costs[label] = (time.process_time() - t0) / calls * 1e6
    return f"16-token reply: one decode {costs['whole']:.1f} us CPU, each token on its own {costs['per token']:.1f} us"


def sdk_floor(calls: int = 300) -> str:
    """The SDK's CPU per ``chat.completions.create`` (and ``model_dump`` of its message) with 1-7 messages, and per
    ``openai.OpenAI()`` with and without an ``http_client``: no server, no gateway, a canned answer."""
    import json

    import httpx
    import openai

    message = {"role": "assistant", "content": " ".join(["word"] * 16)}
    choice = {"index": 0, "message": message, "finish_reason": "length", "logprobs": None}
    usage = {"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26}
    body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice],
                       "usage": usage}).encode()  # fmt: skip
    transport = httpx.MockTransport(
        lambda r: httpx.Response(200, content=body, headers={"content-type": "application/json"})
    )

    def client() -> Any:
        http = httpx.Client(transport=transport, trust_env=False)
        return openai.OpenAI(base_url="http://x/v1", api_key="k", max_retries=0, http_client=http)

    messages: list[Any] = [{"role": "user", "content": "Episode 0. Say anything; this game lasts 4 turns."}]
    for turn in range(1, 4):
        messages += [message, {"role": "user", "content": f"Turn {turn} noted. Next."}]
    lines, c = ["| messages | SDK CPU ms per create |", "|---|---|"], client()
    for n in (1, 3, 5, 7):
        for _ in range(20):  # warm-up
            c.chat.completions.create(model="m", messages=messages[:n])
        t0 = time.process_time()
        for _ in range(calls):
            c.chat.completions.create(model="m", messages=messages[:n]).choices[0].message.model_dump(exclude_none=True)
        lines.append(f"| {n} | {(time.process_time() - t0) / calls * 1e3:.2f} |")
    for label, make in (("openai.OpenAI(http_client=<an httpx.Client on a transport>)", client),
                        ("openai.OpenAI() (its own httpx client and SSL context)",
                         lambda: openai.OpenAI(base_url="http://x/v1", api_key="k"))):  # fmt: skip
        t0 = time.process_time()
        for _ in range(20):
            make()
        lines.append(f"| {label} | {(time.process_time() - t0) / 20 * 1e3:.2f} per client |")
    return "\n".join(lines)


def dialect_floor(calls: int = 300) -> str:
    """CPU per call of each dialect's gateway side (``parse``, ``answer``) and SDK side (``create`` + ``model_dump``)."""
    import importlib
    import json

    import anthropic
    import httpx
    import openai

    from trl_env.agents.dialects import DIALECTS
    from trl_env.render.chat import Reply

    text = " ".join(["word"] * 16)
    reply = Reply(
        text,
        {"role": "assistant", "content": text},
        reasoning_field=None,
        finish_reason="length",
        token_ids=tuple(range(16)),
        logprobs=(-0.5,) * 16,
        tokens=(),
        prompt_tokens=50,
    )
    chat: list[Any] = [{"role": "user", "content": "Episode 0. Say anything; this game lasts 4 turns."}]
    for turn in range(1, 4):
        chat += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Turn {turn} noted. Next."}]
    said = {
        "type": "message",
        "role": "assistant",
        "id": "msg_0",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    bodies: dict[str, dict[str, Any]] = {
        "chat": {"model": "m", "messages": chat},
        "responses": {"model": "m", "input": [said if m["role"] == "assistant" else m for m in chat]},
        "messages": {
            "model": "m",
            "max_tokens": 4096,
            "messages": [
                {"role": "assistant", "content": [{"type": "text", "text": text}]} if m["role"] == "assistant" else m
                for m in chat
            ],
        },
    }

    def cost(once: Any) -> float:
        for _ in range(30):
            once()
        t0 = time.process_time()
        for _ in range(calls):
            once()
        return (time.process_time() - t0) / calls * 1e3

    ids = itertools.count()  # the answers' tool-call ids, as a session counts them
    lines = ["| dialect | gateway parse ms | gateway answer ms | SDK create + model_dump ms |", "|---|---|---|---|"]
    for name, body in bodies.items():
        dialect, raw = DIALECTS[name], json.dumps(body).encode()
        call = dialect.parse(raw, {})
        answer = dialect.answer(reply, call, model="m", call_ids=iter(["call_0"]), memory={})
        gateway = (
            cost(lambda d=dialect, r=raw: d.parse(r, {})),
            cost(
                lambda d=dialect, c=call: d.answer(reply, c, model="m", call_ids=(f"call_{k}" for k in ids), memory={})
            ),
        )
        http: Any = httpx  # the Anthropic SDK's: the package its DefaultHttpxClient subclasses (httpx2 from 2.x)
        if name == "messages":
            http = importlib.import_module(anthropic.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
        canned = http.MockTransport(
            lambda r, a=answer, h=http: h.Response(200, content=a, headers={"content-type": "application/json"})
        )
        client: Any
        if name == "messages":
            client = anthropic.Anthropic(
                base_url="http://x", api_key="k", max_retries=0, http_client=http.Client(transport=canned)
            )
            sdk = cost(
                lambda c=client, b=body: [x.model_dump(exclude_none=True) for x in c.messages.create(**b).content]
            )
        else:
            client = openai.OpenAI(
                base_url="http://x/v1", api_key="k", max_retries=0, http_client=http.Client(transport=canned)
            )
            if name == "chat":
                sdk = cost(lambda c=client, b=body: c.chat.completions.create(**b).choices[0].message.model_dump())
            else:
                sdk = cost(
                    lambda c=client, b=body: [x.model_dump(exclude_none=True) for x in c.responses.create(**b).output]
                )
        lines.append(f"| {name} | {gateway[0]:.3f} | {gateway[1]:.3f} | {sdk:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", choices=["env", "agent", "agent-http"], default="agent")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--out", default="/tmp/profile_agents.txt", help="the full profile (sorted by total time)")
    parser.add_argument("--decode", action="store_true", help="only a reply's decode cost, whole and per token")
    parser.add_argument("--sdk-floor", action="store_true", help="only the openai SDK's own CPU per call, no server")
    parser.add_argument("--dialects", action="store_true", help="only each dialect's gateway and SDK CPU per call")
    args = parser.parse_args()
    if args.dialects:
        print(dialect_floor())
        return 0
    if args.sdk_floor:
        print(sdk_floor())
        return 0
    if args.decode:
        print(decode_cost())
        return 0
    import yappi
    from transformers import AutoTokenizer

    from trl_env import Budgets, batch_rollout
    from trl_env.render.processors import from_tokenizer
    from trl_env.testing.templates import trl_templates

    tokenizer = AutoTokenizer.from_pretrained(C.tiny_model_dir())
    tokenizer.chat_template = trl_templates()["qwen2_5"]
    processor, generator = from_tokenizer(tokenizer), B.InstantGenerator(tokenizer, 16)
    budgets = Budgets(max_turns=4, max_new_tokens=16, max_completion_tokens=4096)
    program = functools.partial(B.agent_program, http=args.path == "agent-http")
    factory = C.EnvFactory(4) if args.path == "env" else functools.partial(B.TimedAgentEnv, program)

    def rollout(tag: str) -> None:
        seeds = [f"{tag}-{i}" for i in range(args.episodes)]
        batch_rollout(seeds, factory, processor, tokenizer, generator, budgets=budgets, parse_truncated_turns=True,
                      env_workers=16, history="deployed")  # fmt: skip

    rollout("warm")
    yappi.set_clock_type("cpu")
    yappi.start()
    cpu0 = time.process_time()
    rollout("profiled")
    cpu = time.process_time() - cpu0
    yappi.stop()
    calls = args.episodes * 4
    print(f"{args.path}, {args.episodes} episodes: {cpu / calls * 1e3:.1f} ms CPU per call under the profiler")
    stats = yappi.get_func_stats()
    programs = sum(s.ttot for s in stats if "bench_agents.py" in s.full_name and s.name.endswith("agent_program"))
    for label, (path, name) in PARTS.items():
        spent = sum(s.ttot for s in stats if path in s.full_name and s.name.endswith(name))
        print(f"  {label}: {spent:.2f} s ({spent / max(programs, 1e-9):.0%} of the programs' threads' own)")
    stats.sort("ttot")
    with open(args.out, "w") as f:
        stats.print_all(out=f, columns={0: ("name", 100), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8)})
    print(f"full profile: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
