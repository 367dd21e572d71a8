"""The spec made executable: plain PyTorch attention, one sequence at a time, in float64.

Used by the tests, ``python -m portattn check`` and later the golden and bench tools. Runs on any
device; differentiable (so the lse gradient can be checked through autograd).
"""

from __future__ import annotations

import math

import torch


def _attention_one(
    q,
    k,
    v,
    causal: bool,
    scale: float,
    window: tuple[int, int] = (-1, -1),
    softcap: float | None = 0.0,
    sinks=None,
):
    """q: [Sq, Hq, D], k: [Sk, Hkv, D], v: [Sk, Hkv, Dv] (float64) -> out [Sq, Hq, Dv],
    lse [Sq, Hq]."""
    seqlen_q, n_heads_q = q.shape[:2]
    seqlen_k, n_heads_k = k.shape[0], k.shape[1]
    group = n_heads_q // n_heads_k
    k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [Hq, Sq, Sk]
    if softcap:  # Gemma 2 / flash-attn: c * tanh(scale * q.k / c), before the mask
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=q.device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    left, right = window
    if causal or right == 0:  # bottom-right aligned; flash-attn: a window's right 0 is causal
        visible = cols <= rows
    elif right > 0:
        visible = cols <= rows + right
    if left >= 0:
        visible = visible & (cols >= rows - left)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is None:
        lse = torch.logsumexp(scores, dim=-1)  # [Hq, Sq]; -inf where a row sees no key
    else:  # one more logit per head in each row's denominator, with no value
        sink = sinks.to(scores.dtype)[:, None, None].expand(-1, seqlen_q, 1)
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
    seen = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(seen, lse, torch.zeros_like(lse))[..., None])
    probs = torch.where(seen[..., None], probs, torch.zeros_like(probs))
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return out, lse.transpose(0, 1)


def reference_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference of ``portattn.varlen_attention``.

    q: [total_q, Hq, D]; k: [total_k, Hkv, D]; v: [total_k, Hkv, Dv] (Dv: D, or v's own
    head dim); cu_seqlens_*: [B + 1]. The scale defaults to ``1 / sqrt(D)`` (q's head dim).
    Returns (out float64 [total_q, Hq, Dv], lse float64 [total_q, Hq]). Rows that see no key get
    out 0 and lse -inf. Gradients flow to q, k, v (through out and lse). ``window_size``:
    flash-attn's sliding window, ``softcap``: the scores' cap, ``sinks``: [Hq] attention
    sinks (see ``varlen_attention``; differentiable).

    ``compute_dtype`` other than float64 gives the same math done eagerly in that dtype: the
    yardstick for "as accurate as eager attention in the input dtype".
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    bounds_q = cu_seqlens_q.tolist()
    bounds_k = cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(bounds_q) - 1):
        sq = slice(bounds_q[b], bounds_q[b + 1])
        sk = slice(bounds_k[b], bounds_k[b + 1])
        window = tuple(window_size)
        out, lse = _attention_one(q[sq], k[sk], v[sk], causal, scale, window, softcap, sinks)
        outs.append(out)
        lses.append(lse)
    if not outs:
        return q.new_zeros((*q.shape[:2], v.shape[-1])), q.new_zeros(q.shape[:2])
    return torch.cat(outs), torch.cat(lses)


def reference_attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size=(-1, -1),
    softcap: float | None = 0.0,
    sinks=None,
):
    """Float64 reference of the dense ``portattn.attention``: q [B, Sq, Hq, D], k [B, Sk, Hkv,
    D], v [B, Sk, Hkv, Dv] -> (out [B, Sq, Hq, Dv], lse [B, Hq, Sq])."""
    batch, seqlen_q = q.shape[:2]
    seqlen_k = k.shape[1]
    steps = torch.arange(batch + 1)
    out, lse = reference_varlen_attention(
        q.reshape(-1, *q.shape[2:]),
        k.reshape(-1, *k.shape[2:]),
        v.reshape(-1, *v.shape[2:]),
        steps * seqlen_q,
        steps * seqlen_k,
        causal=causal,
        softmax_scale=softmax_scale,
        window_size=window_size,
        softcap=softcap,
        sinks=sinks,
    )
    return out.view(*q.shape[:-1], v.shape[-1]), lse.view(batch, seqlen_q, -1).permute(0, 2, 1)
