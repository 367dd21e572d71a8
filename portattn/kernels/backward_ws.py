"""Hopper dK/dV kernel in Gluon: warp-specialised, same arithmetic as ``attn_bwd_dkdv_kernel``.

The Triton dK/dV kernel issues its four products per tile one after another and waits for
each (Triton 3.6 keeps a ``wgmma`` in flight only when its result is the next product's
accumulator; perf-notes rows 21, 32), so the matrix unit idles during the exponentials and
the ``dS`` arithmetic. Here, as in the forward (``forward_ws.py``):

* one producer warp copies the program's K and V rows once, then for every (query head of
  the GQA group, query tile) the Q and dO tiles and their lse2 and delta values into a ring
  of ``STAGES`` slots (TMA, per-sequence descriptors that read 0 past the sequence end);
* two consumer warp groups of 4 warps each own 64 key rows of the program's ``BLOCK_N`` =
  128. Each issues ``K Q^T`` and ``V dO^T`` together, computes ``P^T`` while ``V dO^T``
  runs, issues ``P^T dO`` (dV) and computes ``dS^T`` under it, then issues ``dS^T Q`` (dK);
  it releases the slot (an mbarrier both groups arrive on) once both are done. The groups run
  unsynchronised, so one's elementwise work also runs under the other's products.

Bits. Every element is the Triton kernel's: the shared ``recompute_p``, ``visible_mask``,
``mask_scores``, ``query_range``, ``P_SCALE`` and ``split_p_lo``, the same products over the
same query tiles in the same order (heads ascending, then tiles ascending). A group skips the
query tiles below its own causal bound, which add exact zeros in the Triton kernel. The table
selects this kernel (``KernelConfig.bwd_ws``); the launcher falls back to the Triton kernel
where descriptors cannot be used, and Gluon has no CPU interpreter.
"""

from __future__ import annotations

import triton

if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 6):
    raise ImportError("the warp-specialised dK/dV kernel is written for Gluon as of Triton 3.6")

from triton.experimental import gluon  # noqa: E402 - after the version gate
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from portattn.configs import Tiles
from portattn.kernels.primitives import (
    P_SCALE,
    head_major_start,
    mask_scores,
    query_range,
    recompute_p,
    seq_bounds,
    tile_index,
    visible_mask,
)
from portattn.kernels.ws_common import (
    CONSUMER_REGS,
    GROUP_WARPS,
    PRODUCER_REGS,
    barriers,
    issue_rounded_mma,
    kv_rings,
    tma_load,
    wait_filled,
    wait_free,
)

GROUP_KEYS = gl.constexpr(64)  # key rows per consumer warp group (one wgmma M)


def dkdv_ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for: two groups of 64 key rows, 8 warps in
    all, 32- or 64-row query tiles, a ring of at least two slots, head dims 64 and 128."""
    return (
        tiles.block_n == 2 * GROUP_KEYS.value
        and tiles.num_warps == 2 * GROUP_WARPS.value
        and tiles.block_m in (32, 64)
        and tiles.num_stages >= 2
        and head_dim in (64, 128)
    )


@gluon.jit
def _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, shared, o_k, seqlen_k, diag, scale_log2,
          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, MASKED: gl.constexpr,
          SPLIT_P: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr,
          op_layout: gl.constexpr):
    """One query tile (ring iteration ``i_it``) into the group's dK and dV; ``MASKED``: the
    tile straddles the causal diagonal of the group's keys."""
    q_ring, do_ring, lse2_ring, delta_ring, ready_bars, free_bars = shared
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    slot = i_it % STAGES
    wait_filled(ready_bars, i_it, STAGES)
    q_tile = q_ring.index(slot).reshape([BLOCK_M, HEAD_DIM])
    do_tile = do_ring.index(slot).reshape([BLOCK_M, HEAD_DIM])
    b_zero = gl.zeros([GROUP_KEYS, BLOCK_M], gl.float32, layout=s_layout)
    b_sT = warpgroup_mma(k_tile, q_tile.permute((1, 0)), b_zero, use_acc=False,
                         is_async=True)  # [64, BLOCK_M]
    b_dpT = warpgroup_mma(v_tile, do_tile.permute((1, 0)), b_zero, use_acc=False,
                          is_async=True)  # [64, BLOCK_M]
    b_sT = warpgroup_mma_wait(1, deps=(b_sT,))  # K Q^T done, V dO^T may run on
    if MASKED:
        # Causal, always: only causal programs have masked tiles (``query_range`` gives none
        # without CAUSAL; keys past the sequence end are never stored). dq_ws.py, whose masked
        # tiles include the sequence end's, passes its CAUSAL instead.
        o_q = m_start + gl.arange(0, BLOCK_M, layout=col_layout)
        b_sT = mask_scores(b_sT, visible_mask(o_q[None, :], o_k[:, None], seqlen_k, diag, True))
    b_lse2 = lse2_ring.index(slot).reshape([BLOCK_M]).load(col_layout)
    b_pT = recompute_p(b_sT, b_lse2[None, :], scale_log2)  # [64, BLOCK_M]
    # P is scaled by an exact power of two before rounding (as the Triton kernel).
    b_dv = issue_rounded_mma(b_pT * P_SCALE, do_tile, b_dv, SPLIT_P, op_layout)
    b_dpT = warpgroup_mma_wait(2 if SPLIT_P else 1, deps=(b_dpT,))
    b_delta = delta_ring.index(slot).reshape([BLOCK_M]).load(col_layout)
    b_dsT = b_pT * (b_dpT - b_delta[None, :])  # [64, BLOCK_M]
    b_dk = issue_rounded_mma(b_dsT, q_tile, b_dk, SPLIT_P, op_layout)
    b_dv, b_dk = warpgroup_mma_wait(0, deps=(b_dv, b_dk))
    mbarrier.arrive(free_bars.index(slot), count=1)  # done with this slot's tiles
    return b_dk, b_dv


