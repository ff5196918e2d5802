"""The colocated-vLLM backend against a stand-in engine with vLLM's output shapes (a GPU run is in docs)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from helpers import ScriptedEnv

from trl_env import Budgets, ChatMLProcessor, Ending, batch_rollout
from trl_env.backends.vllm_colocate import VLLMColocateGenerator


@dataclass
class Params:  # the keywords of vllm.SamplingParams that the backend uses
    max_tokens: int
    stop_token_ids: list
    logprobs: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float


class FakeLLM:
    """Answers like vllm.LLM.generate: RequestOutput.outputs[0] with token_ids, logprobs, finish_reason."""

    def __init__(self, stop_id, reply_len=3):
        self.stop_id, self.reply_len, self.calls, self.events = stop_id, reply_len, [], []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append((prompts, sampling_params))
        outputs = []
        for p in sampling_params:
            n = min(self.reply_len, p.max_tokens)
            ids = [7] * (n - 1) + [self.stop_id] if n == self.reply_len else [7] * n
            logprobs = [{t: SimpleNamespace(logprob=-0.25 * (i + 1))} for i, t in enumerate(ids)]
            finish = "stop" if ids[-1] == self.stop_id else "length"
            outputs.append(
                SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish)])
            )
        return outputs

    def wake_up(self, tags):
        self.events.append(("wake", tuple(tags)))

    def sleep(self, level):
        self.events.append(("sleep", level))


def test_colocate_backend_samples_waves_with_per_request_budgets_and_sampling(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    llm = FakeLLM(stop)
    gen = VLLMColocateGenerator(llm, temperature=0.6, top_k=0, sampling_params=Params)
    seeds = ['{"n": 1, "deltas": ["a"]}', '{"n": 3, "deltas": ["b"]}']
    rollouts = batch_rollout(seeds, ScriptedEnv, ChatMLProcessor(), tokenizer, gen, budgets=Budgets(max_new_tokens=5))
    assert [len(c[0]) for c in llm.calls] == [2, 1, 1]  # waves of the episodes still running
    first = llm.calls[0][1][0]
    assert first.max_tokens == 5 and first.stop_token_ids[0] == stop and first.logprobs == 0
    assert first.temperature == 0.6 and first.top_k == -1
    assert [r.ending for r in rollouts] == [Ending.ENV_DONE, Ending.ENV_DONE]
    assert rollouts[0].logprobs[:3] == [-0.25, -0.5, -0.75] and rollouts[0].env_mask[:3] == [1, 1, 1]


def test_sleep_mode_wakes_once_per_rollout_and_resyncs_discarded_weights(tokenizer):
    llm = FakeLLM(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    synced = []
    vg = SimpleNamespace(enable_sleep_mode=True, _llm_weights_sleeping=True, sync_weights=lambda: synced.append(1))
    gen = VLLMColocateGenerator(llm, vllm_generation=vg, sampling_params=Params)
    with gen.session():
        batch_rollout(['{"n": 3, "deltas": ["x"]}'], ScriptedEnv, ChatMLProcessor(), tokenizer, gen)
    assert synced == [1] and llm.events == [("wake", ("kv_cache",)), ("sleep", 2)] and vg._llm_weights_sleeping


def test_an_unusable_output_ends_only_its_episode(tokenizer):
    class Broken(FakeLLM):
        def generate(self, prompts, sampling_params, use_tqdm):
            outputs = super().generate(prompts, sampling_params, use_tqdm)
            outputs[0].outputs[0].finish_reason = "abort"
            return outputs

    gen = VLLMColocateGenerator(Broken(tokenizer.convert_tokens_to_ids("<|im_end|>")), sampling_params=Params)
    rollouts = batch_rollout(['{"n": 1, "deltas": ["a"]}'] * 2, ScriptedEnv, ChatMLProcessor(), tokenizer, gen)
    assert sorted(r.ending.value for r in rollouts) == ["env_done", "error"]
    assert "abort" in next(r.error for r in rollouts if r.ending is Ending.ERROR)


def test_generation_kwargs_reach_sampling_params_or_are_refused_by_name(tokenizer):
    import pytest

    from trl_env import ConfigError

    @dataclass
    class SeededParams(Params):
        seed: int = -1

    llm = FakeLLM(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    gen = VLLMColocateGenerator(llm, generation_kwargs={"top_k": 1, "seed": 7}, sampling_params=SeededParams)
    batch_rollout(['{"n": 1, "deltas": ["a"]}'], ScriptedEnv, ChatMLProcessor(), tokenizer, gen)
    params = llm.calls[0][1][0]
    assert params.top_k == 1 and params.seed == 7
    with pytest.raises(ConfigError, match="sets 'max_tokens' itself"):
        VLLMColocateGenerator(llm, generation_kwargs={"max_tokens": 3}, sampling_params=Params)
    with pytest.raises(ConfigError, match="'response_format'.* not a sampling setting"):
        VLLMColocateGenerator(llm, generation_kwargs={"response_format": {}}, sampling_params=Params)
