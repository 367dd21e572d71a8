"""Hopper dK/dV kernel in Gluon: warp-specialised, same arithmetic as ``attn_bwd_dkdv_kernel``.

The Triton dK/dV kernel issues its four products per tile one after another and waits for
each (Triton 3.6 keeps a ``wgmma`` in flight only when its result is the next product's
accumulator; perf-notes rows 21, 32), so the matrix unit idles during the exponentials and
the ``dS`` arithmetic. Here, as in the forward (``forward_ws.py``):

* one producer warp copies the program's K and V rows once, then for every (query head of
  the GQA group, query tile) the Q and dO tiles and their lse2 and delta values into a ring
  of ``STAGES`` slots (TMA: Q, dO, K and V through the launch's ragged host descriptors,
  ``descriptors.py``, lse2 and delta through the program's own, all reading 0 past the
  sequence end);
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

from typing import NamedTuple

# portattn.kernels.ws_common raises ImportError before Triton 3.6 (the launcher then runs the
# Triton kernel).
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma_wait,
)

from portattn.configs import Tiles
from portattn.kernels import ws_common as ws
from portattn.kernels.addressing import head_major_start, key_tile, seq_bounds, tile_index
from portattn.kernels.primitives import P_SCALE, mask_scores, query_range, recompute_p, visible_mask


def dkdv_ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for: 128 key rows in two groups
    (``ws.two_groups_fit``), 32- or 64-row query tiles."""
    return ws.two_groups_fit(tiles.block_n, tiles, head_dim) and tiles.block_m in (32, 64)


class _Program(NamedTuple):
    """The runtime state of one dK/dV program (128 keys of one kv head, and the query tiles
    of the GQA group's heads), which every partition reads by name (``ws.specialize``); its
    constexprs are a ``ws.Config``."""

    # Shared memory: both groups' K and V rows [2, 64, HEAD_DIM]; the ring of Q and dO tiles
    # [STAGES, BLOCK_M, 1, HEAD_DIM] and of their lse2 and delta [STAGES, 1, BLOCK_M]; the
    # mbarriers of K and V, of the ring's fills and frees.
    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    q_ring: gl.shared_memory_descriptor
    do_ring: gl.shared_memory_descriptor
    lse2_ring: gl.shared_memory_descriptor
    delta_ring: gl.shared_memory_descriptor
    kv_bar: gl.shared_memory_descriptor
    ready_bars: gl.shared_memory_descriptor
    free_bars: gl.shared_memory_descriptor
    # What ``_store_group`` reads: dk, dv [total_k, Hkv, D] and where the program's keys are.
    dk: gl.tensor
    dv: gl.tensor
    cu_seqlens_k: gl.tensor
    batch: gl.tensor
    stride_dkt: gl.tensor
    stride_dkh: gl.tensor
    stride_dvt: gl.tensor
    stride_dvh: gl.tensor
    scale: gl.tensor
    # The key tile: keys [n_start, n_start + 128); per head of the GQA group (``group``
    # heads) the query tiles from m_lo on, n_tiles of them.
    seqlen_q: gl.tensor
    seqlen_k: gl.tensor
    diag: gl.tensor
    n_start: gl.tensor
    m_lo: gl.tensor
    n_tiles: gl.tensor
    group: gl.tensor
    scale_log2: gl.tensor
    # The producer's: the launch's ragged descriptors of q, do, k, v and the program's of
    # lse2, delta; where the sequence starts in the tokens and in lse2 / delta, the kv head.
    q_desc: tma.tensor_descriptor
    do_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    lse2_desc: tma.tensor_descriptor
    delta_desc: tma.tensor_descriptor
    hm_start: gl.tensor
    i_hk: gl.tensor
    bos_q: gl.tensor
    bos_k: gl.tensor


