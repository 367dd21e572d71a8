"""Public attention functions and their autograd Function.

Layering: kernels (``portattn.kernels``) -> launchers (``attn_fwd`` / ``attn_bwd``) ->
``_VarlenAttention`` (autograd) -> ``varlen_attention`` / ``attention`` (checked public API).
"""

from __future__ import annotations

import torch

from portattn.configs import resolve_config
from portattn.kernels.backward import attn_bwd
from portattn.kernels.forward import attn_fwd
from portattn.validation import check_common, check_heads_and_dims, check_varlen


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    # Gradients arriving from autograd may be expanded (stride 0) views; the kernels read any
    # token/head strides but need the head dim contiguous.
    return x if x.stride(-1) == 1 else x.contiguous()


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                softmax_scale, kernel):
        cfg = resolve_config(q.device, kernel, q.shape[-1], q.dtype)
        split_p = kernel == "fixed_order"
        needs_grad = any(ctx.needs_input_grad[:3])
        out, lse, out32 = attn_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, softmax_scale,
            split_p=split_p, store_o32=split_p and needs_grad, cfg=cfg,
        )
        if needs_grad:
            # fixed_order computes the backward's row term from the float32 output.
            o_for_delta = out32 if split_p else out
            ctx.save_for_backward(q, k, v, o_for_delta, lse, cu_seqlens_q, cu_seqlens_k)
            ctx.meta = (max_seqlen_q, max_seqlen_k, causal, softmax_scale, split_p, cfg)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o_for_delta, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        max_seqlen_q, max_seqlen_k, causal, softmax_scale, split_p, cfg = ctx.meta
        if dout is None:  # only lse was used downstream
            dout = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dq, dk, dv = attn_bwd(
            _last_dim_contiguous(dout), q, k, v, o_for_delta, lse,
            None if dlse is None else _last_dim_contiguous(dlse.float()),
            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
            split_p=split_p, cfg=cfg,
        )
        return dq, dk, dv, None, None, None, None, None, None, None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    kernel: str = "varlen",
):
    """Attention over a packed batch of variable-length sequences (flash-attn varlen layout).

    Args:
        q: [total_q, Hq, D] float16 or bfloat16, token-major, ``stride(-1) == 1``.
        k: [total_k, Hkv, D], same dtype and device; ``Hq % Hkv == 0`` (GQA/MQA: query head
            ``h`` reads kv head ``h // (Hq // Hkv)``).
        v: [total_k, Hkv, D].
        cu_seqlens_q: int32 [B + 1], ``cu[0] == 0``, non-decreasing, ``cu[-1] == total_q``.
            Sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
        cu_seqlens_k: int32 [B + 1], likewise for keys/values (same B).
        max_seqlen_q, max_seqlen_k: optional ints, at least the longest sequence; derived from
            cu_seqlens when None.
        causal: bottom-right aligned mask. In a sequence with ``Sq`` queries and ``Sk`` keys,
            query row ``i`` sees keys ``j <= i + Sk - Sq``.
        softmax_scale: finite float > 0; default ``1 / sqrt(D)``.
        return_lse: also return ``lse``.
        kernel: ``"varlen"`` (fast: P and dS rounded to the input dtype for their products) or
            ``"fixed_order"`` (strict: split-P second product, float32 O for the backward).

    Returns:
        out [total_q, Hq, D] in q's dtype; with ``return_lse``, ``(out, lse)`` where lse is
        float32 [total_q, Hq], natural log of the sum of exp of the scaled scores, and is
        differentiable. Rows that see no key (``Sk == 0``, or causal with ``Sq > Sk``) get out 0,
        lse ``-inf`` and zero gradients.

    Head dims: 32, 64, 96, 128, 256. Token offsets are computed in int64, so packs with more
    than 2**31 elements are supported. Bad input raises ValueError / TypeError before launch.
    """
    softmax_scale = check_common(q, k, v, causal, softmax_scale, return_lse, kernel)
    shape = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out, lse = _VarlenAttention.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, shape.max_seqlen_q, shape.max_seqlen_k, causal,
        softmax_scale, kernel,
    )
    return (out, lse) if return_lse else out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    kernel: str = "varlen",
):
    """Dense attention in BSHD layout, computed on the varlen path (same bits as
    ``varlen_attention`` on equal-length sequences).

    Args:
        q: [B, Sq, Hq, D] float16 or bfloat16, ``stride(-1) == 1``.
        k, v: [B, Sk, Hkv, D], ``Hq % Hkv == 0``.
        causal, softmax_scale, kernel: as in :func:`varlen_attention` (bottom-right causal:
            row ``i`` sees keys ``j <= i + Sk - Sq``).
        return_lse: also return lse, float32 [B, Hq, Sq] (flash-attn's and FlexAttention's
            layout; a view of the varlen ``[B * Sq, Hq]`` buffer, no copy).

    Returns:
        out [B, Sq, Hq, D], or ``(out, lse)``.

    Contiguous input (more generally, input whose batch and sequence dims merge into one token
    dim) is viewed, never copied; other layouts are copied once into that shape.
    """
    softmax_scale = check_common(q, k, v, causal, softmax_scale, return_lse, kernel)
    check_heads_and_dims(q, k, v, token_dims=2)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    batch, seqlen_q, n_heads_q, head_dim = q.shape
    seqlen_k = k.shape[1]
    steps = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    out, lse = _VarlenAttention.apply(
        q.reshape(batch * seqlen_q, n_heads_q, head_dim),
        k.reshape(batch * seqlen_k, k.shape[2], head_dim),
        v.reshape(batch * seqlen_k, v.shape[2], head_dim),
        steps * seqlen_q,
        steps * seqlen_k,
        seqlen_q,
        seqlen_k,
        causal,
        softmax_scale,
        kernel,
    )
    out = out.view(batch, seqlen_q, n_heads_q, head_dim)
    if not return_lse:
        return out
    return out, lse.view(batch, seqlen_q, n_heads_q).permute(0, 2, 1)
