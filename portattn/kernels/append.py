"""The append of ``flash_attn_with_kvcache``: the new key and value rows copied into their
cache slots, k and v in one launch (:func:`plan_append`).

One program per new row (sequence ``b``, row ``i``), all its kv heads: position
``cache_seqlens[b] + i`` (or ``start + i`` for an int ``cache_seqlens``), in a paged cache slot
``pos % PAGE_SIZE`` of page ``block_table[b, pos // PAGE_SIZE]``, in a dense cache row ``pos`` of
cache row ``cache_batch_idx[b]`` (or ``b``). A copy: the cache gets the new rows' bytes. It
replaces two ``index_put_`` and the index tensors they need (aten ops, each costing a GPU host
more than a launch through ``kernels.launcher``), and is the same launch eagerly and in a CUDA
graph. The callers have checked that no two rows name one slot and that the new rows and the
caches share no memory (``kvcache_checks``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portattn.kernels.plan import KernelLaunch, next_pow2


@triton.jit
def append_kernel(
    k, v, k_cache, v_cache, cache_seqlens, rows,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_kcp, stride_kct, stride_kch, stride_kcd,
    stride_vcp, stride_vct, stride_vch, stride_vcd,
    stride_rows, stride_lens, start, n_new, n_heads,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    LENGTHS: tl.constexpr,
    ROWS: tl.constexpr,
):
    """k [B, S_new, Hkv, D], v [B, S_new, Hkv, Dv] (any strides) into k_cache, v_cache (paged
    [num_pages, PAGE_SIZE, Hkv, D], or dense [B_cache, S_cache, Hkv, D] with ``PAGE_SIZE`` 0).
    ``LENGTHS``: the positions start at ``cache_seqlens[b]`` (int32 [B], element stride
    ``stride_lens``), else at ``start``. ``rows``: the block table (paged; ``stride_rows`` its
    row stride) or, with ``ROWS``, a dense cache's rows (``cache_batch_idx``, element stride
    ``stride_rows``)."""
    i = tl.program_id(0)
    i_b = i // n_new
    i_s = i % n_new
    i_b64 = i_b.to(tl.int64)
    if LENGTHS:
        pos = tl.load(cache_seqlens + i_b * stride_lens).to(tl.int64) + i_s
    else:
        pos = i_s.to(tl.int64) + start  # start: an int argument (1 is a constexpr)
    if PAGE_SIZE > 0:
        p_page = rows + i_b64 * stride_rows + pos // PAGE_SIZE
        i_row = tl.load(p_page).to(tl.int64)
        slot = pos % PAGE_SIZE
    else:
        if ROWS:
            i_row = tl.load(rows + i_b * stride_rows).to(tl.int64)
        else:
            i_row = i_b64
        slot = pos
    copy_heads(k + i_b64 * stride_kb + i_s * stride_ks, stride_kh, stride_kd,
               k_cache + i_row * stride_kcp + slot * stride_kct, stride_kch, stride_kcd,
               n_heads, HEAD_DIM, BLOCK_H, BLOCK_D)
    copy_heads(v + i_b64 * stride_vb + i_s * stride_vs, stride_vh, stride_vd,
               v_cache + i_row * stride_vcp + slot * stride_vct, stride_vch, stride_vcd,
               n_heads, HEAD_DIM_V, BLOCK_H, BLOCK_DV)


@triton.jit
def copy_heads(src, stride_sh, stride_sd, dst, stride_dh, stride_dd, n_heads,
               HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Copy one token's ``n_heads`` x ``HEAD_DIM`` elements from ``src`` to ``dst`` (each at
    its token's first element, with its head and column strides)."""
    o_h = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    o_d = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    mask = (o_h < n_heads) & (o_d < HEAD_DIM)
    b_x = tl.load(src + o_h * stride_sh + o_d * stride_sd, mask=mask)
    tl.store(dst + o_h * stride_dh + o_d * stride_dd, b_x, mask=mask)


def plan_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor | int,
    block_table: torch.Tensor | None,
    batch_idx: torch.Tensor | None,
) -> KernelLaunch | None:
    """The launch appending ``k``, ``v`` [B, S_new, Hkv, D(v)] at ``cache_seqlens`` (int32 [B]
    or an int for all) into paged caches through ``block_table`` (int32 [B, pages_per_seq]), or
    dense ones at rows ``batch_idx`` (int32 [B]; None: rows 0..B-1). None when there is nothing
    to write."""
    batch, new, n_heads = k.shape[:3]
    if batch == 0 or new == 0:
        return None
    lengths = isinstance(cache_seqlens, torch.Tensor)
    paged = block_table is not None
    rows = block_table if paged else batch_idx
    args = (
        k, v, k_cache, v_cache,
        cache_seqlens if lengths else k_cache,  # not read without LENGTHS
        k_cache if rows is None else rows,  # not read without a block table or ROWS
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        0 if rows is None else rows.stride(0),
        cache_seqlens.stride(0) if lengths else 0,
        0 if lengths else cache_seqlens, new, n_heads,
    )
    params = dict(
        HEAD_DIM=k.shape[-1],
        HEAD_DIM_V=v.shape[-1],
        BLOCK_H=next_pow2(n_heads),
        BLOCK_D=next_pow2(k.shape[-1]),
        BLOCK_DV=next_pow2(v.shape[-1]),
        PAGE_SIZE=k_cache.shape[1] if paged else 0,
        LENGTHS=lengths,
        ROWS=rows is not None and not paged,
        num_warps=4,
    )
    return KernelLaunch("append", append_kernel, (batch * new,), args, params)
