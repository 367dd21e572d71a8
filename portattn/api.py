"""Public attention functions: argument checks, then the custom ops of :mod:`portattn.ops`.

Layering: kernels (``portattn.kernels``) -> launchers (``attn_fwd`` / ``attn_bwd``) -> custom
ops ``torch.ops.portattn.varlen_fwd`` / ``varlen_bwd`` with their autograd formula
(:mod:`portattn.ops`) -> ``varlen_attention`` / ``attention`` (checked public API).

Validation runs here, before the op. In eager mode every check runs, including the ones that
read ``cu_seqlens`` on the host; when both ``max_seqlen`` are given those run inside the forward
op (``check_values=True``), right before its launch, so the GPU does not idle through the op's
dispatch after their host copy. While ``torch.compile`` traces
(``torch.compiler.is_compiling()``), the host-value checks are skipped (they would break the
graph) and ``max_seqlen_q`` / ``max_seqlen_k`` must be given; all shape, dtype, device and
stride checks still run.
"""

from __future__ import annotations

import torch

from portattn.autocast import autocast_inputs
from portattn.dense_layout import FoldViews, dense_layout
from portattn.forward_entry import kept_value, run_forward, run_kept_forward
from portattn.options import capturing, checked_options, needs_grad
from portattn.validation import (
    check_block_table_meta,
    check_paged_values,
    check_varlen,
    check_varlen_without_values,
)


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
    block_table: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
):
    """Attention over a packed batch of variable-length sequences (flash-attn varlen layout).

    Args:
        q: [total_q, Hq, D] float16 or bfloat16, token-major, ``stride(-1) == 1``.
        k: [total_k, Hkv, D], same dtype and device; ``Hq % Hkv == 0`` (GQA/MQA: query head
            ``h`` reads kv head ``h // (Hq // Hkv)``).
        v: [total_k, Hkv, Dv]: Dv is D, or a value head dim of its own (MLA: D 192, Dv 128);
            k and v have the same token and head counts.
        cu_seqlens_q: int32 [B + 1], contiguous, ``cu[0] == 0``, non-decreasing,
            ``cu[-1] == total_q``. Sequence ``b`` owns query rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
        cu_seqlens_k: int32 [B + 1], likewise for keys/values (same B).
        max_seqlen_q, max_seqlen_k: optional ints, at least the longest sequence; derived from
            cu_seqlens when None. At most ``2**31 - 1``, and the launch grid they imply,
            ``ceil(max_seqlen / 16) * B`` programs, at most ``2**31 - 1`` too.
        causal: bottom-right aligned mask (a bool; numpy bools are accepted). In a sequence
            with ``Sq`` queries and ``Sk`` keys, query row ``i`` sees keys ``j <= i + Sk - Sq``.
        softmax_scale: a float from about 1.18e-38 (the smallest normal float32) to 2**16 =
            65536 (the kernels' float32 scores ``softmax_scale * log2(e) * q.k`` stay far from
            overflow; models use about ``1 / sqrt(D)``), ValueError outside; default
            ``1 / sqrt(D)``.
        return_lse: also return ``lse`` (a bool; numpy bools are accepted).
        kernel: ``"varlen"`` (fast: P and dS rounded to the input dtype for their products) or
            ``"fixed_order"`` (strict: split-P second product, float32 O for the backward).
        block_table: int32 [B, pages_per_seq] or None. With it, k and v are paged KV caches
            [num_pages, page_size, Hkv, D] (page_size a power of two from 16 to 256), key
            ``j`` of sequence ``b`` lives at ``k[block_table[b, j // page_size], j %
            page_size]``, and ``cu_seqlens_k`` counts each sequence's keys (flash-attn's
            convention; ``cu_seqlens_k[-1]`` is their total, not a row count of k). Only the
            pages a sequence uses are read; the rest of its row may hold anything. A row's
            out and lse are the bytes of the same row computed from packed k/v (design §3).
            Inference only: q, k, v must not require grad (ValueError).
        window_size: ``(left, right)`` sliding window, flash-attn's convention: query row
            ``i`` sees keys ``j`` with ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``
            (-1: unbounded on that side; ints up to 2**30 - 1; as in flash-attn also a 1-D
            integer tensor of two elements or 0-d integer tensors, read to the host: a
            device-to-host copy for GPU tensors). With ``causal`` the right side
            is 0 whatever is given; ``right == 0`` means causal. Key tiles that no row of a
            query tile sees are skipped (cost O(T * W)). Each distinct window compiles its own
            kernels (the sizes are compile-time constants, as a model has one or two).
        softcap: None or 0 (off), or a cap ``c`` from 2**-16 to 2**10 = 1024: the scores
            become ``c * tanh(softmax_scale * q.k / c)`` before the mask and the softmax
            (Gemma 2's softcapping, flash-attn's ``softcap``), forward and backward. The
            kernels' float32 tanh has an absolute error of about 2**-24, a score error of
            about ``c * 2**-23`` (1.2e-4 at 1024; Gemma 2 uses 50): larger caps are a
            ValueError. Each distinct cap compiles its own kernels.
        sinks: None, or [Hq] (float32, float16 or bfloat16, computed in float32): attention
            sinks (gpt-oss), one logit per query head added to every row's softmax
            denominator, with no value: ``p_j = exp(s_j - lse)`` with
            ``lse = log(sum_j exp(s_j) + exp(sinks[h]))``. The returned lse includes the sink.
            Differentiable (``d sinks[h] = -sum_rows p_sink * (rowsum(out * dout) - dlse)``,
            summed over the whole batch: the same bits run to run, not across packings). A row
            that sees no key gets out 0 and lse ``sinks[h]`` (to float32 rounding); ``-inf``
            is no sink. Each value must be ``-inf`` or finite with ``|sink| <= 2**16``
            (ValueError otherwise: the kernels fold it into the softmax in float32), checked
            from a host copy made once per tensor and version (a GPU tensor's copy waits for
            the GPU; a parameter is copied again after each in-place update), not while
            ``torch.compile`` traces or a CUDA graph is captured.
    Returns:
        out [total_q, Hq, Dv] in q's dtype; with ``return_lse``, ``(out, lse)`` where lse is
        float32 [total_q, Hq], natural log of the sum of exp of the scaled scores, and is
        differentiable. Rows that see no key (``Sk == 0``, or causal with ``Sq > Sk``) get out 0,
        lse ``-inf`` and zero gradients.

    Head dims: 32, 48, 64, 80, 96, 112, 128, 256; Dv any of these too, or (D, Dv) = (192, 128)
    (``configs.VALUE_HEAD_DIM_PAIRS``). Token offsets are computed in int64, so packs
    with more than 2**31 elements are supported. Bad input raises ValueError / TypeError before
    launch.

    Under ``torch.compile`` (no graph break; the kernels run as the custom ops
    ``portattn::varlen_fwd`` / ``varlen_bwd``, same bytes as eager): ``max_seqlen_q`` and
    ``max_seqlen_k`` must be given (ValueError otherwise), and the checks of the *values* of
    ``cu_seqlens`` and of ``max_seqlen`` against them are skipped, since they need a host copy.
    The caller then guarantees them, as with flash-attn; shape, dtype, device and stride
    checks still run. The same holds while a CUDA graph is captured (``torch.cuda.graph``, as
    rollout engines capture their decode step): no host copy is made, and a replay reads
    whatever ``cu_seqlens`` hold then, within the captured ``max_seqlen`` bounds.
    """
    q, k, v = autocast_inputs(q, k, v)  # float32 under autocast -> its dtype, as SDPA
    paged = block_table is not None
    # Read in this frame: Dynamo may compile a helper's frame alone while this one runs eagerly.
    compiling = torch.compiler.is_compiling()
    options, kept = checked_options(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        return_lse=return_lse,
        kernel=kernel,
        window_size=window_size,
        softcap=softcap,
        sinks=sinks,
        token_dims=1,
        kv_token_dims=2 if paged else None,
        compiling=compiling,
    )
    return_lse = bool(return_lse)  # checked: a bool or numpy bool
    no_host = compiling or capturing(q)  # no host copy: traced, or captured in a CUDA graph
    if paged:
        max_seqlen_q, max_seqlen_k, check_values = _check_paged(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, no_host
        )
    elif no_host or (max_seqlen_q is not None and max_seqlen_k is not None):
        max_seqlen_q, max_seqlen_k = check_varlen_without_values(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
        )
        # Eager: the value checks run in the op, right before its launch (same checks, same
        # errors, still before any launch), as the GPU idles from their host copy on.
        check_values = not no_host
    else:  # a max_seqlen to derive: the values are needed here
        shape = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        max_seqlen_q, max_seqlen_k = shape.max_seqlen_q, shape.max_seqlen_k
        check_values = False
    if kept is None or no_host or needs_grad(q, k, v):
        out, lse = run_forward(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            options,
            check_values=check_values,
            block_table=block_table,
            compiling=compiling,
            lse_needed=return_lse,
        )
    else:  # eager, a kept signature: its launches kept with it (forward_entry)
        inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table)
        out, lse = run_kept_forward(
            inputs, max_seqlen_q, max_seqlen_k, options, return_lse, kept, check_values
        )
    return (out, lse) if return_lse else out


