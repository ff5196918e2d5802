"""The CPU workaround for TRL 1.16's ``AsyncGRPOTrainer``: ``patch_for_cpu``."""

from __future__ import annotations

from typing import Any

from trl_env.train.trl_internals import patch_async_for_cpu


class _SdpaVarlen:
    """``flash_attn_varlen_func`` on CPU: an SDPA call per tree segment, flash-attn's semantics.

    q: (total_q, Hq, D); k, v: (total_k, Hkv, D), already gathered along each segment's tree path.
    Causal masking is aligned bottom-right (query i of a segment sees key j <= i + lk - lq), GQA heads
    are repeated, and a sliding window and a logit softcap are honoured.
    """

    @staticmethod
    def flash_attn_varlen_func(
        q: Any,
        k: Any,
        v: Any,
        cu_seqlens_q: Any,
        cu_seqlens_k: Any,
        max_seqlen_q: int,
        max_seqlen_k: int,
        softmax_scale: float | None = None,
        causal: bool = True,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float | None = None,
        **_: Any,
    ) -> Any:
        import torch
        import torch.nn.functional as F  # noqa: N812

        hq, hk = q.shape[1], k.shape[1]
        out = torch.empty_like(q)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        for s in range(len(cq) - 1):
            lq, lk = cq[s + 1] - cq[s], ck[s + 1] - ck[s]
            qi = q[cq[s] : cq[s + 1]].transpose(0, 1)  # (H, lq, D)
            ki = k[ck[s] : ck[s + 1]].transpose(0, 1)
            vi = v[ck[s] : ck[s + 1]].transpose(0, 1)
            if hq != hk:
                ki, vi = ki.repeat_interleave(hq // hk, dim=0), vi.repeat_interleave(hq // hk, dim=0)
            i = torch.arange(lq, device=q.device).unsqueeze(1)
            j = torch.arange(lk, device=q.device).unsqueeze(0)
            mask = j <= i + (lk - lq) if causal else torch.ones(lq, lk, dtype=torch.bool, device=q.device)
            if window_size[0] >= 0:
                mask &= j >= i + (lk - lq) - window_size[0]
            if softcap:
                scores = (qi @ ki.transpose(-1, -2)) * scale
                scores = softcap * torch.tanh(scores / softcap)
                o = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ vi
            else:
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale)
            out[cq[s] : cq[s + 1]] = o.transpose(0, 1)
        return out


def patch_for_cpu() -> None:
    """Let TRL 1.16's ``AsyncGRPOTrainer`` train on CPU: a WORKAROUND, applied only when you call it.

    TRL 1.16 assumes CUDA in two places, so without this the trainer cannot even be built on CPU:

    1. ``AsyncGRPOTrainer.__init__`` calls ``get_peak_flops_per_device``, which calls
       ``torch.cuda.get_device_name`` (``AssertionError: Torch not compiled with CUDA enabled``). Patched to
       return ``None``, TRL's own "MFU unknown" value.
    2. The model is always loaded with the ``tree_fa3`` attention, whose kernel is a CUDA flash-attention
       fetched from the Hub (``kernels.get_kernel("kernels-community/flash-attn3")``). Patched to an SDPA loop
       over the packed tree segments with flash-attn's varlen semantics (``_SdpaVarlen``); slow for long
       rows, but exact (packed logprobs matched a per-sample forward to 5e-7 on the tiny model).

    Both patches are process-wide monkeypatches of ``trl.experimental.async_grpo`` module attributes, and
    idempotent. On a GPU machine do not call this. Newer TRL versions may not need it (or may move the
    patched names: then this raises instead of patching silently).

    Raises:
        ConfigError: when TRL's async module lacks the patched names (a TRL version this was not written for).
    """
    patch_async_for_cpu(_SdpaVarlen)