@gluon.jit
def _consume(GROUP: gl.constexpr, shared, outputs, scalars, HEAD_DIM: gl.constexpr,
             BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
             STAGES: gl.constexpr):
    """Consumer warp group ``GROUP``: key rows [n_start + 64 GROUP, + 64) of the program."""
    k_smem, v_smem, q_ring, do_ring, lse2_ring, delta_ring, kv_bar, ready_bars, free_bars = shared
    (seqlen_q, seqlen_k, diag, n_start, m_lo, n_tiles, group, scale_log2) = scalars

    # Transposed scores [64 keys, BLOCK_M queries] and gradients [64 keys, HEAD_DIM] in wgmma
    # accumulator layouts; P^T and dS^T are the register A operands of dV and dK.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    n_group = n_start + GROUP * GROUP_KEYS
    # Of each head's n_tiles query tiles (from m_lo on): the first n_skip see none of this
    # group's keys (they add exact zeros in the Triton kernel), the next n_masked straddle the
    # diagonal, the rest see all of them. Separate loops, so the mask's registers are not
    # live in the unmasked loop (one loop with a branch spilled).
    m_lo_g, m_full_g = query_range(n_group, seqlen_q, diag, BLOCK_M, GROUP_KEYS, CAUSAL)
    n_skip = (m_lo_g - m_lo) // BLOCK_M
    n_masked = (m_full_g - m_lo_g + BLOCK_M - 1) // BLOCK_M
    if n_group >= seqlen_k:  # every key of this group past the sequence end: skip every tile
        n_skip = n_tiles
        n_masked = 0
    o_k = n_group + gl.arange(0, GROUP_KEYS, layout=gl.SliceLayout(1, s_layout))
    k_tile = k_smem.index(GROUP)  # [64, HEAD_DIM]
    v_tile = v_smem.index(GROUP)
    ring = (q_ring, do_ring, lse2_ring, delta_ring, ready_bars, free_bars)

    b_dk = gl.zeros([GROUP_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
    b_dv = gl.zeros([GROUP_KEYS, HEAD_DIM], gl.float32, layout=acc_layout)
    mbarrier.wait(kv_bar, 0)
    i_it = 0  # ring iteration: (head, query tile) in the producer's order
    for _head in range(group):
        for _tile_skipped in range(n_skip):
            # A skipped tile's fill is waited for too (ring protocol, ws_common.py): else the
            # group could run a ring pass ahead of the producer.
            wait_filled(ready_bars, i_it, STAGES)
            mbarrier.arrive(free_bars.index(i_it % STAGES), count=1)
            i_it += 1
        m_start = m_lo_g
        for _tile_masked in range(n_masked):
            b_dk, b_dv = _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, ring, o_k, seqlen_k,
                               diag, scale_log2, HEAD_DIM, BLOCK_M, True, SPLIT_P, STAGES,
                               s_layout, op_layout)
            i_it += 1
            m_start += BLOCK_M
        for _tile_full in range(n_tiles - n_skip - n_masked):
            b_dk, b_dv = _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, ring, o_k, seqlen_k,
                               diag, scale_log2, HEAD_DIM, BLOCK_M, False, SPLIT_P, STAGES,
                               s_layout, op_layout)
            i_it += 1
            m_start += BLOCK_M

    _store_group(b_dk, b_dv, outputs, GROUP, acc_layout, HEAD_DIM)


