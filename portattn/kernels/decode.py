"""Decode kernel: the forward for few query rows per sequence, and for paged K/V caches.

One program per (tile of query positions of one sequence, kv head[, head-dim chunk]). Its query
tile packs the query heads of the kv head's GQA group with the positions
(row ``t`` = position ``t // HEADS``, group head ``t % HEADS``), so each K/V tile is read once
per kv head instead of once per query head, and a decode step (one position per sequence) fills
``HEADS`` rows of the tile instead of one.

The bits of a row are those of the prefill forward (``forward.py``): the same key tiles
(BLOCK_N of the table's forward entry), visited in the same ascending order, through the same
key loop (``primitives.forward_tile``) and primitives. Which rows share a tile does not enter a
row's arithmetic (``primitives.mma``: each output element is its own row's dot products), and a
key tile that a row does not see leaves its (acc, m, l) unchanged (``online_softmax_step``), so
a row gets the same bytes here as in the trainer's packed prefill (design §3, 2 and 4).

K and V are either packed ([total_k, Hkv, D], as the prefill reads them) or paged caches
(``PAGE_SIZE`` > 0: [num_pages, PAGE_SIZE, Hkv, D], key ``j`` of sequence ``b`` in page
``block_table[b, j // PAGE_SIZE]``); a dense cache [B_cache, S_cache, Hkv, D] is a paged cache
of one page of ``S_cache`` rows per sequence (``kvcache.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from portattn.kernels.addressing import (
    head_dim_chunk,
    row_stride,
    row_strides,
    seq_bounds,
    tile_index,
    value_columns,
)
from portattn.kernels.plan import KernelLaunch, VarlenProblem, ceil_div, next_pow2, repair_tiles
from portattn.kernels.primitives import KeyLoop, forward_tile, tile_is_finite, visited_key_range


@triton.jit
def attn_decode_kernel(
    q, k, v, o, lse, block_table,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_bt,
    batch, n_heads_q, group, scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEADS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT_P: tl.constexpr,
    INTERPRET: tl.constexpr,
    D_CHUNKS: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
    WINDOW_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINK: tl.constexpr,
    sinks,
    REPAIR: tl.constexpr = 0,
    PAGE_BLOCK: tl.constexpr = 0,
    KEY_CHUNK: tl.constexpr = 0,
):
    """Program ids: 0 = (position tile, sequence) as ``tile_index`` decodes it; 1 = kv head
    times the group's head slices (``HEADS`` query heads each, a power of two); 2 = head-dim
    chunk (``D_CHUNKS``, as the forward's ``fwd_chunks``). ``PAGE_SIZE`` 0: K/V packed, the
    sequence's keys from ``cu_seqlens_k[b]`` on; else paged, ``cu_seqlens_k`` only counts them.
    ``HEAD_DIM_V`` / ``BLOCK_DV``: v's and the output's head dim (as the forward's).
    ``REPAIR``: the repair pass (design §3.2, as the forward's). ``PAGE_BLOCK`` (paged): the
    key tiles whose block-table entries the key loop reads at once (0: per tile; the entry's
    ``page_block``).
    """
    stride_qt, stride_qh = row_strides(stride_qt, stride_qh, HEAD_DIM)
    stride_kt, stride_kh = row_strides(stride_kt, stride_kh, HEAD_DIM)
    stride_kp = row_stride(stride_kp, HEAD_DIM)
    stride_vt, stride_vh = row_strides(stride_vt, stride_vh, HEAD_DIM_V)
    stride_vp = row_stride(stride_vp, HEAD_DIM_V)
    stride_ot, stride_oh = row_strides(stride_ot, stride_oh, HEAD_DIM_V)
    ROWS: tl.constexpr = BLOCK_M // HEADS  # query positions per tile
    i_b, i_m = tile_index(batch, CAUSAL)
    slices = (group + HEADS - 1) // HEADS
    i_hk = tl.program_id(1) // slices
    i_s = tl.program_id(1) % slices
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    m_start = i_m * ROWS
    if m_start >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q

    o_t = tl.arange(0, BLOCK_M)
    o_q = m_start + o_t // HEADS  # [BLOCK_M] query positions in the sequence
    o_g = i_s * HEADS + o_t % HEADS  # [BLOCK_M] query heads within the group
    m_row = (o_q < seqlen_q) & (o_g < group)
    i_h = (i_hk * group + o_g).to(tl.int64)  # [BLOCK_M] query heads
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    if REPAIR:  # before any load (the forward's)
        o_rv, m_rv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)
        o_rc, m_rc, _ = head_dim_chunk(o_rv, m_rv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)
        p_first = (o + (bos_q + o_q.to(tl.int64))[:, None] * stride_ot
                   + i_h[:, None] * stride_oh + o_rc[None, :])
        # One row stands for the tile (repair_check_rows; the tile is one slab, its rows are
        # (position, head) pairs): the valid row of the latest position.
        m_check = m_row & (o_t == tl.max(tl.where(m_row, o_t, 0), 0))
        if tile_is_finite(p_first, m_check[:, None] & m_rc[None, :]):
            return
    p_q = q + (bos_q + o_q.to(tl.int64))[:, None] * stride_qt + i_h[:, None] * stride_qh
    b_q = tl.load(p_q + o_d[None, :], mask=m_row[:, None] & m_d[None, :], other=0.0)
    BLOCK_DC: tl.constexpr = BLOCK_DV // D_CHUNKS
    o_dv, m_dv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)  # [BLOCK_DV]
    o_dc, m_dc, c_v = head_dim_chunk(o_dv, m_dv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)

    if PAGE_SIZE > 0:
        bos_k = 0  # a paged sequence starts at its block-table row
    p_pages = block_table + i_b.to(tl.int64) * stride_bt
    src_k = k + bos_k * stride_kt + i_hk.to(tl.int64) * stride_kh
    src_v = v + bos_k * stride_vt + i_hk.to(tl.int64) * stride_vh
    n_lo, n_full, n_hi = visited_key_range(m_start, seqlen_k, diag, ROWS, BLOCK_N, CAUSAL,
                                           WINDOW_LEFT, WINDOW_RIGHT)

    b_sink = tl.load(sinks + i_h, mask=m_row, other=0.0) if HAS_SINK else None  # [BLOCK_M]
    b_out, b_lse = forward_tile(  # [BLOCK_M, BLOCK_DC], [BLOCK_M]
        b_q, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, n_lo, n_full, n_hi,
        KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, False, WINDOW_LEFT, WINDOW_RIGHT,
                SOFTCAP, PAGE_SIZE, REPAIR, PAGE_BLOCK, KEY_CHUNK), BLOCK_DC, p_pages, stride_kp,
        stride_vp,
        b_sink, HAS_SINK,
    )

    o_rows = (bos_q + o_q.to(tl.int64))[:, None]
    p_o = o + o_rows * stride_ot + i_h[:, None] * stride_oh + o_dc[None, :]
    tl.store(p_o, b_out.to(o.dtype.element_ty), mask=m_row[:, None] & m_dc[None, :])
    p_lse = lse + (bos_q + o_q.to(tl.int64)) * n_heads_q + i_h
    if D_CHUNKS == 1:  # noqa: SIM114 - a constexpr branch, then a runtime one
        tl.store(p_lse, b_lse, mask=m_row)
    elif tl.program_id(2) == 0:
        tl.store(p_lse, b_lse, mask=m_row)


def heads_per_tile(problem: VarlenProblem) -> int:
    """Query heads of one GQA group packed into a decode tile: the group, rounded up to a power
    of two, at most the tile's rows."""
    return min(next_pow2(problem.group), problem.cfg.decode_tiles().block_m)


def decode_fits(problem: VarlenProblem) -> bool:
    """Whether the decode kernel is the faster forward of an unpaged call: every query row of a
    sequence's group fits one tile, so each K/V tile is read once per kv head. (Paged calls
    always run it; either kernel gives the same bits.)"""
    tiles = problem.cfg.decode_tiles()
    return problem.max_seqlen_q * heads_per_tile(problem) <= tiles.block_m


def plan_decode(problem: VarlenProblem, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                block_table, page_size: int, sinks=None, repair: bool = False) -> KernelLaunch:
    """The decode launch writing ``out`` / ``lse`` (see ``forward.plan_forward``); ``repair``:
    its repair pass (design §3.2), launched after it.

    q: [total_q, Hq, D]; k, v: packed [total_k, Hkv, D] (``page_size`` 0) or paged caches
    [num_pages, page_size, Hkv, D]; block_table: int32 [B, pages_per_seq] (paged) or None;
    sinks: float32 [Hq] or None.
    """
    p = problem
    key = ("decode", page_size, sinks is None, repair)
    static = p.memo.get(key)
    if static is None:  # the grid and compile-time parameters: the problem's alone
        static = p.memo[key] = _decode_static(p, page_size, sinks is not None, repair)
    grid, params = static
    if page_size:
        stride_kp, stride_kt, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        stride_vp, stride_vt, stride_vh = v.stride(0), v.stride(1), v.stride(2)
        table, stride_bt = block_table, block_table.stride(0)
    else:
        stride_kp, stride_kt, stride_kh = 0, k.stride(0), k.stride(1)
        stride_vp, stride_vt, stride_vh = 0, v.stride(0), v.stride(1)
        table, stride_bt = cu_seqlens_k, 0  # not read
    args = (
        q, k, v, out, lse, table,
        cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), stride_kp, stride_kt, stride_kh, stride_vp, stride_vt,
        stride_vh, out.stride(0), out.stride(1), stride_bt,
        p.batch, p.n_heads_q, p.group, p.scale_log2,
    )
    stage = "decode_repair" if repair else "decode"
    return KernelLaunch(stage, attn_decode_kernel, grid, args, dict(params, sinks=sinks), tma=False)


def _decode_static(p: VarlenProblem, page_size: int, has_sink: bool,
                   repair: bool = False) -> tuple[tuple, dict]:
    """The decode launch's grid and its compile-time parameters but ``sinks`` (a tensor)."""
    cfg = p.cfg
    tiles = repair_tiles(cfg.decode_tiles()) if repair else cfg.decode_tiles()
    heads = heads_per_tile(p)
    rows = tiles.block_m // heads
    slices = ceil_div(p.group, heads)
    grid = (ceil_div(p.grid_rows_q, rows) * p.batch, p.n_heads_k * slices, cfg.fwd_chunks)
    params = dict(
        HEAD_DIM=p.head_dim, BLOCK_D=p.block_d, **p.value_flags(),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, HEADS=heads, PAGE_SIZE=page_size,
        PAGE_BLOCK=cfg.page_block if page_size else 0,  # the family's (rows.PAGE_BLOCK)
        CAUSAL=p.causal, SPLIT_P=p.split_p, INTERPRET=p.interpret, D_CHUNKS=cfg.fwd_chunks,
        **p.feature_flags(), HAS_SINK=has_sink, **tiles.launch_kwargs(),
    )
    if repair:
        params.update(REPAIR=p.cfg.repair_products)
    if cfg.key_chunk:  # design §3.1 (absent at 0: the kernel's default)
        params.update(KEY_CHUNK=cfg.key_chunk)
    return grid, params