def _check_paged(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, traced: bool
):
    """The checks of a paged call (after ``check_options``): returns (max_seqlen_q,
    max_seqlen_k, whether the op checks the values before its launch)."""
    if needs_grad(q, k, v):
        raise ValueError(
            "varlen_attention with a block_table (paged K/V) is inference-only: q, k and v "
            "must not require grad (use torch.no_grad(), or detach them)"
        )
    if traced or (max_seqlen_q is not None and max_seqlen_k is not None):
        # The cu_seqlens meta checks; the k rows are not cu_seqlens_k's total when paged.
        max_seqlen_q, max_seqlen_k = check_varlen_without_values(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
        )
        check_block_table_meta(block_table, k, cu_seqlens_q.shape[0] - 1, q.device)
        return max_seqlen_q, max_seqlen_k, not traced
    check_varlen_without_values(q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0)  # the meta checks
    page_size = check_block_table_meta(block_table, k, cu_seqlens_q.shape[0] - 1, q.device)
    shape = check_paged_values(
        cu_seqlens_q,
        cu_seqlens_k,
        block_table,
        q.shape[0],
        k.shape[0],
        page_size,
        max_seqlen_q,
        max_seqlen_k,
    )
    return shape.max_seqlen_q, shape.max_seqlen_k, False


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    kernel: str = "varlen",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
):
    """Dense attention in BSHD layout, computed on the varlen path (same bits as
    ``varlen_attention`` on equal-length sequences).

    Args:
        q: [B, Sq, Hq, D] float16 or bfloat16, ``stride(-1) == 1``.
        k, v: [B, Sk, Hkv, D] and [B, Sk, Hkv, Dv], ``Hq % Hkv == 0`` (Dv: as in
            :func:`varlen_attention`).
        causal, softmax_scale, kernel, window_size, softcap, sinks: as in
            :func:`varlen_attention`
            (bottom-right causal: row ``i`` sees keys ``j <= i + Sk - Sq``).
        return_lse: also return lse, float32 [B, Hq, Sq] (flash-attn's and FlexAttention's
            layout; a view of the varlen ``[B * Sq, Hq]`` buffer, no copy).

    Returns:
        out [B, Sq, Hq, Dv], or ``(out, lse)``.

    Input whose batch and sequence dims merge into one token dim (contiguous BSHD) is viewed,
    never copied; so is input whose batch and head dims merge (``[B, H, S, D]`` in memory:
    transformers' KV cache, a decode step's q), run as one sequence of ``B * Hq`` heads, with
    the same bits (:mod:`portattn.dense_layout`). Otherwise the tensors that fit neither are
    copied once, into the fold that copies least; out is then a ``[B, Sq, Hq, Dv]`` view of
    ``[Sq, B, Hq, Dv]`` memory where the heads fold ran (contiguous when ``Sq == 1``). Needs no
    host values: under ``torch.compile`` every check runs and nothing is required beyond eager.
    """
    q, k, v = autocast_inputs(q, k, v)  # float32 under autocast -> its dtype, as SDPA
    compiling = torch.compiler.is_compiling()  # in this frame (see varlen_attention)
    options, kept = checked_options(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        return_lse=return_lse,
        kernel=kernel,
        window_size=window_size,
        softcap=softcap,
        sinks=sinks,
        token_dims=2,
        compiling=compiling,
    )
    return_lse = bool(return_lse)  # checked: a bool or numpy bool
    if k.shape[0] != q.shape[0]:
        raise ValueError(
            f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}"
        )
    no_host = compiling or capturing(q)
    if kept is None or no_host or needs_grad(q, k, v):
        layout = dense_layout(q, k, v, options.sinks)
        cu_seqlens_q, cu_seqlens_k = layout.cu_seqlens(q.device, no_host)
        out, lse = run_forward(
            layout.packed(q),
            layout.packed(k),
            layout.packed(v),
            cu_seqlens_q,
            cu_seqlens_k,
            layout.seqlen_q,
            layout.seqlen_k,
            options,
            compiling=compiling,
            lse_needed=return_lse,
        )
        out = layout.output(out, q.shape[2])
    else:  # eager, no grad, a kept signature: its fold's views and launches kept with it
        fold = lambda: FoldViews.record(dense_layout(q, k, v, None), q, k, v)  # noqa: E731
        views = kept_value(kept, "fold", fold)
        layout = views.layout
        inputs = (*views.packed(q, k, v), *layout.cu_seqlens(q.device, False), None)
        out, lse = run_kept_forward(
            inputs, layout.seqlen_q, layout.seqlen_k, options, return_lse, kept
        )
        out = views.output(out)
    if not return_lse:
        return out
    return out, layout.lse(lse, q.shape[2])