@gluon.jit
def _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, o_k, st, cfg, MASKED: gl.constexpr,
          s_layout: gl.constexpr, op_layout: gl.constexpr):
    """One query tile (ring iteration ``i_it``) into the group's dK and dV; ``MASKED``: the
    tile straddles the causal diagonal of the group's keys."""
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    slot = i_it % cfg.STAGES
    ws.wait_filled(st.ready_bars, i_it, cfg.STAGES)
    q_tile = st.q_ring.index(slot).reshape([BLOCK_M, HEAD_DIM])
    do_tile = st.do_ring.index(slot).reshape([BLOCK_M, HEAD_DIM])
    b_zero = gl.zeros([ws.GROUP_ROWS, BLOCK_M], gl.float32, layout=s_layout)
    # K Q^T, and V dO^T that runs on: [64, BLOCK_M] each
    b_sT, b_dpT = ws.issue_scores_dp(k_tile, q_tile, v_tile, do_tile, b_zero)
    if MASKED:
        # Causal, always: only causal programs have masked tiles (``query_range`` gives none
        # without CAUSAL; keys past the sequence end are never stored). dq_ws.py, whose masked
        # tiles include the sequence end's, passes its CAUSAL instead.
        o_q = m_start + gl.arange(0, BLOCK_M, layout=col_layout)
        m_vis = visible_mask(o_q[None, :], o_k[:, None], st.seqlen_k, st.diag, True)
        b_sT = mask_scores(b_sT, m_vis)
    b_lse2 = st.lse2_ring.index(slot).reshape([BLOCK_M]).load(col_layout)
    b_pT = recompute_p(b_sT, b_lse2[None, :], st.scale_log2)  # [64, BLOCK_M]
    # P is scaled by an exact power of two before rounding (as the Triton kernel).
    b_dv = ws.issue_rounded_mma(b_pT * P_SCALE, do_tile, b_dv, cfg.SPLIT_P, op_layout)
    b_dpT = warpgroup_mma_wait(2 if cfg.SPLIT_P else 1, deps=(b_dpT,))
    b_delta = st.delta_ring.index(slot).reshape([BLOCK_M]).load(col_layout)
    b_dsT = b_pT * (b_dpT - b_delta[None, :])  # [64, BLOCK_M]
    b_dk = ws.issue_rounded_mma(b_dsT, q_tile, b_dk, cfg.SPLIT_P, op_layout)
    b_dv, b_dk = warpgroup_mma_wait(0, deps=(b_dv, b_dk))
    mbarrier.arrive(st.free_bars.index(slot), count=1)  # done with this slot's tiles
    return b_dk, b_dv


