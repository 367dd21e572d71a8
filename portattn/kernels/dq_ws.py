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
from portattn.kernels.addressing import head_major_start, query_tile
from portattn.kernels.primitives import load_row_lse2, mask_scores, recompute_p, visible_mask


def dq_ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for: 128 query rows in two groups
    (``ws.two_groups_fit``), 64-key tiles."""
    return ws.two_groups_fit(tiles.block_m, tiles, head_dim) and tiles.block_n == 64


class _Program(NamedTuple):
    """The runtime state of one dQ program (a 128-row query tile of one head), which every
    partition reads by name (``ws.specialize``); its constexprs are a ``ws.Config``."""

    # Shared memory: both groups' Q and dO tiles [2, 64, HEAD_DIM], the K and V rings
    # [STAGES, BLOCK_N, HEAD_DIM]; the mbarriers of Q and dO (one per group), of the ring's
    # fills and frees.
    q_smem: gl.shared_memory_descriptor
    do_smem: gl.shared_memory_descriptor
    k_ring: gl.shared_memory_descriptor
    v_ring: gl.shared_memory_descriptor
    q_bars: gl.shared_memory_descriptor
    kv_bars: gl.shared_memory_descriptor
    free_bars: gl.shared_memory_descriptor
    # dq [total_q, Hq, D]; lse2 and delta, the preprocess kernel's head-major [Hq, stride_hm].
    dq: gl.tensor
    lse2: gl.tensor
    delta: gl.tensor
    # The query tile: rows [m_tile, m_tile + 128) of head i_h of sequence i_b (first token
    # bos_q); key tiles from t_full on need the mask, n_tiles in all.
    i_b: gl.tensor
    i_h: gl.tensor
    bos_q: gl.tensor
    seqlen_q: gl.tensor
    seqlen_k: gl.tensor
    diag: gl.tensor
    m_tile: gl.tensor
    t_full: gl.tensor
    n_tiles: gl.tensor
    stride_hm: gl.tensor
    stride_dqt: gl.tensor
    stride_dqh: gl.tensor
    scale: gl.tensor
    scale_log2: gl.tensor
    # The producer's: the launch's ragged descriptors of q, do, k and v (``ws.ragged_load``),
    # the sequence's first key row and the kv head.
    q_desc: tma.tensor_descriptor
    do_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    bos_k: gl.tensor
    i_hk: gl.tensor


@gluon.jit
def _key_tile(i_tile, b_dq, q_tile, do_tile, o_q, b_lse2, b_delta, st, cfg,
              MASKED: gl.constexpr, s_layout: gl.constexpr, op_layout: gl.constexpr):
    """Key tile ``i_tile`` (ring slot ``i_tile % STAGES``) into the group's dQ; ``MASKED``:
    the tile needs the mask (past the causal bound or the sequence end; without ``CAUSAL``
    only the sequence end)."""
    BLOCK_N: gl.constexpr = cfg.BLOCK_N
    slot = i_tile % cfg.STAGES
    ws.wait_filled(st.kv_bars, i_tile, cfg.STAGES)
    k_tile = st.k_ring.index(slot)  # [BLOCK_N, HEAD_DIM]
    v_tile = st.v_ring.index(slot)
    b_zero = gl.zeros([ws.GROUP_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    # Q K^T, and dO V^T that runs on: [64, BLOCK_N] each
    b_s, b_dp = ws.issue_scores_dp(q_tile, k_tile, do_tile, v_tile, b_zero)
    if MASKED:
        o_k = i_tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        m_vis = visible_mask(o_q[:, None], o_k[None, :], st.seqlen_k, st.diag, cfg.CAUSAL)
        b_s = mask_scores(b_s, m_vis)
    b_p = recompute_p(b_s, b_lse2[:, None], st.scale_log2)  # [64, BLOCK_N]
    b_dp = warpgroup_mma_wait(0, deps=(b_dp,))
    b_ds = b_p * (b_dp - b_delta[:, None])  # [64, BLOCK_N]
    b_dq = ws.issue_rounded_mma(b_ds, k_tile, b_dq, cfg.SPLIT_P, op_layout)
    b_dq = warpgroup_mma_wait(0, deps=(b_dq,))
    mbarrier.arrive(st.free_bars.index(slot), count=1)  # done with K, V of this tile
    return b_dq


@gluon.jit
def _consume(GROUP: gl.constexpr, st, cfg):
    """Consumer warp group ``GROUP``: query rows [m_tile + 64 GROUP, + 64) of the program."""
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    # Scores [64, BLOCK_N] and dQ [64, HEAD_DIM] in wgmma accumulator layouts; dS is the
    # register A operand of dS K.
    s_layout: gl.constexpr = ws.acc_layout(cfg.BLOCK_N)
    acc_layout: gl.constexpr = ws.acc_layout(HEAD_DIM)
    op_layout: gl.constexpr = ws.operand_layout(acc_layout)
    m_start = st.m_tile + GROUP * ws.GROUP_ROWS
    if m_start >= st.seqlen_q:
        # Every row of this group past the sequence end: nothing to do. It still waits for the
        # copy of its Q and dO tiles (no copy into the CTA's shared memory may be in flight
        # when it exits) and takes part in the ring.
        mbarrier.wait(st.q_bars.index(GROUP), 0)
        ws.skip_ring(st.kv_bars, st.free_bars, st.n_tiles, cfg.STAGES)
        return
    o_q = m_start + gl.arange(0, ws.GROUP_ROWS, layout=gl.SliceLayout(1, s_layout))
    m_row = o_q < st.seqlen_q
    # lse2 and delta of the group's rows, as the Triton kernel reads them: rows past the
    # sequence end get lse2 +inf (P = 0) and delta 0.
    o_hm = (st.i_h.to(gl.int64) * st.stride_hm + head_major_start(st.bos_q, st.i_b, cfg.PADDED)
            + o_q)
    b_lse2 = load_row_lse2(st.lse2 + o_hm, m_row)  # [64]
    b_delta = gl.load(st.delta + o_hm, mask=m_row, other=0.0)  # [64]
    q_tile = st.q_smem.index(GROUP)  # [64, HEAD_DIM]
    do_tile = st.do_smem.index(GROUP)

    b_dq = gl.zeros([ws.GROUP_ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
    mbarrier.wait(st.q_bars.index(GROUP), 0)
    for i_tile in range(0, st.t_full):
        b_dq = _key_tile(i_tile, b_dq, q_tile, do_tile, o_q, b_lse2, b_delta, st, cfg, False,
                         s_layout, op_layout)
    for i_tile in range(st.t_full, st.n_tiles):
        b_dq = _key_tile(i_tile, b_dq, q_tile, do_tile, o_q, b_lse2, b_delta, st, cfg, True,
                         s_layout, op_layout)

    _, o_d, o_rows, m_q = ws.tile_rows(m_start, st.bos_q, st.seqlen_q, ws.GROUP_ROWS, HEAD_DIM,
                                       acc_layout)
    p_dq = st.dq + o_rows * st.stride_dqt + st.i_h.to(gl.int64) * st.stride_dqh + o_d[None, :]
    gl.store(p_dq, (b_dq * st.scale).to(st.dq.dtype.element_ty), mask=m_q)


@gluon.jit
def _producer(st, cfg):
    """One warp: both groups' Q and dO tiles, then K and V tiles into the ring as slots free
    up."""
    STAGES: gl.constexpr = cfg.STAGES
    for group in gl.static_range(2):
        bar = st.q_bars.index(group)
        row = st.m_tile + group * ws.GROUP_ROWS
        mbarrier.expect(bar, st.q_desc.block_type.nbytes + st.do_desc.block_type.nbytes)
        ws.ragged_load(st.q_desc, st.bos_q, st.seqlen_q, row, st.i_h, bar, st.q_smem.index(group))
        ws.ragged_load(st.do_desc, st.bos_q, st.seqlen_q, row, st.i_h, bar,
                       st.do_smem.index(group))
    for i_tile in range(st.n_tiles):
        slot = i_tile % STAGES
        ws.wait_free(st.free_bars, i_tile, STAGES)
        bar = st.kv_bars.index(slot)
        mbarrier.expect(bar, st.k_desc.block_type.nbytes + st.v_desc.block_type.nbytes)
        ws.ragged_load(st.k_desc, st.bos_k, st.seqlen_k, i_tile * cfg.BLOCK_N, st.i_hk, bar,
                       st.k_ring.index(slot))
        ws.ragged_load(st.v_desc, st.bos_k, st.seqlen_k, i_tile * cfg.BLOCK_N, st.i_hk, bar,
                       st.v_ring.index(slot))


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
    gl.static_assert(BLOCK_M == 2 * ws.GROUP_ROWS)
    i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_tile = query_tile(
        cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
    if m_tile >= seqlen_q:
        return
    diag, t_full, n_tiles = ws.query_key_tiles(m_tile, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                               CAUSAL)

    # q, k, v, do: ragged host descriptors (``descriptors.py``); a Q and a dO tile per
    # group.
    dtype: gl.constexpr = q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, ws.GROUP_ROWS, HEAD_DIM], ws.SWIZZLED_128B)
    do_smem = gl.allocate_shared_memory(dtype, [2, ws.GROUP_ROWS, HEAD_DIM], ws.SWIZZLED_128B)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    q_bars = ws.barriers(2, 1)
    kv_bars = ws.barriers(STAGES, 1)
    free_bars = ws.barriers(STAGES, 2)  # one arrival per consumer group
    fence_async_shared()

    # The runtime state, assigned as the positional tuples were (``ws.specialize``).
    program = _Program(
        q_smem=q_smem, do_smem=do_smem, k_ring=k_ring, v_ring=v_ring, q_bars=q_bars,
        kv_bars=kv_bars, free_bars=free_bars, dq=dq, lse2=lse2, delta=delta,
        i_b=i_b, i_h=i_h, bos_q=bos_q, seqlen_q=seqlen_q, seqlen_k=seqlen_k, diag=diag,
        m_tile=m_tile, t_full=t_full, n_tiles=n_tiles, stride_hm=stride_hm,
        stride_dqt=stride_dqt, stride_dqh=stride_dqh, scale=scale, scale_log2=scale_log2,
        q_desc=q, do_desc=do, k_desc=k, v_desc=v, bos_k=bos_k, i_hk=i_hk)
    ws.specialize(program, ws.Config(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, STAGES,
                                     PADDED=PADDED), _consume, _producer)