@gluon.jit
def _store_group(b_dk, b_dv, outputs, GROUP: gl.constexpr, acc_layout: gl.constexpr,
                 HEAD_DIM: gl.constexpr):
    """dK * scale and dV / P_SCALE of the group's 64 key rows (rows past the sequence end are
    not stored). Where the rows are is worked out again from the kernel's arguments, so none
    of it stays in registers across the key loop."""
    (dk, dv, cu_seqlens_k, batch, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
     scale) = outputs
    i_b, i_n = tile_index(batch, False)
    i_hk = gl.program_id(1).to(gl.int64)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    n_group = i_n * (2 * GROUP_KEYS) + GROUP * GROUP_KEYS
    o_row = n_group + gl.arange(0, GROUP_KEYS, layout=gl.SliceLayout(1, acc_layout))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    m_kd = (o_row < seqlen_k)[:, None] & (o_d < HEAD_DIM)[None, :]
    o_rows = (bos_k + o_row.to(gl.int64))[:, None]
    p_dk = dk + o_rows * stride_dkt + i_hk * stride_dkh + o_d[None, :]
    gl.store(p_dk, (b_dk * scale).to(dk.dtype.element_ty), mask=m_kd)
    p_dv = dv + o_rows * stride_dvt + i_hk * stride_dvh + o_d[None, :]
    gl.store(p_dv, (b_dv * (1.0 / P_SCALE)).to(dv.dtype.element_ty), mask=m_kd)


# Partition entry points (worker partitions share one signature; ``descs`` is unused by the
# second consumer group).


@gluon.jit
def _first_group(shared, outputs, scalars, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, STAGES: gl.constexpr):
    _consume(0, shared, outputs, scalars, HEAD_DIM, BLOCK_M, CAUSAL, SPLIT_P, STAGES)


@gluon.jit
def _second_group(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
                  STAGES: gl.constexpr):
    _consume(1, shared, outputs, scalars, HEAD_DIM, BLOCK_M, CAUSAL, SPLIT_P, STAGES)


@gluon.jit
def _producer(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, STAGES: gl.constexpr):
    """One warp: both groups' K and V rows, then each (head, query tile)'s Q, dO, lse2 and
    delta into the ring as slots free up."""
    k_smem, v_smem, q_ring, do_ring, lse2_ring, delta_ring, kv_bar, ready_bars, free_bars = shared
    q_desc, do_desc, k_desc, v_desc, lse2_desc, delta_desc, hm_start, i_hk = descs
    seqlen_q, seqlen_k, diag, n_start, m_lo, n_tiles, group, scale_log2 = scalars
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for g in gl.static_range(2):
        tma_load(k_desc, [n_start + g * GROUP_KEYS, 0], kv_bar, k_smem.index(g))
        tma_load(v_desc, [n_start + g * GROUP_KEYS, 0], kv_bar, v_smem.index(g))
    n_bytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes
                              + lse2_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    m_start = m_lo
    i_h = i_hk * group
    for i_it in range(group * n_tiles):
        slot = i_it % STAGES
        wait_free(free_bars, i_it, STAGES)
        bar = ready_bars.index(slot)
        mbarrier.expect(bar, n_bytes)
        tma_load(q_desc, [m_start, i_h, 0], bar, q_ring.index(slot))
        tma_load(do_desc, [m_start, i_h, 0], bar, do_ring.index(slot))
        tma_load(lse2_desc, [i_h, hm_start + m_start], bar, lse2_ring.index(slot))
        tma_load(delta_desc, [i_h, hm_start + m_start], bar, delta_ring.index(slot))
        # The next tile of this head, or the first of the next head.
        m_start += BLOCK_M
        if m_start >= seqlen_q:
            m_start = m_lo
            i_h += 1


