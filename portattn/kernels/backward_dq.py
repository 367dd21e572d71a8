"""dQ kernel: one program per (query tile, query head), key tiles ascending, as in the forward;
its repair pass (design §3.2) one program per query tile over all heads. No atomics.

The launch is planned in ``backward_plan.py`` (``backward.BACKWARD_KERNELS`` binds this
kernel). As in ``backward.py``, Triton's cache key of a ``@triton.jit`` function includes the
line it starts on: moving a kernel changes compile keys (not machine code), which
``python -m ci.golden_dev fingerprints --update`` records again.
"""

from __future__ import annotations

import triton
import triton.language as tl

from portattn.kernels.addressing import (
    head_major_start,
    key_value_tiles,
    load_key_tile,
    query_tile,
    row_strides,
    seq_bounds,
    tile_index,
    value_columns,
)
from portattn.kernels.primitives import (
    KeyLoop,
    feature_mask,
    load_row_lse2,
    mask_scores,
    mma,
    mma_rounded,
    mma_visible,
    recompute_p,
    scores_log2,
    through_cap,
    visited_key_range,
)
from portattn.kernels.repair_checks import REPAIR_HEADS, head_is_bad, repair_head_block


@triton.jit
def _dq_key_tiles(
    b_dq, b_q, b_do, b_lse2, b_delta,
    src_k, src_v, stride_kt, stride_vt,
    o_q, o_d, m_d, o_dv, m_dv, seqlen_k, diag, scale_log2,
    n_lo, n_hi, loop, MASKED: tl.constexpr,
):
    """Accumulate key tiles [n_lo, n_hi) (ascending) into dQ, with the mask where ``MASKED``
    (``loop``: the ``KeyLoop`` of the forward's tiles; no pages). ``o_d`` / ``m_d``: K's
    columns, ``o_dv`` / ``m_dv``: V's."""
    BLOCK_M: tl.constexpr = loop.BLOCK_M
    BLOCK_N: tl.constexpr = loop.BLOCK_N
    for n_start in range(n_lo, n_hi, BLOCK_N):
        o_k = n_start + tl.arange(0, BLOCK_N)
        b_k = load_key_tile(src_k, n_start, 0, o_k, seqlen_k, stride_kt, o_d, m_d,
                            loop.TMA)  # [BLOCK_N, BLOCK_D]
        b_v = load_key_tile(src_v, n_start, 0, o_k, seqlen_k, stride_vt, o_dv, m_dv,
                            loop.TMA)  # [BLOCK_N, BLOCK_DV]
        b_qk = mma(b_q, tl.trans(b_k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), loop.INTERPRET)
        b_qk, p_scale = scores_log2(b_qk, scale_log2, loop.FEATURES)  # as in the dK/dV kernel
        b_cap = b_qk
        if MASKED:
            m_vis = feature_mask(o_q[:, None], o_k[None, :], seqlen_k, diag, loop.CAUSAL,
                                 loop.FEATURES)
            b_qk = mask_scores(b_qk, m_vis)
        b_p = recompute_p(b_qk, b_lse2[:, None], p_scale)  # [BLOCK_M, BLOCK_N]
        b_dp = mma(b_do, tl.trans(b_v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), loop.INTERPRET)
        b_ds = b_p * (b_dp - b_delta[:, None])  # [BLOCK_M, BLOCK_N]
        b_ds = through_cap(b_ds, b_cap, loop.FEATURES)
        if MASKED and loop.REPAIR:  # design §3.2
            b_dq = mma_visible(b_ds, b_k, b_dq, m_vis, loop.SPLIT_P, loop.INTERPRET,
                               loop.REPAIR)
        else:
            b_dq = mma_rounded(b_ds, b_k, b_dq, loop.SPLIT_P, loop.INTERPRET)  # [M, BLOCK_D]
    return b_dq


