"""Hopper forward kernel in Gluon: warp-specialised, same arithmetic as ``forward.py``.

Triton 3.6 cannot overlap the forward's softmax with its matrix products on Hopper: its
automatic warp specialisation fails there (perf-notes row 26) and it waits for a ``wgmma``
right after issuing it unless the result is the next product's accumulator (rows 21, 32).
Gluon states the schedule by hand (FlashAttention-3's structure):

* one producer warp copies Q, then K and V tiles into a ring of ``STAGES`` slots (TMA, per-
  sequence descriptors that read 0 past the sequence end), each tile signalling an mbarrier;
* two consumer warp groups of 4 warps each own 64 query rows of the program's 128. Each issues
  the next key tile's ``Q K^T`` before this tile's rescale and ``P V``, and computes the next
  softmax while ``P V`` runs; it releases a slot (an mbarrier both groups arrive on) once its
  ``P V`` is done. The groups run unsynchronised, so one's softmax also runs under the other's
  products.

Bits. Every element is computed by the same expressions as in ``attn_fwd_kernel``: the shared
``online_softmax_step``, ``visible_mask``, ``mask_scores``, ``split_p_lo`` and
``normalize_rows``, P rounded to the input dtype, the same wgmma products over the same key
tiles, in the same order. Both groups visit the key tiles of the whole 128-row tile,
as the Triton kernel does; a tile no row of a group sees leaves its (m, l, acc) unchanged. So
the two kernels give the same bits for the same table tiles (GPU tests compare them bitwise,
``tests/test_table_variants.py``). The table selects this kernel (``KernelConfig.fwd_ws``);
the launcher falls back to ``attn_fwd_kernel`` where descriptors cannot be used, and Gluon
has no CPU interpreter.
"""

from __future__ import annotations

import triton

if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 6):
    raise ImportError("the warp-specialised forward is written for Gluon as of Triton 3.6")

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
    key_range,
    mask_scores,
    normalize_rows,
    online_softmax_step,
    query_tile,
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


def ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for (the table test checks every entry that
    selects it): two groups of 64 rows, 8 warps in all, a power-of-2 head dim whose rows fill
    128-byte swizzled shared memory, and a ring of at least two slots (with one, a group would
    wait for the next key tile before releasing the slot it needs: a hang)."""
    return (
        tiles.block_m == 2 * GROUP_ROWS.value
        and tiles.num_warps == 2 * GROUP_WARPS.value
        and tiles.num_stages >= 2
        and head_dim in (64, 128)
        and tiles.block_n in (64, 128)
    )


@gluon.jit
def _softmax_p(b_s, b_m, b_l, i_tile, t_full, m_start, seqlen_k, diag, scale_log2,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """Mask key tile ``i_tile``'s raw scores where it needs it, then one online-softmax step."""
    if i_tile >= t_full:
        o_q = m_start + gl.arange(0, GROUP_ROWS, layout=gl.SliceLayout(1, s_layout))
        o_k = i_tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        m_vis = visible_mask(o_q[:, None], o_k[None, :], seqlen_k, diag, CAUSAL)
        b_s = mask_scores(b_s, m_vis)
    return online_softmax_step(b_s, b_m, b_l, scale_log2)


