"""A real OpenEnv server that misbehaves on request, for tests/test_openenv.py (OpenEnv's ``HTTPEnvServer`` routes
under uvicorn, wrapped in a small ASGI layer that injects the faults).

The env: two steps per episode, reward 0.5 a step, action ``{<field>: str}`` (``message`` at start). Faults:
``POST /fault {"schema_hang": true}`` makes ``GET /schema`` never answer; ``POST /fault {"action_field": "text"}``
renames the action's field (a redeployed env); a reset with option ``fault`` (``"empty"``, ``"no_observation"``,
``"no_reward"``, ``"no_done"`` or ``"state"``) makes every step of that episode answer with such a frame.

Run:  python tests/openenv_fault_server.py --port 8001 --max-sessions 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

from fastapi import Body, FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import create_model

STEPS = 2
FAULTS = ("empty", "no_observation", "no_reward", "no_done", "state")


def action_class(field: str) -> type[Action]:
    """An action with one text field named ``field``."""
    return create_model("FaultAction", __base__=Action, **{field: (str, ...)})


class FaultObservation(Observation):
    prompt: str = ""


class FaultEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.turn, self.fault = 0, ""
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, fault: str = "", **kwargs: Any):
        self.turn, self.fault = 0, fault
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return FaultObservation(prompt=f"Say anything ({STEPS} turns).", done=False, reward=None)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any):  # type: ignore[override]
        self.turn += 1
        self._state.step_count = self.turn
        said = next(iter(action.model_dump(exclude={"metadata"}).values()))
        metadata = {"fault": self.fault} if self.fault else {}
        return FaultObservation(
            prompt=f"You said {said[:20]!r}.", done=self.turn >= STEPS, reward=0.5, metadata=metadata
        )

    @property
    def state(self) -> State:
        return self._state


def rewrite(frame: dict[str, Any]) -> dict[str, Any]:
    """The frame a faulty server sends instead of ``frame`` (an observation frame of a faulted episode)."""
    data = frame.get("data") or {}
    fault = (data.get("metadata") or {}).get("fault") if frame.get("type") == "observation" else None
    if not fault:
        return frame
    if fault == "state":
        return {"type": "state", "data": {"episode_id": "x", "step_count": 1}}
    if fault == "empty":
        return {"type": "observation", "data": {}}
    return {"type": "observation", "data": {k: v for k, v in data.items() if k != fault.removeprefix("no_")}}


class Faults:
    """ASGI layer over the OpenEnv app: holds GET /schema while ``schema_hang``, rewrites faulted step frames."""

    def __init__(self, app: Any) -> None:
        self.app, self.schema_hang = app, False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/schema" and self.schema_hang:
            await asyncio.Event().wait()  # never answers (ends when the client gives up and the server stops)
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)

        async def send_rewritten(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.send" and message.get("text"):
                message = {**message, "text": json.dumps(rewrite(json.loads(message["text"])))}
            await send(message)

        return await self.app(scope, receive, send_rewritten)


def build(max_sessions: int) -> Faults:
    server = HTTPEnvServer(
        FaultEnvironment, action_class("message"), FaultObservation, max_concurrent_envs=max_sessions
    )
    app = FastAPI()
    faults = Faults(app)

    @app.post("/fault")
    def set_fault(options: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008  # FastAPI's idiom
        if "schema_hang" in options:
            faults.schema_hang = bool(options["schema_hang"])
        if "action_field" in options:
            server.action_cls = action_class(options["action_field"])
        return {"schema_hang": faults.schema_hang, "action": list(server.action_cls.model_fields)}

    server.register_routes(app)
    return faults


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--log", default=None, help="accepted for openenv_echo.start_server; unused")
    args = parser.parse_args(argv)
    uvicorn.run(build(args.max_sessions), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
