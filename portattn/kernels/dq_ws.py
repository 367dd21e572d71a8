"""Hopper dQ kernel in Gluon: warp-specialised, same arithmetic as ``attn_bwd_dq_kernel``.

The structure of the forward's (``forward_ws.py``) with the dQ kernel's products:

* one producer warp copies both groups' Q and dO tiles once, then K and V tiles into a ring of
  ``STAGES`` slots (TMA, per-sequence descriptors that read 0 past the sequence end);
* two consumer warp groups of 4 warps each own 64 query rows of the program's ``BLOCK_M`` =
  128. Per key tile each issues ``Q K^T`` and ``dO V^T`` together, recomputes P while
  ``dO V^T`` runs, computes dS, issues ``dS K`` into dQ and releases the slot (an mbarrier
  both groups arrive on) once it is done. The groups run unsynchronised, so one's elementwise
  work also runs under the other's products.

Bits. Every element is the Triton kernel's: the shared ``recompute_p``, ``visible_mask``,
``mask_scores``, ``key_range``, ``query_tile`` and ``split_p_lo``, lse2 and delta read as
``load_row_lse2`` and the Triton kernel read them, the same products over the same key tiles
in the same order. Both groups visit the key tiles of the whole 128-row tile, as the Triton
kernel does; a tile no row of a group sees adds exact zeros. Key tiles from ``n_full`` on are
masked, in a loop of their own (one loop with a branch spilled in the dK/dV kernel, perf-notes
row 53). The table selects this kernel (``KernelConfig.dq_ws``); the launcher falls back to
the Triton kernel where descriptors cannot be used, and Gluon has no CPU interpreter.
"""

from __future__ import annotations

import triton

if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 6):
    raise ImportError("the warp-specialised dQ kernel is written for Gluon as of Triton 3.6")

from triton.experimental import gluon  # noqa: E402 - after the version gate
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from portattn.configs import Tiles
from portattn.kernels.primitives import (
    head_major_start,
    key_range,
    load_row_lse2,
    mask_scores,
    query_tile,
    recompute_p,
    visible_mask,
)
from portattn.kernels.ws_common import (
    CONSUMER_REGS,
    GROUP_WARPS,
    PRODUCER_REGS,
    barriers,
    issue_rounded_mma,
    kv_rings,
    row_ring,
    skip_ring,
    tma_load,
    wait_filled,
    wait_free,
)

GROUP_ROWS = gl.constexpr(64)  # query rows per consumer warp group (one wgmma M)