@gluon.jit
def _consume(GROUP: gl.constexpr, shared, outputs, scalars, HEAD_DIM: gl.constexpr,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
             STORE_O32: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warp group ``GROUP``: query rows [m_tile + 64 GROUP, + 64) of the program."""
    q_smem, k_ring, v_ring, q_bars, k_bars, v_bars, free_bars = shared
    o, lse, o32 = outputs
    (bos_q, seqlen_q, seqlen_k, diag, t_full, n_tiles, m_tile, i_h, n_heads_q,
     stride_ot, stride_oh, stride_o32t, stride_o32h, scale_log2) = scalars

    # Scores [64, BLOCK_N] and output [64, HEAD_DIM] in wgmma accumulator layouts; P is the
    # register A operand of P V.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[GROUP_WARPS, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_start = m_tile + GROUP * GROUP_ROWS
    if m_start >= seqlen_q:
        # Every row of this group lies past the sequence end (the last tile of a sequence of
        # 1-64 rows mod 128): nothing to compute or store. It still waits for the copy of its
        # Q tile, so that no copy into the CTA's shared memory is in flight when it exits,
        # and takes part in the ring. (V lands after K in each fill.)
        mbarrier.wait(q_bars.index(GROUP), 0)
        skip_ring(v_bars, free_bars, n_tiles, STAGES)
        return
    q_tile = q_smem.index(GROUP)

    b_zero = gl.zeros([GROUP_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    b_acc = gl.zeros([GROUP_ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    b_m = gl.full([GROUP_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_l = gl.zeros([GROUP_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_p = b_zero
    b_alpha = b_l
    mbarrier.wait(q_bars.index(GROUP), 0)
    if n_tiles > 0:
        wait_filled(k_bars, 0, STAGES)
        b_s = warpgroup_mma(q_tile, k_ring.index(0).permute((1, 0)), b_zero, use_acc=False,
                            is_async=True)
        b_s = warpgroup_mma_wait(0, deps=(b_s,))
        b_p, b_alpha, b_m, b_l = _softmax_p(b_s, b_m, b_l, 0, t_full, m_start, seqlen_k, diag,
                                            scale_log2, BLOCK_N, CAUSAL, s_layout)

    # Iteration i: P of tile i is ready and acc holds tiles < i. Q K^T of tile i + 1 runs under
    # the rescale of acc, P V of tile i under the softmax of tile i + 1.
    PV_GROUPS: gl.constexpr = 2 if SPLIT_P else 1  # wgmma groups of one P V
    for i_tile in range(0, n_tiles - 1):
        i_next = i_tile + 1
        wait_filled(k_bars, i_next, STAGES)
        b_s = warpgroup_mma(q_tile, k_ring.index(i_next % STAGES).permute((1, 0)), b_zero,
                            use_acc=False, is_async=True)
        b_acc = b_acc * gl.convert_layout(b_alpha, row_layout)[:, None]
        wait_filled(v_bars, i_tile, STAGES)
        b_acc = issue_rounded_mma(b_p, v_ring.index(i_tile % STAGES), b_acc, SPLIT_P, p_layout)
        b_s = warpgroup_mma_wait(PV_GROUPS, deps=(b_s,))  # Q K^T done, P V may run on
        b_p, b_alpha, b_m, b_l = _softmax_p(b_s, b_m, b_l, i_next, t_full, m_start, seqlen_k,
                                            diag, scale_log2, BLOCK_N, CAUSAL, s_layout)
        b_acc = warpgroup_mma_wait(0, deps=(b_acc,))
        mbarrier.arrive(free_bars.index(i_tile % STAGES), count=1)  # done with K, V of tile i

    if n_tiles > 0:  # the last tile's P V
        i_tile = n_tiles - 1
        b_acc = b_acc * gl.convert_layout(b_alpha, row_layout)[:, None]
        wait_filled(v_bars, i_tile, STAGES)
        b_acc = issue_rounded_mma(b_p, v_ring.index(i_tile % STAGES), b_acc, SPLIT_P, p_layout)
        b_acc = warpgroup_mma_wait(0, deps=(b_acc,))

    # Rows that saw no key: out 0, lse -inf (as attn_fwd_kernel).
    b_l = gl.convert_layout(b_l, row_layout)
    b_m = gl.convert_layout(b_m, row_layout)
    b_out, b_lse = normalize_rows(b_acc, b_m, b_l)  # [64, HEAD_DIM], [64]

    o_q = m_start + gl.arange(0, GROUP_ROWS, layout=row_layout)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    m_o = (o_q < seqlen_q)[:, None] & (o_d < HEAD_DIM)[None, :]
    o_rows = (bos_q + o_q.to(gl.int64))[:, None]
    p_o = o + o_rows * stride_ot + i_h.to(gl.int64) * stride_oh + o_d[None, :]
    gl.store(p_o, b_out.to(o.dtype.element_ty), mask=m_o)
    gl.store(lse + (bos_q + o_q.to(gl.int64)) * n_heads_q + i_h, b_lse, mask=o_q < seqlen_q)
    if STORE_O32:
        p_o32 = o32 + o_rows * stride_o32t + i_h.to(gl.int64) * stride_o32h + o_d[None, :]
        gl.store(p_o32, b_out, mask=m_o)


# Partition entry points. Worker partitions must share one signature (``descs`` is unused by
# the second consumer group).


@gluon.jit
def _first_group(shared, outputs, scalars, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, STORE_O32: gl.constexpr,
                 STAGES: gl.constexpr):
    _consume(0, shared, outputs, scalars, HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, STAGES)


@gluon.jit
def _second_group(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr,
                  STORE_O32: gl.constexpr, STAGES: gl.constexpr):
    _consume(1, shared, outputs, scalars, HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, STAGES)


@gluon.jit
def _producer(shared, outputs, scalars, descs, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, SPLIT_P: gl.constexpr, STORE_O32: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp: both groups' Q tiles, then K and V tiles into the ring as slots free up."""
    q_smem, k_ring, v_ring, q_bars, k_bars, v_bars, free_bars = shared
    q_desc, k_desc, v_desc = descs
    n_tiles = scalars[5]
    m_tile = scalars[6]
    for group in gl.static_range(2):
        mbarrier.expect(q_bars.index(group), q_desc.block_type.nbytes)
        tma_load(q_desc, [m_tile + group * GROUP_ROWS, 0], q_bars.index(group), q_smem.index(group))
    for i_tile in range(n_tiles):
        slot = i_tile % STAGES
        wait_free(free_bars, i_tile, STAGES)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma_load(k_desc, [i_tile * BLOCK_N, 0], k_bars.index(slot), k_ring.index(slot))
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        tma_load(v_desc, [i_tile * BLOCK_N, 0], v_bars.index(slot), v_ring.index(slot))


@gluon.jit
def attn_fwd_ws_kernel(
    q, k, v, o, lse, o32,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_o32t, stride_o32h,
    batch, n_heads_q, group, scale_log2,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SPLIT_P: gl.constexpr,
    STORE_O32: gl.constexpr,
    STAGES: gl.constexpr,
):
    """One program per (query tile of one sequence, query head), as ``attn_fwd_kernel``;
    ``BLOCK_M`` = 128 (two consumer groups of 64 rows), ``STAGES`` K/V ring slots."""
    gl.static_assert(BLOCK_M == 2 * GROUP_ROWS)
    i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start = query_tile(
        cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
    if m_start >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    n_full, n_hi = key_range(m_start, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    t_full = n_full // BLOCK_N  # key tiles from t_full on need the mask
    n_tiles = (n_hi + BLOCK_N - 1) // BLOCK_N

    q_desc, q_smem = row_ring(q + bos_q * stride_qt + i_h.to(gl.int64) * stride_qh, seqlen_q,
                              stride_qt, GROUP_ROWS, HEAD_DIM, 2)
    k_desc, k_ring, v_desc, v_ring = kv_rings(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh,
                                              stride_vt, stride_vh, BLOCK_N, HEAD_DIM, STAGES)
    q_bars = barriers(2, 1)
    k_bars = barriers(STAGES, 1)
    v_bars = barriers(STAGES, 1)
    free_bars = barriers(STAGES, 2)  # one arrival per consumer group
    fence_async_shared()

    shared = (q_smem, k_ring, v_ring, q_bars, k_bars, v_bars, free_bars)
    outputs = (o, lse, o32)
    scalars = (bos_q, seqlen_q, seqlen_k, diag, t_full, n_tiles, m_start, i_h, n_heads_q,
               stride_ot, stride_oh, stride_o32t, stride_o32h, scale_log2)
    descs = (q_desc, k_desc, v_desc)
    gl.warp_specialize([
        (_first_group, (shared, outputs, scalars,
                        HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, STAGES)),
        (_second_group, (shared, outputs, scalars, descs,
                         HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, STAGES)),
        (_producer, (shared, outputs, scalars, descs,
                     HEAD_DIM, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, STAGES)),
    ], [GROUP_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])
