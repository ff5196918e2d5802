"""An OpenEnv text environment ("echo the word"), served by OpenEnv's own FastAPI/uvicorn server, no Docker.

Each turn the env names a word and the model must repeat it exactly; after WORDS_PER_EPISODE words the
episode is done. The wire format is that of the echo env in OpenEnv's `openenv init` template (action
`{"message": str}`), since no ready-made env package is on PyPI (they ship as Docker images / HF Spaces).
With --log, every reset and step is appended to a JSONL file: the env's own record of what it reported.

Run:  python experiment/examples/openenv_echo_server.py --port 8000 --max-sessions 16
Used: by openenv_echo.py (`start_server` runs this file) and tests/test_openenv.py.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import uuid
from difflib import SequenceMatcher
from functools import partial
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

WORDS = (
    "apple banana cherry grape lemon mango melon peach pear plum "
    "bear cat dog fox horse lion mouse otter tiger wolf "
    "blue green red white black river stone cloud storm sun"
).split()
WORDS_PER_EPISODE = 3
_log_lock = threading.Lock()


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    prompt: str = ""


class EchoWordsEnvironment(Environment):
    """Repeat each word; reward per word 1/WORDS_PER_EPISODE if exact, else half that times the similarity."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # no shared state: the server may run many sessions at once

    def __init__(self, log: str | None = None) -> None:
        super().__init__()
        self.log, self.words, self.turn, self.seed = log, [], 0, None
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self.seed, self.turn = seed, 0
        self.words = random.Random(seed).sample(WORDS, WORDS_PER_EPISODE)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        prompt = f"Repeat each word I give you exactly, one word per reply. First word: {self.words[0]}"
        self._record(event="reset", prompt=prompt)
        return EchoObservation(prompt=prompt, done=False, reward=None)

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any) -> EchoObservation:  # type: ignore[override]  # typed action
        said = action.message.strip().strip(".,!?\"'").strip().lower()
        target = self.words[self.turn]
        exact = said == target
        reward = round((1.0 if exact else 0.5 * SequenceMatcher(None, said, target).ratio()) / WORDS_PER_EPISODE, 6)
        self.turn += 1
        self._state.step_count = self.turn
        done = self.turn >= WORDS_PER_EPISODE
        verdict = "Correct." if exact else f"You said {said[:40]!r}, not {target!r}."
        prompt = verdict + (" Episode over." if done else f" Next word: {self.words[self.turn]}")
        self._record(event="step", action=action.message, reward=reward, done=done, prompt=prompt)
        return EchoObservation(prompt=prompt, done=done, reward=reward)

    @property
    def state(self) -> State:
        return self._state

    def _record(self, **fields: Any) -> None:
        if self.log:
            line = json.dumps({"episode": self._state.episode_id, "seed": self.seed, **fields}) + "\n"
            with _log_lock, open(self.log, "a", encoding="utf-8") as f:
                f.write(line)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=16, help="concurrent WebSocket sessions (episodes)")
    parser.add_argument("--log", default=None, help="append every reset/step to this JSONL file")
    args = parser.parse_args(argv)
    app = create_app(
        partial(EchoWordsEnvironment, log=args.log),
        EchoAction,
        EchoObservation,
        env_name="echo_words",
        max_concurrent_envs=args.max_sessions,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
