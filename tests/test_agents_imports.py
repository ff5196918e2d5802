"""What the clients need is imported before any agent program starts: programs starting together on threads of their
own never see half an import (openai 3.x's client constructor reads ``sys.modules["httpx"]`` without importing it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.slow  # an interpreter of its own: the race needs a process where httpx is not imported yet

SCRIPT = r"""
import collections, importlib.abc, importlib.util, sys, threading, time
sys.path.insert(0, TESTS)


class SlowHttpx(importlib.abc.MetaPathFinder):
    # widens the race's window (httpx half imported, in sys.modules) to 0.5 s, as a slow disk would: without it the
    # bug shows in 1-9 of 48 episodes a run, with it in every episode that builds its client within the window
    def find_spec(self, name, path=None, target=None):
        if name != "httpx":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("httpx")
        run = spec.loader.exec_module
        spec.loader.exec_module = lambda module: (time.sleep(0.5), run(module))[1]
        return spec


sys.meta_path.insert(0, SlowHttpx())
import openai
from agents_support import PromptReplyGenerator

from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import batch_rollout
from trl_env.testing.tokenizers import load_tokenizer


def program(run):
    # the two documented ways: AgentRun's client, and any client built on run.base_url (smolagents, the raw SDK)
    if int(run.seed) % 2:
        client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0)
    else:
        client = run.openai(max_retries=0)
    reply = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": "hi"}])
    return float(reply.choices[0].message.content == "0")


tokenizer = load_tokenizer("pypi:qwen2_5")
if "httpx" in sys.modules:  # openai < 3 imports it itself, on this thread
    print("httpx imported before any program starts: no race to show")
    sys.exit(0)
generator = PromptReplyGenerator(tokenizer, lambda k, prompt: "0<|im_end|>")
rollouts = batch_rollout([str(i) for i in range(48)], agent_env_factory(program), from_tokenizer(tokenizer),
                         tokenizer, generator, history="deployed")
errors = sorted({str(r.error)[:160] for r in rollouts if r.error})
print(dict(collections.Counter(r.ending.value for r in rollouts)), errors)
"""


def test_programs_starting_at_once_with_both_client_styles_all_reach_the_model_in_a_fresh_process():
    script = SCRIPT.replace("TESTS", repr(str(Path(__file__).parent)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    if "no race to show" in out.stdout:
        pytest.skip(f"openai {openai.__version__} imports httpx itself: the race cannot happen")
    assert out.stdout.strip() == "{'env_done': 48} []", out.stdout + out.stderr[-3000:]