def dq_ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for: two groups of 64 query rows, 8 warps in
    all, 64-key tiles, a ring of at least two slots, head dims 64 and 128."""
    return (
        tiles.block_m == 2 * GROUP_ROWS.value
        and tiles.num_warps == 2 * GROUP_WARPS.value
        and tiles.block_n == 64
        and tiles.num_stages >= 2
        and head_dim in (64, 128)
    )


@gluon.jit
def _key_tile(i_tile, b_dq, q_tile, do_tile, rows, ring, seqlen_k, diag, scale_log2,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, MASKED: gl.constexpr,
              CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, STAGES: gl.constexpr,
              s_layout: gl.constexpr, op_layout: gl.constexpr):
    """Key tile ``i_tile`` (ring slot ``i_tile % STAGES``) into the group's dQ; ``MASKED``:
    the tile needs the mask (past the causal bound or the sequence end; without ``CAUSAL``
    only the sequence end)."""
    k_ring, v_ring, kv_bars, free_bars = ring
    o_q, b_lse2, b_delta = rows
    slot = i_tile % STAGES
    wait_filled(kv_bars, i_tile, STAGES)
    k_tile = k_ring.index(slot)  # [BLOCK_N, HEAD_DIM]
    v_tile = v_ring.index(slot)
    b_zero = gl.zeros([GROUP_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    b_s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), b_zero, use_acc=False,
                        is_async=True)  # [64, BLOCK_N]
    b_dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), b_zero, use_acc=False,
                         is_async=True)  # [64, BLOCK_N]
    b_s = warpgroup_mma_wait(1, deps=(b_s,))  # Q K^T done, dO V^T may run on
    if MASKED:
        o_k = i_tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        b_s = mask_scores(b_s, visible_mask(o_q[:, None], o_k[None, :], seqlen_k, diag, CAUSAL))
    b_p = recompute_p(b_s, b_lse2[:, None], scale_log2)  # [64, BLOCK_N]
    b_dp = warpgroup_mma_wait(0, deps=(b_dp,))
    b_ds = b_p * (b_dp - b_delta[:, None])  # [64, BLOCK_N]
    b_dq = issue_rounded_mma(b_ds, k_tile, b_dq, SPLIT_P, op_layout)
    b_dq = warpgroup_mma_wait(0, deps=(b_dq,))
    mbarrier.arrive(free_bars.index(slot), count=1)  # done with K, V of this tile
    return b_dq


@gluon.jit
def _consume(GROUP: gl.constexpr, shared, outputs, scalars, HEAD_DIM: gl.constexpr,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
             PADDED: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warp group ``GROUP``: query rows [m_start + 64 GROUP, + 64) of the program."""
    q_smem, do_smem, k_ring, v_ring, q_bars, kv_bars, free_bars = shared
    dq, lse2, delta = outputs
    (i_b, i_h, bos_q, seqlen_q, seqlen_k, diag, m_tile, t_full, n_tiles, stride_hm,
     stride_dqt, stride_dqh, scale, scale_log2) = scalars

    # Scores [64, BLOCK_N] and dQ [64, HEAD_DIM] in wgmma accumulator layouts; dS is the
    # register A operand of dS K.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    m_start = m_tile + GROUP * GROUP_ROWS
    if m_start >= seqlen_q:
        # Every row of this group past the sequence end: nothing to do. It still waits for the
        # copy of its Q and dO tiles (no copy into the CTA's shared memory may be in flight
        # when it exits) and takes part in the ring.
        mbarrier.wait(q_bars.index(GROUP), 0)
        skip_ring(kv_bars, free_bars, n_tiles, STAGES)
        return
    o_q = m_start + gl.arange(0, GROUP_ROWS, layout=row_layout)
    m_row = o_q < seqlen_q
    # lse2 and delta of the group's rows, as the Triton kernel reads them: rows past the
    # sequence end get lse2 +inf (P = 0) and delta 0.
    o_hm = i_h.to(gl.int64) * stride_hm + head_major_start(bos_q, i_b, PADDED) + o_q
    b_lse2 = load_row_lse2(lse2 + o_hm, m_row)  # [64]
    b_delta = gl.load(delta + o_hm, mask=m_row, other=0.0)  # [64]
    rows = (o_q, b_lse2, b_delta)
    ring = (k_ring, v_ring, kv_bars, free_bars)
    q_tile = q_smem.index(GROUP)  # [64, HEAD_DIM]
    do_tile = do_smem.index(GROUP)

    b_dq = gl.zeros([GROUP_ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
    mbarrier.wait(q_bars.index(GROUP), 0)
    for i_tile in range(0, t_full):
        b_dq = _key_tile(i_tile, b_dq, q_tile, do_tile, rows, ring, seqlen_k, diag, scale_log2,
                         HEAD_DIM, BLOCK_N, False, CAUSAL, SPLIT_P, STAGES, s_layout,
                         op_layout)
    for i_tile in range(t_full, n_tiles):
        b_dq = _key_tile(i_tile, b_dq, q_tile, do_tile, rows, ring, seqlen_k, diag, scale_log2,
                         HEAD_DIM, BLOCK_N, True, CAUSAL, SPLIT_P, STAGES, s_layout,
                         op_layout)

    o_qa = m_start + gl.arange(0, GROUP_ROWS, layout=gl.SliceLayout(1, acc_layout))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    m_q = (o_qa < seqlen_q)[:, None] & (o_d < HEAD_DIM)[None, :]
    o_rows = (bos_q + o_qa.to(gl.int64))[:, None]
    p_dq = dq + o_rows * stride_dqt + i_h.to(gl.int64) * stride_dqh + o_d[None, :]
    gl.store(p_dq, (b_dq * scale).to(dq.dtype.element_ty), mask=m_q)


# Partition entry points (worker partitions share one signature; ``descs`` is unused by the
# second consumer group).


@gluon.jit
def _first_group(shared, outputs, scalars, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, PADDED: gl.constexpr,
                 STAGES: gl.constexpr):
    _consume(0, shared, outputs, scalars, HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, PADDED, STAGES)


@gluon.jit
def _second_group(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
                  PADDED: gl.constexpr, STAGES: gl.constexpr):
    _consume(1, shared, outputs, scalars, HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, PADDED, STAGES)


@gluon.jit
def _producer(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, PADDED: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp: both groups' Q and dO tiles, then K and V tiles into the ring as slots free
    up."""
    q_smem, do_smem, k_ring, v_ring, q_bars, kv_bars, free_bars = shared
    q_desc, do_desc, k_desc, v_desc = descs
    m_tile = scalars[6]
    n_tiles = scalars[8]
    for group in gl.static_range(2):
        bar = q_bars.index(group)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma_load(q_desc, [m_tile + group * GROUP_ROWS, 0], bar, q_smem.index(group))
        tma_load(do_desc, [m_tile + group * GROUP_ROWS, 0], bar, do_smem.index(group))
    for i_tile in range(n_tiles):
        slot = i_tile % STAGES
        wait_free(free_bars, i_tile, STAGES)
        bar = kv_bars.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load(k_desc, [i_tile * BLOCK_N, 0], bar, k_ring.index(slot))
        tma_load(v_desc, [i_tile * BLOCK_N, 0], bar, v_ring.index(slot))


@gluon.jit
def attn_bwd_dq_ws_kernel(
    q, k, v, do, lse2, delta, dq,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_dqt, stride_dqh,
    batch, stride_hm, group, scale, scale_log2,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SPLIT_P: gl.constexpr,
    PADDED: gl.constexpr,
    STAGES: gl.constexpr,
):
    """One program per (query tile of one sequence, query head), as ``attn_bwd_dq_kernel``;
    ``BLOCK_M`` = 128 (two consumer groups of 64 rows), ``STAGES`` K/V ring slots."""
    gl.static_assert(BLOCK_M == 2 * GROUP_ROWS)
    i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_tile = query_tile(
        cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
    if m_tile >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    n_full, n_hi = key_range(m_tile, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    t_full = n_full // BLOCK_N  # key tiles from t_full on need the mask
    n_tiles = (n_hi + BLOCK_N - 1) // BLOCK_N

    q_desc, q_smem = row_ring(q + bos_q * stride_qt + i_h.to(gl.int64) * stride_qh, seqlen_q,
                              stride_qt, GROUP_ROWS, HEAD_DIM, 2)  # a tile per group
    do_desc, do_smem = row_ring(do + bos_q * stride_dot + i_h.to(gl.int64) * stride_doh,
                                seqlen_q, stride_dot, GROUP_ROWS, HEAD_DIM, 2)
    k_desc, k_ring, v_desc, v_ring = kv_rings(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh,
                                              stride_vt, stride_vh, BLOCK_N, HEAD_DIM, STAGES)
    q_bars = barriers(2, 1)
    kv_bars = barriers(STAGES, 1)
    free_bars = barriers(STAGES, 2)  # one arrival per consumer group
    fence_async_shared()

    shared = (q_smem, do_smem, k_ring, v_ring, q_bars, kv_bars, free_bars)
    outputs = (dq, lse2, delta)
    scalars = (i_b, i_h, bos_q, seqlen_q, seqlen_k, diag, m_tile, t_full, n_tiles, stride_hm,
               stride_dqt, stride_dqh, scale, scale_log2)
    descs = (q_desc, do_desc, k_desc, v_desc)
    gl.warp_specialize([
        (_first_group, (shared, outputs, scalars,
                        HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, PADDED, STAGES)),
        (_second_group, (shared, outputs, scalars, descs,
                         HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, PADDED, STAGES)),
        (_producer, (shared, outputs, scalars, descs,
                     HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, PADDED, STAGES)),
    ], [GROUP_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])