@gluon.jit
def _consume(GROUP: gl.constexpr, st, cfg):
    """Consumer warp group ``GROUP``: key rows [n_start + 64 GROUP, + 64) of the program."""
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    STAGES: gl.constexpr = cfg.STAGES
    # Transposed scores [64 keys, BLOCK_M queries] and gradients [64 keys, HEAD_DIM] in wgmma
    # accumulator layouts; P^T and dS^T are the register A operands of dV and dK.
    s_layout: gl.constexpr = ws.acc_layout(BLOCK_M)
    acc_layout: gl.constexpr = ws.acc_layout(cfg.HEAD_DIM)
    op_layout: gl.constexpr = ws.operand_layout(acc_layout)
    n_group = st.n_start + GROUP * ws.GROUP_ROWS
    # Of each head's n_tiles query tiles (from m_lo on): the first n_skip see none of this
    # group's keys (they add exact zeros in the Triton kernel), the next n_masked straddle the
    # diagonal, the rest see all of them. Separate loops, so the mask's registers are not
    # live in the unmasked loop (one loop with a branch spilled).
    m_lo_g, m_full_g = query_range(n_group, st.seqlen_q, st.diag, BLOCK_M, ws.GROUP_ROWS,
                                   cfg.CAUSAL)
    n_skip = (m_lo_g - st.m_lo) // BLOCK_M
    n_masked = (m_full_g - m_lo_g + BLOCK_M - 1) // BLOCK_M
    if n_group >= st.seqlen_k:  # every key of this group past the sequence end: skip all
        n_skip = st.n_tiles
        n_masked = 0
    o_k = n_group + gl.arange(0, ws.GROUP_ROWS, layout=gl.SliceLayout(1, s_layout))
    k_tile = st.k_smem.index(GROUP)  # [64, HEAD_DIM]
    v_tile = st.v_smem.index(GROUP)

    b_dk = gl.zeros([ws.GROUP_ROWS, cfg.HEAD_DIM], gl.float32, layout=acc_layout)
    b_dv = gl.zeros([ws.GROUP_ROWS, cfg.HEAD_DIM], gl.float32, layout=acc_layout)
    mbarrier.wait(st.kv_bar, 0)
    i_it = 0  # ring iteration: (head, query tile) in the producer's order
    for _head in range(st.group):
        for _tile_skipped in range(n_skip):
            # A skipped tile's fill is waited for too (ring protocol, ws_common.py): else the
            # group could run a ring pass ahead of the producer.
            ws.wait_filled(st.ready_bars, i_it, STAGES)
            mbarrier.arrive(st.free_bars.index(i_it % STAGES), count=1)
            i_it += 1
        m_start = m_lo_g
        for _tile_masked in range(n_masked):
            b_dk, b_dv = _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, o_k, st, cfg, True,
                               s_layout, op_layout)
            i_it += 1
            m_start += BLOCK_M
        for _tile_full in range(st.n_tiles - n_skip - n_masked):
            b_dk, b_dv = _tile(i_it, m_start, b_dk, b_dv, k_tile, v_tile, o_k, st, cfg, False,
                               s_layout, op_layout)
            i_it += 1
            m_start += BLOCK_M

    _store_group(b_dk, b_dv, st, cfg, GROUP, acc_layout)


@gluon.jit
def _store_group(b_dk, b_dv, st, cfg, GROUP: gl.constexpr, acc_layout: gl.constexpr):
    """dK * scale and dV / P_SCALE of the group's 64 key rows (rows past the sequence end are
    not stored). Where the rows are is worked out again from the kernel's arguments, so none
    of it stays in registers across the key loop."""
    i_b, i_n = tile_index(st.batch, False)
    i_hk = gl.program_id(1).to(gl.int64)
    bos_k, seqlen_k = seq_bounds(st.cu_seqlens_k, i_b)
    n_group = i_n * (2 * ws.GROUP_ROWS) + GROUP * ws.GROUP_ROWS
    _, o_d, o_rows, m_kd = ws.tile_rows(n_group, bos_k, seqlen_k, ws.GROUP_ROWS, cfg.HEAD_DIM,
                                        acc_layout)
    p_dk = st.dk + o_rows * st.stride_dkt + i_hk * st.stride_dkh + o_d[None, :]
    gl.store(p_dk, (b_dk * st.scale).to(st.dk.dtype.element_ty), mask=m_kd)
    p_dv = st.dv + o_rows * st.stride_dvt + i_hk * st.stride_dvh + o_d[None, :]
    gl.store(p_dv, (b_dv * (1.0 / P_SCALE)).to(st.dv.dtype.element_ty), mask=m_kd)


