"""Backward kernels: delta preprocess, dK/dV per key tile, dQ per query tile. No atomics.

* ``delta = rowsum(O * dO) - dlse`` per (row, head): O is the forward output (varlen) or its
  float32 copy (fixed_order); folding ``dlse`` here makes ``lse`` differentiable.
* dK/dV: one program per (key tile of one sequence, kv head). It loops the query heads of its
  GQA group in ascending order and, for each, the query tiles in ascending order, so every
  dK/dV element is a fixed-order sum written once. Where the table says ``dkdv_passes`` > 1, dV
  and dK are summed by separate launches (and, with 4, halves of the head dim by separate
  programs).
* dQ: one program per (query tile, query head), key tiles ascending, as in the forward
  (``backward_dq.py``).

The launches are planned on the host in ``backward_plan.py`` (which kernel runs each stage,
with which tiles, constexprs and grid); this file keeps the kernels and binds them to the plan
(``BACKWARD_KERNELS``, :func:`plan_backward`, :func:`attn_bwd`). No line above the last kernel
may be added or removed: Triton's cache key of a ``@triton.jit`` function includes the line it
starts on, so a kernel that moves changes the compile key of every entry that runs it (though
not its machine code), and CI's ``python -m ci.golden_dev keycheck`` then fails until the keys
are recorded again (``--update``, which compiles every guarded entry under both Tritons: see
docs/golden.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portattn.kernels.addressing import (
    TMA_HOST,
    head_dim_chunk,
    head_major_start,
    head_rows_tiles,
    key_tile,
    load_head_rows,
    ragged_source,
    ragged_store,
    ragged_tile,
    row_strides,
    row_tiles,
    seq_bounds,
    tile_index,
    value_columns,
)
from portattn.kernels.backward_dq import attn_bwd_dq_kernel
from portattn.kernels.backward_plan import BackwardKernels, BackwardPlan, plan_backward_launches
from portattn.kernels.plan import VarlenProblem, run_launches
from portattn.kernels.primitives import (
    P_SCALE,
    feature_mask,
    load_lse2,
    load_row_lse2,
    mask_scores,
    mma,
    mma_rounded,
    mma_visible,
    query_range,
    recompute_p,
    scores_log2,
    through_cap,
    window_query_range,
)
from portattn.kernels.repair_checks import repair_check_rows, tile_is_finite


@triton.jit
def attn_bwd_preprocess_kernel(
    o, do, lse, dlse, lse2, delta,
    cu_seqlens_q,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_dlse_t, stride_dlse_h,
    batch, n_heads_q, stride_hm,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_DLSE: tl.constexpr,
    PADDED: tl.constexpr,
):
    """Per (row, head): ``delta`` and the forward's lse in log2 units (``load_lse2``), both
    written head-major ([Hq, stride_hm]) so the dK/dV loop reads each query tile's values as one
    contiguous vector (token-major, every thread gathered them 4 bytes at a time)."""
    stride_ot, stride_oh = row_strides(stride_ot, stride_oh, HEAD_DIM)
    stride_dot, stride_doh = row_strides(stride_dot, stride_doh, HEAD_DIM)
    i_b, i_m = tile_index(batch, False)
    i_h = tl.program_id(1)
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    m_start = i_m * BLOCK_M
    if m_start >= seqlen_q:
        return
    o_q = m_start + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_row = o_q < seqlen_q
    m_q = m_row[:, None] & (o_d < HEAD_DIM)[None, :]
    o_tok = bos_q + o_q.to(tl.int64)  # [BLOCK_M]
    o_rows = o_tok[:, None]
    b_o = tl.load(o + o_rows * stride_ot + i_h.to(tl.int64) * stride_oh + o_d[None, :],
                  mask=m_q, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
    b_do = tl.load(do + o_rows * stride_dot + i_h.to(tl.int64) * stride_doh + o_d[None, :],
                   mask=m_q, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
    b_delta = tl.sum(b_o * b_do, 1)  # [BLOCK_M]
    if HAS_DLSE:
        p_dlse = dlse + o_tok * stride_dlse_t + i_h * stride_dlse_h
        b_delta = b_delta - tl.load(p_dlse, mask=m_row, other=0.0)
    o_hm = i_h.to(tl.int64) * stride_hm + head_major_start(bos_q, i_b, PADDED) + o_q
    tl.store(delta + o_hm, b_delta, mask=m_row)
    tl.store(lse2 + o_hm, load_lse2(lse + o_tok * n_heads_q + i_h, m_row), mask=m_row)


@triton.jit
def attn_bwd_dkdv_kernel(
    q, k, v, do, lse2, delta, dk, dv,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
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
    WANT_DK: tl.constexpr,
    WANT_DV: tl.constexpr,
    D_CHUNKS: tl.constexpr,
    TMA: tl.constexpr,
    FEATURES: tl.constexpr,
    REPAIR: tl.constexpr = 0,
):
    """One program per (key tile of one sequence, kv head, head-dim chunk). It sums dK and/or
    dV (``WANT_DK`` / ``WANT_DV``) over ``BLOCK_D // D_CHUNKS`` columns of dK and
    ``BLOCK_DV // D_CHUNKS`` of dV (chunk ``program_id(2)``; ``HEAD_DIM_V``: v's, dO's and
    dV's head dim, ``HEAD_DIM``: q's and k's). The launcher runs this kernel once (both
    gradients) or twice (dV, then dK) as the table's ``dkdv_passes`` says; every launch
    recomputes ``K Q^T``, and each element is the same ordered sum whatever the split. The
    split is by launch, not by a branch on the program id: LLVM merged the two branches' loop
    exits, and the accumulator copies that merge put inside the in-flight wgmma made ptxas
    serialize every wgmma (C7515). ``REPAIR``: the repair pass (design §3.2): a program whose
    dK/dV tile the first pass wrote finite returns; the others recompute it, every product
    through ``mma_visible``."""
    stride_qt, stride_qh = row_strides(stride_qt, stride_qh, HEAD_DIM)
    stride_kt, stride_kh = row_strides(stride_kt, stride_kh, HEAD_DIM)
    stride_vt, stride_vh = row_strides(stride_vt, stride_vh, HEAD_DIM_V)
    stride_dot, stride_doh = row_strides(stride_dot, stride_doh, HEAD_DIM_V)
    stride_dkt, stride_dkh = row_strides(stride_dkt, stride_dkh, HEAD_DIM)
    stride_dvt, stride_dvh = row_strides(stride_dvt, stride_dvh, HEAD_DIM_V)
    i_b, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, n_start = key_tile(
        cu_seqlens_q, cu_seqlens_k, batch, BLOCK_N)
    if n_start >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q

    o_k = n_start + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    o_dv, m_dv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)  # [BLOCK_DV]
    m_krow = o_k < seqlen_k
    o_krows = (bos_k + o_k.to(tl.int64))[:, None]
    if REPAIR:  # before any load: most programs of a repair pass read their tiles and return
        o_rc, m_rc, _ = head_dim_chunk(o_d, m_d, HEAD_DIM, BLOCK_D, D_CHUNKS)
        o_rvc, m_rvc, _ = head_dim_chunk(o_dv, m_dv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)
        p_dk_rows = dk + o_krows * stride_dkt + i_hk.to(tl.int64) * stride_dkh
        p_dv_rows = dv + o_krows * stride_dvt + i_hk.to(tl.int64) * stride_dvh
        m_check = repair_check_rows(o_k, seqlen_k, BLOCK_N, False)  # no key row is forced
        if WANT_DK:
            finite = tile_is_finite(p_dk_rows + o_rc[None, :], m_check[:, None] & m_rc[None, :])
        else:
            finite = tile_is_finite(p_dv_rows + o_rvc[None, :],
                                    m_check[:, None] & m_rvc[None, :])
        if WANT_DK and WANT_DV:
            finite = finite & tile_is_finite(p_dv_rows + o_rvc[None, :],
                                             m_check[:, None] & m_rvc[None, :])
        if finite:
            return
    if TMA == TMA_HOST:
        # q, k, v, do, dk and dv are the launch's ragged descriptors (one program's columns:
        # D_CHUNKS is 1); lse2 and delta are read through the program's own, as below.
        tl.static_assert(D_CHUNKS == 1)
        b_k = ragged_tile(ragged_source(k, i_hk, bos_k, seqlen_k), n_start, 0)
        b_v = ragged_tile(ragged_source(v, i_hk, bos_k, seqlen_k), n_start, 0)
        desc_q, desc_do, desc_qc, desc_doc = None, None, None, None
        n_heads_q = tl.num_programs(1) * group
        hm_start = head_major_start(bos_q, i_b, True).to(tl.int32)
        hm_shape = [n_heads_q, hm_start + seqlen_q]
        desc_lse2 = tl.make_tensor_descriptor(lse2, hm_shape, [stride_hm, 1], [1, BLOCK_M])
        desc_delta = tl.make_tensor_descriptor(delta, hm_shape, [stride_hm, 1], [1, BLOCK_M])
    elif TMA:
        # K and V are read once per program; spelled out rather than through key_value_tiles,
        # which gives other (equally valid) machine code here than the one the golden
        # hashes were recorded with.
        p_k = k + bos_k * stride_kt + i_hk.to(tl.int64) * stride_kh
        p_v = v + bos_k * stride_vt + i_hk.to(tl.int64) * stride_vh
        b_k = row_tiles(p_k, seqlen_k, stride_kt, HEAD_DIM, BLOCK_N, BLOCK_D).load([n_start, 0])
        b_v = row_tiles(p_v, seqlen_k, stride_vt, HEAD_DIM_V, BLOCK_N, BLOCK_DV).load([n_start,
                                                                                      0])
        # Q and dO rows of the sequence, any head of the group: [seqlen_q, Hq, HEAD_DIM] (a
        # tile reads 0 past the sequence end). lse2 and delta of rows past the sequence end
        # read 0, not +inf: those rows' Q and dO tiles are 0, so what they add is exactly 0.
        n_heads_q = tl.num_programs(1) * group
        p_q_seq = q + bos_q * stride_qt
        p_do_seq = do + bos_q * stride_dot
        desc_q = head_rows_tiles(p_q_seq, seqlen_q, n_heads_q, stride_qt, stride_qh, HEAD_DIM,
                                 BLOCK_M, BLOCK_D)
        desc_do = head_rows_tiles(p_do_seq, seqlen_q, n_heads_q, stride_dot, stride_doh,
                                  HEAD_DIM_V, BLOCK_M, BLOCK_DV)
        if D_CHUNKS > 1:  # this program's columns of Q and dO
            desc_qc = head_rows_tiles(p_q_seq, seqlen_q, n_heads_q, stride_qt, stride_qh,
                                      HEAD_DIM, BLOCK_M, BLOCK_D // D_CHUNKS)
            desc_doc = head_rows_tiles(p_do_seq, seqlen_q, n_heads_q, stride_dot, stride_doh,
                                       HEAD_DIM_V, BLOCK_M, BLOCK_DV // D_CHUNKS)
        hm_start = head_major_start(bos_q, i_b, True).to(tl.int32)
        hm_shape = [n_heads_q, hm_start + seqlen_q]
        desc_lse2 = tl.make_tensor_descriptor(lse2, hm_shape, [stride_hm, 1], [1, BLOCK_M])
        desc_delta = tl.make_tensor_descriptor(delta, hm_shape, [stride_hm, 1], [1, BLOCK_M])
    else:
        desc_q, desc_do, desc_qc, desc_doc = None, None, None, None
        b_k = tl.load(k + o_krows * stride_kt + i_hk.to(tl.int64) * stride_kh + o_d[None, :],
                      mask=m_krow[:, None] & m_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        b_v = tl.load(v + o_krows * stride_vt + i_hk.to(tl.int64) * stride_vh + o_dv[None, :],
                      mask=m_krow[:, None] & m_dv[None, :], other=0.0)  # [BLOCK_N, BLOCK_DV]
    WINDOWED: tl.constexpr = FEATURES.WINDOW_LEFT >= 0 or FEATURES.WINDOW_RIGHT >= 0
    if WINDOWED:  # only the query tiles that see the key tile, each with the mask
        m_lo, m_hi = window_query_range(n_start, seqlen_q, diag, BLOCK_M, BLOCK_N, CAUSAL,
                                        FEATURES)
        m_full = m_hi
    else:
        m_lo, m_full = query_range(n_start, seqlen_q, diag, BLOCK_M, BLOCK_N, CAUSAL)
        m_hi = seqlen_q
    if TMA != TMA_HOST:  # dk and dv are tensors
        p_dk = dk + o_krows * stride_dkt + i_hk.to(tl.int64) * stride_dkh
        p_dv = dv + o_krows * stride_dvt + i_hk.to(tl.int64) * stride_dvh
    BLOCK_DC: tl.constexpr = BLOCK_D // D_CHUNKS  # dK columns of this program
    o_dc, m_dc, c_dc = head_dim_chunk(o_d, m_d, HEAD_DIM, BLOCK_D, D_CHUNKS)
    BLOCK_DVC: tl.constexpr = BLOCK_DV // D_CHUNKS  # dV columns of this program
    if HEAD_DIM_V == HEAD_DIM:
        o_dvc, m_dvc, c_dvc = o_dc, m_dc, c_dc
    else:
        o_dvc, m_dvc, c_dvc = head_dim_chunk(o_dv, m_dv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)

    # Sum over the query heads of the group (ascending) and, for each, its query tiles from
    # m_lo on (ascending), in transposed form: scores are [BLOCK_N, BLOCK_M], so P^T and dS^T
    # feed the products directly. One flat loop over (head, query tile), not a loop per head
    # and per masked/unmasked range: each loop copy holds its own pipeline buffers and
    # registers, which made every wgmma tiling spill. Only tiles below m_full (the causal
    # diagonal) take the mask.
    b_dk = tl.zeros([BLOCK_N, BLOCK_DC], tl.float32)
    b_dv = tl.zeros([BLOCK_N, BLOCK_DVC], tl.float32)
    n_tiles = tl.cdiv(m_hi - m_lo, BLOCK_M)
    for i_it in range(group * n_tiles):
        i_g = i_it // n_tiles
        m_start = m_lo + (i_it - i_g * n_tiles) * BLOCK_M
        i_h = (i_hk * group + i_g).to(tl.int64)
        o_q = m_start + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        m_row = o_q < seqlen_q
        o_rows = bos_q + o_q.to(tl.int64)
        i_h32 = i_h.to(tl.int32)
        if TMA == TMA_HOST:
            p_q, p_do = None, None
            b_q = ragged_tile(ragged_source(q, i_h32, bos_q, seqlen_q), m_start, 0)
        else:
            p_q = q + o_rows[:, None] * stride_qt + i_h * stride_qh
            p_do = do + o_rows[:, None] * stride_dot + i_h * stride_doh
            b_q = load_head_rows(desc_q, p_q, m_start, i_h32, 0, o_d, m_row, m_d, BLOCK_M,
                                 BLOCK_D, TMA)  # [BLOCK_M, BLOCK_D]
        if TMA:
            b_lse2 = desc_lse2.load([i_h32, hm_start + m_start]).reshape(BLOCK_M)
        else:
            o_hm = i_h * stride_hm + o_rows  # [BLOCK_M] head-major lse2 / delta offsets
            b_lse2 = load_row_lse2(lse2 + o_hm, m_row)  # [BLOCK_M]
        b_qkT = mma(b_k, tl.trans(b_q), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
        b_qkT, p_scale = scores_log2(b_qkT, scale_log2, FEATURES)
        b_capT = b_qkT  # before the mask: dS goes through the cap (``through_cap``)
        if CAUSAL or WINDOWED:  # noqa: SIM102 - a constexpr branch around a runtime one
            if m_start < m_full:
                b_qkT = mask_scores(b_qkT, feature_mask(o_q[None, :], o_k[:, None], seqlen_k,
                                                        diag, CAUSAL, FEATURES))
        b_pT = recompute_p(b_qkT, b_lse2[None, :], p_scale)  # [BLOCK_N, BLOCK_M]
        if REPAIR:  # every tile: a fully visible one passes mma_visible's plain product
            m_visT = feature_mask(o_q[None, :], o_k[:, None], seqlen_k, diag, CAUSAL,
                                  FEATURES)
        if TMA == TMA_HOST:
            b_do = ragged_tile(ragged_source(do, i_h32, bos_q, seqlen_q), m_start, 0)
        elif WANT_DK or BLOCK_DVC == BLOCK_DV:
            b_do = load_head_rows(desc_do, p_do, m_start, i_h32, 0, o_dv, m_row, m_dv, BLOCK_M,
                                  BLOCK_DV, TMA)  # [BLOCK_M, BLOCK_DV]
        if WANT_DV:
            if BLOCK_DVC == BLOCK_DV:
                b_doc = b_do
            else:
                b_doc = load_head_rows(desc_doc, p_do, m_start, i_h32, c_dvc, o_dvc, m_row,
                                       m_dvc, BLOCK_M, BLOCK_DVC, TMA)  # [BLOCK_M, BLOCK_DVC]
            # P <= 1 is scaled by an exact power of two before it is rounded for the product,
            # so small probabilities keep their bits in float16 (whose exponent range is
            # narrow); the scale is undone exactly on the float32 dV at the end.
            if REPAIR:
                b_dv = mma_visible(b_pT * P_SCALE, b_doc, b_dv, m_visT, SPLIT_P, INTERPRET,
                                   REPAIR)
            else:
                b_dv = mma_rounded(b_pT * P_SCALE, b_doc, b_dv, SPLIT_P, INTERPRET)
        if WANT_DK:
            if TMA:
                b_delta = desc_delta.load([i_h32, hm_start + m_start]).reshape(BLOCK_M)
            else:
                b_delta = tl.load(delta + o_hm, mask=m_row, other=0.0)
            b_dpT = mma(b_v, tl.trans(b_do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
            b_dsT = b_pT * (b_dpT - b_delta[None, :])  # [BLOCK_N, BLOCK_M]
            b_dsT = through_cap(b_dsT, b_capT, FEATURES)
            if BLOCK_DC == BLOCK_D:
                b_qc = b_q
            else:
                b_qc = load_head_rows(desc_qc, p_q, m_start, i_h32, c_dc, o_dc, m_row, m_dc,
                                      BLOCK_M, BLOCK_DC, TMA)  # [BLOCK_M, BLOCK_DC]
            if REPAIR:
                b_dk = mma_visible(b_dsT, b_qc, b_dk, m_visT, SPLIT_P, INTERPRET, REPAIR)
            else:
                b_dk = mma_rounded(b_dsT, b_qc, b_dk, SPLIT_P, INTERPRET)
    m_kc = m_krow[:, None] & m_dc[None, :]
    if HEAD_DIM_V == HEAD_DIM:
        m_kvc = m_kc
    else:
        m_kvc = m_krow[:, None] & m_dvc[None, :]
    if TMA == TMA_HOST:
        if WANT_DK:
            ragged_store(ragged_source(dk, i_hk, bos_k, seqlen_k), n_start, 0,
                         (b_dk * scale).to(dk.dtype))
        if WANT_DV:
            ragged_store(ragged_source(dv, i_hk, bos_k, seqlen_k), n_start, 0,
                         (b_dv * (1.0 / P_SCALE)).to(dv.dtype))
    elif TMA:
        # Stored through descriptors: the copy engine clips rows past the sequence end and
        # columns past the head dim, so no per-row store offsets stay live across the loop
        # (they spilled in the one-pass split-P program; perf-notes row 44).
        if WANT_DK:
            p_dk_seq = dk + bos_k * stride_dkt + i_hk.to(tl.int64) * stride_dkh
            row_tiles(p_dk_seq, seqlen_k, stride_dkt, HEAD_DIM, BLOCK_N, BLOCK_DC).store(
                [n_start, c_dc], (b_dk * scale).to(dk.dtype.element_ty))
        if WANT_DV:
            p_dv_seq = dv + bos_k * stride_dvt + i_hk.to(tl.int64) * stride_dvh
            row_tiles(p_dv_seq, seqlen_k, stride_dvt, HEAD_DIM_V, BLOCK_N, BLOCK_DVC).store(
                [n_start, c_dvc], (b_dv * (1.0 / P_SCALE)).to(dv.dtype.element_ty))
    else:
        if WANT_DK:
            tl.store(p_dk + o_dc[None, :], (b_dk * scale).to(p_dk.dtype.element_ty), mask=m_kc)
        if WANT_DV:
            tl.store(p_dv + o_dvc[None, :], (b_dv * (1.0 / P_SCALE)).to(p_dv.dtype.element_ty),
                     mask=m_kvc)


# The kernels end here; the launches are planned in ``backward_plan.py``.
BACKWARD_KERNELS = BackwardKernels(attn_bwd_preprocess_kernel, attn_bwd_dkdv_kernel,
                                   attn_bwd_dq_kernel)


def plan_backward(problem: VarlenProblem, do, q, k, v, o_for_delta, lse, dlse, cu_seqlens_q,
                  cu_seqlens_k) -> BackwardPlan:
    """The gradients, the scratch and the launches of this module's kernels
    (``backward_plan.plan_backward_launches``)."""
    return plan_backward_launches(BACKWARD_KERNELS, problem, do, q, k, v, o_for_delta, lse, dlse,
                                  cu_seqlens_q, cu_seqlens_k)


def attn_bwd(problem: VarlenProblem, do, q, k, v, o_for_delta, lse, dlse, cu_seqlens_q,
             cu_seqlens_k) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plan and launch the backward: returns (dq, dk, dv), see :func:`plan_backward`."""
    plan = plan_backward(problem, do, q, k, v, o_for_delta, lse, dlse, cu_seqlens_q,
                         cu_seqlens_k)
    run_launches(plan.launches, q.device)
    return plan.dq, plan.dk, plan.dv
