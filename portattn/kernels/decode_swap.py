"""The Gluon decode's consumer with swapped products (``decode_ws.py``'s ``SWAP``; issue 37's
short rows, perf-notes rows 112, 114).

A decode tile of ``decode_ws`` has 64 rows (one wgmma M) of which a GQA group fills a few (B1
decode with GQA 32/8: 4). Its per-tile work, the two products and the softmax over 64 x
BLOCK_N scores, bounds a program at small batches. Here the tile has 16 rows on wgmma's N:

* ``S^T = K Q^T`` ([BLOCK_N, 16]: K's tile from the ring as A, Q^T as B), and
  ``O^T += V^T P^T`` ([HEAD_DIM, 16]: V's tile transposed as A, P^T from shared memory as B);
  each element the sum of the same products in the same k16 order by the same instruction as
  the prefill's ``S = Q K^T``, ``O += P V`` (perf-notes row 114: bitwise equal, H100);
* the softmax elementwise on S^T (16 scores a thread instead of 64), but each row's sum of P
  in the prefill's own order: P^T goes through shared memory into the prefill's accumulator
  layout of its rows (``prefill_rows_layout``: a row's keys on one quad of one warp, as
  ``ws.acc_layout``'s; the group's warps hold copies) and is summed there, so the running sum
  gets the prefill's bits (a sum in the swapped layout did not, row 114).

Everything else is ``forward_ws``'s order: the next tile's ``S^T`` and this tile's ``O^T`` issued
back to back, the softmax under them, acc rescaled once ``O^T`` is done; max and exponentials
by the expressions of ``online_softmax_step``; P rounded to the input dtype before its product.
So each row's out and lse should be the prefill's (GPU checks: ``ci/gluon_decode_ab.py --swap``
and tests/test_decode_ws.py, bitwise against the decode planned without it).

Scope: varlen only. Split-P (fixed_order: two products of P a tile) built this way made ptxas
(Triton 3.6's) crash with SIGSEGV at some ring depths (d64 with 4 slots, d128 with 2 or 3), so
it is left out; the kernel asserts it. Off in every entry: ``plan_decode_ws(..., swap=True)``
launches it directly (session 51; H100: perf-notes row 127).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from portattn.kernels import ws_common as ws
from portattn.kernels.decode_rows import store_tile
from portattn.kernels.primitives import mask_scores, visible_mask

SWAP_ROWS = gl.constexpr(16)  # the tile's rows: wgmma's N


@gluon.constexpr_function
def p_tiles_shape(block_n):
    """The P^T tiles in shared memory: two buffers (tile i's product reads one while tile i +
    1's P is written to the other): [2, 16, BLOCK_N]."""
    return [2, SWAP_ROWS.value, block_n]


@gluon.constexpr_function
def swapped_layout(rows):
    """The wgmma accumulator layout of a [rows, 16] tile (S^T, O^T) over the 4 warps."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[ws.GROUP_WARPS.value, 1],
                                     instr_shape=[16, SWAP_ROWS.value, 16])


@gluon.constexpr_function
def prefill_rows_layout(block_n):
    """``ws.acc_layout(block_n)`` (the prefill's scores) for 16 rows: thread (lane l, register
    i) holds row (l // 4) + 8 ((i // 2) % 2), key 2 (l % 4) + (i % 2) + 8 (i // 4), as the
    wgmma accumulator of one warp; the other three warps hold copies (the 64-row layout's warp
    bases are its rows 16-63). A row's keys thus sit in the same registers of the same lanes,
    and ``gl.sum`` over them takes the prefill's order."""
    regs = [[0, 1], [8, 0]] + [[0, 8 << j] for j in range((block_n // 8).bit_length() - 1)]
    lanes = [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=[[0, 0], [0, 0]],
                                      block_bases=[], shape=[SWAP_ROWS.value, block_n])


@gluon.jit
def _softmax_t(b_st, b_m, b_l, i_tile, st, cfg, st_layout: gl.constexpr):
    """Mask key tile ``i_tile``'s raw scores S^T [BLOCK_N, 16] where it needs it, then one
    online-softmax step as ``online_softmax_step`` (``b_m``, ``b_l`` [16], the query rows on
    the columns): returns (P^T float32, alpha, m, l)."""
    if i_tile >= st.t_full:
        o_t = gl.arange(0, SWAP_ROWS, layout=gl.SliceLayout(0, st_layout))
        if cfg.HEADS > 1:  # row t is query position t // HEADS
            o_t = o_t // cfg.HEADS
        o_q = st.m_start + o_t
        o_k = i_tile * cfg.BLOCK_N + gl.arange(0, cfg.BLOCK_N,
                                               layout=gl.SliceLayout(1, st_layout))
        m_vis = visible_mask(o_q[None, :], o_k[:, None], st.seqlen_k, st.diag, cfg.CAUSAL)
        b_st = mask_scores(b_st, m_vis)
    b_m_new = gl.maximum(b_m, gl.max(b_st, 0) * st.scale_log2)
    b_m_use = gl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_pt = gl.exp2(b_st * st.scale_log2 - b_m_use[None, :])
    b_alpha = gl.exp2(b_m - b_m_use)
    # the row sums in the prefill's layout and order (module docstring)
    b_p = gl.convert_layout(gl.permute(b_pt, (1, 0)), prefill_rows_layout(cfg.BLOCK_N))
    b_sum = gl.convert_layout(gl.sum(b_p, 1), b_l.type.layout)
    b_l = b_l * b_alpha + b_sum
    return b_pt, b_alpha, b_m_new, b_l


@gluon.jit
def _stage_p(b_pt, st, buf):
    """P^T rounded to the input dtype, as P V rounds it, into P buffer ``buf`` % 2 for the
    product that reads it (``_issue_pv``)."""
    b_p = gl.permute(b_pt, (1, 0))  # [16, BLOCK_N], as the tile's rows
    st.p_smem.index(buf % 2).store(b_p.to(st.v_ring.dtype))
    fence_async_shared()


@gluon.jit
def _issue_pv(i_tile, st, cfg, b_acct):
    """O^T += V^T P^T of tile ``i_tile``, issued."""
    ws.wait_filled(st.v_bars, i_tile, cfg.STAGES)
    v_t = st.v_ring.index(i_tile % cfg.STAGES).permute((1, 0))  # [HEAD_DIM, BLOCK_N]
    return warpgroup_mma(v_t, st.p_smem.index(i_tile % 2).permute((1, 0)), b_acct,
                         is_async=True)


@gluon.jit
def _scores_t(i_tile, st, cfg, st_layout: gl.constexpr):
    """S^T = K Q^T of tile ``i_tile``, issued once its K has landed."""
    b_zero = gl.zeros([cfg.BLOCK_N, SWAP_ROWS], gl.float32, layout=st_layout)
    ws.wait_filled(st.k_bars, i_tile, cfg.STAGES)
    return warpgroup_mma(st.k_ring.index(i_tile % cfg.STAGES), st.q_smem.permute((1, 0)), b_zero,
                         use_acc=False, is_async=True)


@gluon.jit
def _all_keys_t(st, cfg, st_layout: gl.constexpr, ot_layout: gl.constexpr):
    """``forward_ws.all_keys`` with the products swapped: (acc^T [HEAD_DIM, 16], m [16],
    l [16]); a program with no tile keeps the empty state."""
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    b_acct = gl.zeros([cfg.HEAD_DIM, SWAP_ROWS], gl.float32, layout=ot_layout)
    b_m = gl.full([SWAP_ROWS], float("-inf"), gl.float32, layout=col_layout)
    b_l = gl.zeros([SWAP_ROWS], gl.float32, layout=col_layout)
    if st.n_tiles > 0:
        b_st = warpgroup_mma_wait(0, deps=(_scores_t(0, st, cfg, st_layout),))
        b_pt, _, b_m, b_l = _softmax_t(b_st, b_m, b_l, 0, st, cfg, st_layout)
        _stage_p(b_pt, st, 0)
    for i_tile in range(0, st.n_tiles - 1):
        # the next tile's S^T and this tile's O^T back to back, the softmax under them
        b_st = _scores_t(i_tile + 1, st, cfg, st_layout)
        b_acct = _issue_pv(i_tile, st, cfg, b_acct)
        b_st = warpgroup_mma_wait(1, deps=(b_st,))  # S^T done, O^T may run on
        b_pt, b_alpha, b_m, b_l = _softmax_t(b_st, b_m, b_l, i_tile + 1, st, cfg, st_layout)
        _stage_p(b_pt, st, i_tile + 1)  # the other buffer: O^T reads this tile's
        b_acct = warpgroup_mma_wait(0, deps=(b_acct,))
        mbarrier.arrive(st.free_bars.index(i_tile % cfg.STAGES), count=1)  # done with tile i
        b_acct = b_acct * gl.convert_layout(b_alpha, gl.SliceLayout(0, ot_layout))[None, :]
    if st.n_tiles > 0:
        b_acct = _issue_pv(st.n_tiles - 1, st, cfg, b_acct)
        b_acct = warpgroup_mma_wait(0, deps=(b_acct,))
    return b_acct, b_m, b_l


@gluon.jit
def consume_swapped(st, cfg):
    """The consumer warp group with swapped products (module docstring), then the rows' out
    and lse (or a split program's partial), as ``decode_ws``'s consumer stores them."""
    gl.static_assert(not cfg.SPLIT_P, "the swapped consumer has no split-P (module docstring)")
    st_layout: gl.constexpr = swapped_layout(cfg.BLOCK_N)
    ot_layout: gl.constexpr = swapped_layout(cfg.HEAD_DIM)
    b_acct, b_m, b_l = _all_keys_t(st, cfg, st_layout, ot_layout)
    b_acc = gl.permute(b_acct, (1, 0))  # [16, HEAD_DIM]: registers renamed, no data moved
    o_layout: gl.constexpr = b_acc.type.layout
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    store_tile(st, cfg, b_acc, gl.convert_layout(b_m, row_layout),
               gl.convert_layout(b_l, row_layout), o_layout)