@triton.jit
def attn_bwd_dq_kernel(
    q, k, v, do, lse2, delta, dq,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_dqt, stride_dqh,
    batch, stride_hm, group, scale, scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT_P: tl.constexpr,
    INTERPRET: tl.constexpr,
    TMA: tl.constexpr,
    PADDED: tl.constexpr,
    FEATURES: tl.constexpr,
    REPAIR: tl.constexpr = 0,
    N_HEADS_Q: tl.constexpr = 0,
):
    """One program per (query tile of one sequence, query head). ``TMA``: K and V tiles are
    read through per-sequence tensor descriptors (``row_tiles``). ``PADDED``: lse2 and delta
    are in the preprocess kernel's padded layout (``head_major_start``). ``HEAD_DIM_V`` /
    ``BLOCK_DV``: v's and dO's head dim (``HEAD_DIM``: q's, k's and dQ's). ``REPAIR``: the
    repair pass (design §3.2, as the forward's: one program per query tile over the
    ``N_HEADS_Q`` query heads)."""
    stride_qt, stride_qh = row_strides(stride_qt, stride_qh, HEAD_DIM)
    stride_kt, stride_kh = row_strides(stride_kt, stride_kh, HEAD_DIM)
    stride_vt, stride_vh = row_strides(stride_vt, stride_vh, HEAD_DIM_V)
    stride_dot, stride_doh = row_strides(stride_dot, stride_doh, HEAD_DIM_V)
    stride_dqt, stride_dqh = row_strides(stride_dqt, stride_dqh, HEAD_DIM)
    if REPAIR:  # as the forward's (forward.attn_fwd_kernel): one program per query tile
        i_b, i_m = tile_index(batch, CAUSAL)
        bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
        bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
        m_start = i_m * BLOCK_M
        if m_start >= seqlen_q:
            return
        o_d = tl.arange(0, BLOCK_D)
        for h_first in range(0, N_HEADS_Q, REPAIR_HEADS):
            o_h, b_bad = repair_head_block(dq, stride_dqt, stride_dqh, bos_q, h_first, N_HEADS_Q,
                                           m_start, seqlen_q, o_d, o_d < HEAD_DIM, BLOCK_M)
            for h in range(h_first, tl.minimum(h_first + REPAIR_HEADS, N_HEADS_Q)):
                i_h = tl.program_id(1) + h  # program id 1 is 0: the head as a tensor
                if head_is_bad(o_h, b_bad, i_h):
                    dq_program(
                        q, k, v, do, lse2, delta, dq, stride_qt, stride_qh, stride_kt,
                        stride_kh, stride_vt, stride_vh, stride_dot, stride_doh, stride_dqt,
                        stride_dqh, stride_hm, scale, scale_log2,
                        i_b, i_h, i_h // group, bos_q, seqlen_q, bos_k, seqlen_k, m_start,
                        HEAD_DIM, BLOCK_D, HEAD_DIM_V, BLOCK_DV, BLOCK_M, BLOCK_N, CAUSAL,
                        SPLIT_P, INTERPRET, TMA, PADDED, FEATURES, REPAIR,
                    )
    else:
        i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start = query_tile(
            cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
        if m_start >= seqlen_q:
            return
        dq_program(
            q, k, v, do, lse2, delta, dq, stride_qt, stride_qh, stride_kt, stride_kh,
            stride_vt, stride_vh, stride_dot, stride_doh, stride_dqt, stride_dqh, stride_hm,
            scale, scale_log2,
            i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start,
            HEAD_DIM, BLOCK_D, HEAD_DIM_V, BLOCK_DV, BLOCK_M, BLOCK_N, CAUSAL,
            SPLIT_P, INTERPRET, TMA, PADDED, FEATURES, REPAIR,
        )


@triton.jit
def dq_program(
    q, k, v, do, lse2, delta, dq,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_dqt, stride_dqh, stride_hm, scale, scale_log2,
    i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SPLIT_P: tl.constexpr, INTERPRET: tl.constexpr, TMA: tl.constexpr, PADDED: tl.constexpr,
    FEATURES: tl.constexpr, REPAIR: tl.constexpr,
):
    """dQ of one query tile (rows from ``m_start``) of query head ``i_h`` (strides in
    elements, ``row_strides``'), written."""
    diag = seqlen_k - seqlen_q

    o_q = m_start + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    m_row = o_q < seqlen_q
    m_q = m_row[:, None] & m_d[None, :]
    o_dv, m_dv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)  # [BLOCK_DV]
    if HEAD_DIM_V == HEAD_DIM:
        m_qv = m_q
    else:
        m_qv = m_row[:, None] & m_dv[None, :]
    o_rows = (bos_q + o_q.to(tl.int64))[:, None]
    b_q = tl.load(q + o_rows * stride_qt + i_h.to(tl.int64) * stride_qh + o_d[None, :],
                  mask=m_q, other=0.0)  # [BLOCK_M, BLOCK_D]
    b_do = tl.load(do + o_rows * stride_dot + i_h.to(tl.int64) * stride_doh + o_dv[None, :],
                   mask=m_qv, other=0.0)  # [BLOCK_M, BLOCK_DV]
    # [BLOCK_M] head-major offsets
    o_hm = i_h.to(tl.int64) * stride_hm + head_major_start(bos_q, i_b, PADDED) + o_q
    b_lse2 = load_row_lse2(lse2 + o_hm, m_row)  # [BLOCK_M]
    b_delta = tl.load(delta + o_hm, mask=m_row, other=0.0)  # [BLOCK_M]
    src_k, src_v = key_value_tiles(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh, stride_vt,
                                   stride_vh, HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_DV, TMA,
                                   HEAD_DIM_V)
    b_dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_lo, n_full, n_hi = visited_key_range(m_start, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL,
                                           FEATURES)  # the forward's tiles
    b_dq = _dq_key_tiles(
        b_dq, b_q, b_do, b_lse2, b_delta, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dv, m_dv, seqlen_k, diag, scale_log2, n_lo, n_full,
        KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, TMA, FEATURES), False,
    )
    b_dq = _dq_key_tiles(
        b_dq, b_q, b_do, b_lse2, b_delta, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dv, m_dv, seqlen_k, diag, scale_log2, n_full, n_hi,
        KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, TMA, FEATURES, 0, REPAIR), True,
    )
    b_dq = b_dq * scale
    tl.store(dq + o_rows * stride_dqt + i_h.to(tl.int64) * stride_dqh + o_d[None, :],
             b_dq.to(dq.dtype.element_ty), mask=m_q)
