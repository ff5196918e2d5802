"""Abandoned streams, per dialect (issue 45 item 5): a client that closes a streaming answer mid-way, over the
gateway's loopback HTTP endpoint. The gateway writes a stream only once its turn is sampled, so the turn stands: it
is the policy's answer to exactly the context the program sent (token-exact, as every turn). Nothing else is kept:
no waiting call, no open session once the episode ends; the program's next call is answered as any; and another
episode running beside it gets exactly the rows it gets alone."""

from __future__ import annotations

import openai
import pytest
from agents_support import PromptReplyGenerator, assert_token_exact, framework, qwen3_script, rows_of

from trl_env.agents import Gateway, agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

pytestmark = pytest.mark.slow  # each test runs agent programs through the gateway: seconds each

QUESTION = "What is 40 + 2?"


def first_event_then_close(dialect: str, run) -> None:
    """Open a streaming call in ``dialect`` with a fresh SDK client on ``run.base_url``, read one event, close."""
    if dialect == "messages":
        client = framework("anthropic", "agents-dialects").Anthropic(
            base_url=run.root_url, api_key=run.api_key, max_retries=0
        )
        stream = client.messages.create(
            model=run.model, max_tokens=64, stream=True, messages=[{"role": "user", "content": QUESTION}]
        )
    else:
        client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0)
        if dialect == "responses":
            stream = client.responses.create(model=run.model, input=QUESTION, stream=True)
        else:
            stream = client.chat.completions.create(
                model=run.model, stream=True, messages=[{"role": "user", "content": QUESTION}]
            )
    next(iter(stream))
    stream.close()  # the response's connection closes with the rest of the stream unread
    client.close()


def asked(run) -> float:
    """One whole (unstreamed) chat call; 1.0 when it is answered."""
    client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, max_retries=0)
    reply = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": QUESTION}])
    return float(reply.choices[0].message.content == "The answer is 42")


def abandoning(dialect: str):
    def program(run) -> float:
        if run.seed == "abandons":
            first_event_then_close(dialect, run)
        return asked(run)  # the next call: the same question again, not streamed

    return program


@pytest.fixture(scope="module")
def gateway():
    g = Gateway()
    yield g
    g.shutdown()


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_stream_closed_mid_way_keeps_its_sampled_turn_and_changes_no_other_episode(gateway, dialect):
    tokenizer = load_tokenizer("pypi:qwen3")

    def rollouts(seeds):
        generator = PromptReplyGenerator(tokenizer, lambda k, prompt: qwen3_script(1, prompt))  # answers in text
        factory = agent_env_factory(abandoning(dialect), gateway=gateway)
        out = batch_rollout(seeds, factory, from_tokenizer(tokenizer), tokenizer, generator, history="deployed")
        return out, generator

    (alone,), _ = rollouts(["other"])
    (other, abandons), generator = rollouts(["other", "abandons"])
    assert rows_of([other]) == rows_of([alone])  # the episode beside it: unchanged
    assert abandons.ending is Ending.ENV_DONE and abandons.reward == 1.0, abandons.error
    # the abandoned call's turn was sampled before its stream began: it stands, token-exact; the next call, the same
    # question again, is a row of its own (its context does not extend the first turn's)
    assert abandons.info["env"]["agent_calls"] == 2 and len(abandons.rows) == 2
    assert abandons.rows[0].prompt_ids == abandons.rows[1].prompt_ids
    assert assert_token_exact([other, abandons], generator) == 3
    assert gateway.open_sessions() == 0  # nothing left waiting on the gateway
