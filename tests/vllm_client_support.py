"""A stand-in vLLM HTTP endpoint for the client tests (moved from test_vllm_client.py, unchanged)."""

from __future__ import annotations

from trl_env.backends.vllm_server import VLLMServerGenerator


class Response:
    def __init__(self, status_code=200, payload=None, text=""):
        self.status_code, self.payload, self.text = status_code, payload, text or str(payload)

    def json(self):
        if self.payload is None:
            raise ValueError("not json")
        return self.payload


def completion(ids, lps=None, finish="stop"):
    lps = lps if lps is not None else [-0.5] * len(ids)
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}]}


def models_get(url, timeout):
    if url.endswith("/v1/models"):
        return Response(payload={"data": [{"id": "tiny"}]})
    return Response(404, text="not found")


def make(post, **kwargs):
    kwargs.setdefault("backoff", 0.001)
    return VLLMServerGenerator(
        kwargs.pop("urls", "http://127.0.0.1:1"), post=post, get=kwargs.pop("get", models_get), **kwargs
    )


def batched(prompts_answers, finish="stop"):
    """A batched answer: one choice per prompt, in order."""
    return {
        "choices": [
            {"index": i, "token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}, "finish_reason": finish}
            for i, ids in enumerate(prompts_answers)
        ]
    }


def echo(json):
    """Answer each prompt of a (batched) body with its own last id + 100, so answers can be told apart."""
    prompts = json["prompt"] if isinstance(json["prompt"][0], list) else [json["prompt"]]
    return batched([[p[-1] + 100, 2] for p in prompts])


def prompts_of(json):
    return json["prompt"] if isinstance(json["prompt"][0], list) else [json["prompt"]]