@gluon.jit
def _producer(st, cfg):
    """One warp: both groups' K and V rows, then each (head, query tile)'s Q, dO, lse2 and
    delta into the ring as slots free up."""
    STAGES: gl.constexpr = cfg.STAGES
    mbarrier.expect(st.kv_bar,
                    2 * st.k_desc.block_type.nbytes + 2 * st.v_desc.block_type.nbytes)
    for g in gl.static_range(2):
        n_g = st.n_start + g * ws.GROUP_ROWS
        ws.ragged_load(st.k_desc, st.bos_k, st.seqlen_k, n_g, st.i_hk, st.kv_bar,
                       st.k_smem.index(g))
        ws.ragged_load(st.v_desc, st.bos_k, st.seqlen_k, n_g, st.i_hk, st.kv_bar,
                       st.v_smem.index(g))
    n_bytes: gl.constexpr = (st.q_desc.block_type.nbytes + st.do_desc.block_type.nbytes
                             + st.lse2_desc.block_type.nbytes + st.delta_desc.block_type.nbytes)
    m_start = st.m_lo
    i_h = st.i_hk * st.group
    for i_it in range(st.group * st.n_tiles):
        slot = i_it % STAGES
        ws.wait_free(st.free_bars, i_it, STAGES)
        bar = st.ready_bars.index(slot)
        mbarrier.expect(bar, n_bytes)
        ws.ragged_load(st.q_desc, st.bos_q, st.seqlen_q, m_start, i_h, bar,
                       st.q_ring.index(slot))
        ws.ragged_load(st.do_desc, st.bos_q, st.seqlen_q, m_start, i_h, bar,
                       st.do_ring.index(slot))
        o_hm = st.hm_start + m_start  # the tile's first row in lse2 / delta
        ws.tma_load(st.lse2_desc, [i_h, o_hm], bar, st.lse2_ring.index(slot))
        ws.tma_load(st.delta_desc, [i_h, o_hm], bar, st.delta_ring.index(slot))
        # The next tile of this head, or the first of the next head.
        m_start += cfg.BLOCK_M
        if m_start >= st.seqlen_q:
            m_start = st.m_lo
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
    gl.static_assert(BLOCK_N == 2 * ws.GROUP_ROWS)
    i_b, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, n_start = key_tile(
        cu_seqlens_q, cu_seqlens_k, batch, BLOCK_N)
    if n_start >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q
    m_lo, _ = query_range(n_start, seqlen_q, diag, BLOCK_M, BLOCK_N, CAUSAL)
    n_tiles = (seqlen_q - m_lo + BLOCK_M - 1) // BLOCK_M  # query tiles per head

    # q, do, k, v: ragged host descriptors (descriptors.py).
    dtype: gl.constexpr = q.dtype
    smem3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                               rank=3)
    smem_row: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    # The program's keys, two tiles of ws.GROUP_ROWS rows (one per consumer group), copied once;
    # Q and dO tiles of the sequence's rows of one head of the group.
    k_smem = gl.allocate_shared_memory(dtype, [2, ws.GROUP_ROWS, HEAD_DIM], ws.SWIZZLED_128B)
    v_smem = gl.allocate_shared_memory(dtype, [2, ws.GROUP_ROWS, HEAD_DIM], ws.SWIZZLED_128B)
    # lse2 and delta past the sequence end read 0, as in the Triton kernel: those rows' Q and
    # dO are 0, so what they add is exactly 0. Head-major, the sequence's bound is on their
    # contiguous dim, which a ragged descriptor cannot bound: each program makes these two.
    n_heads_q = gl.num_programs(1) * group
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
    kv_bar = ws.barriers(1, 1).index(0)
    ready_bars = ws.barriers(STAGES, 1)
    free_bars = ws.barriers(STAGES, 2)  # one arrival per consumer group
    fence_async_shared()

    # The runtime state, assigned as the positional tuples were (``ws.specialize``).
    program = _Program(
        k_smem=k_smem, v_smem=v_smem, q_ring=q_ring, do_ring=do_ring, lse2_ring=lse2_ring,
        delta_ring=delta_ring, kv_bar=kv_bar, ready_bars=ready_bars, free_bars=free_bars,
        dk=dk, dv=dv, cu_seqlens_k=cu_seqlens_k, batch=batch, stride_dkt=stride_dkt,
        stride_dkh=stride_dkh, stride_dvt=stride_dvt, stride_dvh=stride_dvh, scale=scale,
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, diag=diag, n_start=n_start, m_lo=m_lo,
        n_tiles=n_tiles, group=group, scale_log2=scale_log2, q_desc=q, do_desc=do,
        k_desc=k, v_desc=v, lse2_desc=lse2_desc, delta_desc=delta_desc, hm_start=hm_start,
        i_hk=i_hk,
        bos_q=bos_q, bos_k=bos_k)
    ws.specialize(program, ws.Config(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, STAGES),
                  _consume, _producer)