@gluon.jit
def attn_bwd_dkdv_ws_kernel(
    q, k, v, do, lse2, delta, dk, dv,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    batch, stride_hm, group, scale, scale_log2,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SPLIT_P: gl.constexpr,
    STAGES: gl.constexpr,
):
    """One program per (key tile of one sequence, kv head), as ``attn_bwd_dkdv_kernel`` with
    one pass; ``BLOCK_N`` = 128 (two consumer groups of 64 key rows), ``STAGES`` ring slots of
    ``BLOCK_M`` query rows. lse2 and delta are the preprocess kernel's padded head-major
    buffers (``head_major_start``)."""
    gl.static_assert(BLOCK_N == 2 * GROUP_KEYS)
    i_b, i_n = tile_index(batch, False)
    i_hk = gl.program_id(1)
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    n_start = i_n * BLOCK_N
    if n_start >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q
    m_lo, _ = query_range(n_start, seqlen_q, diag, BLOCK_M, BLOCK_N, CAUSAL)
    n_tiles = (seqlen_q - m_lo + BLOCK_M - 1) // BLOCK_M  # query tiles per head
    n_heads_q = gl.num_programs(1) * group

    dtype: gl.constexpr = q.dtype.element_ty
    smem3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                               rank=3)
    smem_row: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    # The program's keys, two tiles of GROUP_KEYS rows (one per consumer group), copied once.
    k_desc, k_smem, v_desc, v_smem = kv_rings(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh,
                                              stride_vt, stride_vh, GROUP_KEYS, HEAD_DIM, 2)
    # Q and dO rows of the sequence, any head of the group: [seqlen_q, Hq, HEAD_DIM].
    q_desc = tma.make_tensor_descriptor(
        q + bos_q * stride_qt, [seqlen_q, n_heads_q, HEAD_DIM], [stride_qt, stride_qh, 1],
        [BLOCK_M, 1, HEAD_DIM], smem3)
    do_desc = tma.make_tensor_descriptor(
        do + bos_q * stride_dot, [seqlen_q, n_heads_q, HEAD_DIM], [stride_dot, stride_doh, 1],
        [BLOCK_M, 1, HEAD_DIM], smem3)
    # lse2 and delta past the sequence end read 0, as in the Triton kernel: those rows' Q and
    # dO are 0, so what they add is exactly 0.
    hm_start = head_major_start(bos_q, i_b, True).to(gl.int32)
    hm_shape = [n_heads_q, hm_start + seqlen_q]
    lse2_desc = tma.make_tensor_descriptor(lse2, hm_shape, [stride_hm, 1], [1, BLOCK_M],
                                           smem_row)
    delta_desc = tma.make_tensor_descriptor(delta, hm_shape, [stride_hm, 1], [1, BLOCK_M],
                                            smem_row)

    q_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, HEAD_DIM], smem3)
    do_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, HEAD_DIM], smem3)
    lse2_ring = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], smem_row)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], smem_row)
    kv_bar = barriers(1, 1).index(0)
    ready_bars = barriers(STAGES, 1)
    free_bars = barriers(STAGES, 2)  # one arrival per consumer group
    fence_async_shared()

    shared = (k_smem, v_smem, q_ring, do_ring, lse2_ring, delta_ring, kv_bar, ready_bars,
              free_bars)
    outputs = (dk, dv, cu_seqlens_k, batch, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
               scale)
    scalars = (seqlen_q, seqlen_k, diag, n_start, m_lo, n_tiles, group, scale_log2)
    descs = (q_desc, do_desc, k_desc, v_desc, lse2_desc, delta_desc, hm_start, i_hk)
    gl.warp_specialize([
        (_first_group, (shared, outputs, scalars, HEAD_DIM, BLOCK_M, CAUSAL, SPLIT_P, STAGES)),
        (_second_group, (shared, outputs, scalars, descs,
                         HEAD_DIM, BLOCK_M, CAUSAL, SPLIT_P, STAGES)),
        (_producer, (shared, outputs, scalars, descs, HEAD_DIM, BLOCK_M, CAUSAL, SPLIT_P,
                     STAGES)),
    ], [GROUP_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])
