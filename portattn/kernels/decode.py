"""Decode kernel: the forward for few query rows per sequence, and for paged K/V caches.

One program per (tile of query positions of one sequence, kv head[, head-dim chunk]). Its query
tile packs the kv head's GQA group with the positions (row ``t`` = position ``t // HEADS``,
group head ``t % HEADS``): each K/V tile is read once per kv head, not once per query head,
and a decode step (one position per sequence) fills ``HEADS`` rows of the tile, not one.

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

With an entry's key chunk (design §3.1) a decode whose grid would not fill the GPU is split
(``split_slots``): one program per (tile, kv head, key chunk) writes the chunk's partial
``(acc, m, l)`` to a float32 workspace (``SPLIT`` 1), then the combine (``SPLIT`` 2, the same
grid as unsplit) merges a tile's partials in ascending order (``row_state.merge_partial``) and
normalises: the merges the prefill does in registers, so the same bits with or without it.
"""

from __future__ import annotations

import torch
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
from portattn.kernels.buffers import new_buffer, rows_aligned
from portattn.kernels.descriptors import pages_contiguous
from portattn.kernels.plan import (
    KernelLaunch,
    VarlenProblem,
    ceil_div,
    decode_grid,
    gluon_applies,
    repair_tiles,
    tile_heads,
)
from portattn.kernels.primitives import (
    KeyLoop,
    chunk_range,
    forward_tile,
    key_range_tiles,
    visited_key_range,
)
from portattn.kernels.repair_checks import tile_is_finite
from portattn.kernels.row_state import empty_rows, finish_rows, merge_partial
from portattn.kernels.ws_kernels import decode_ws


@triton.jit
def attn_decode_kernel(
    q, k, v, o, lse, block_table, partials,
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
    FEATURES: tl.constexpr,
    HAS_SINK: tl.constexpr,
    sinks,
    REPAIR: tl.constexpr = 0,
    PAGE_BLOCK: tl.constexpr = 0,
    KEY_CHUNK: tl.constexpr = 0,
    SPLIT: tl.constexpr = 0,
):
    """Program ids: 0 = (position tile, sequence) as ``tile_index`` decodes it; 1 = kv head
    times the group's head slices (``HEADS`` query heads each, a power of two); 2 = head-dim
    chunk (``D_CHUNKS``, as the forward's ``fwd_chunks``). ``PAGE_SIZE`` 0: K/V packed, the
    sequence's keys from ``cu_seqlens_k[b]`` on; else paged, ``cu_seqlens_k`` only counts them.
    ``HEAD_DIM_V`` / ``BLOCK_DV``: v's and the output's head dim (as the forward's).
    ``REPAIR``: the repair pass (design §3.2, as the forward's). ``PAGE_BLOCK`` (paged): the
    key tiles whose block-table entries the key loop reads at once (0: per tile; the entry's
    ``page_block``). ``SPLIT`` (design §3.1, with ``KEY_CHUNK``): 0 the whole key loop; 1 one
    key chunk's partial per program, written to ``partials`` (program id 1 also counts the
    chunks, slowest), not ``o``; 2 the combine: the tile's partials merged in order into ``o``
    and ``lse``. ``partials``: float32 [chunk slots, rows, Hq, BLOCK_DV + 4] (acc, then m
    and l; ``partial_rows``), None unsplit.
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
    i_head = tl.program_id(1)  # kv head times the group's slices
    if SPLIT == 1:  # ... times the chunk slots, slowest
        i_c = i_head // ((n_heads_q // group) * slices)
        i_head = i_head % ((n_heads_q // group) * slices)
    i_hk = i_head // slices
    i_s = i_head % slices
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
    if SPLIT != 2:  # the combine reads no q, k or v
        p_q = q + (bos_q + o_q.to(tl.int64))[:, None] * stride_qt + i_h[:, None] * stride_qh
        b_q = tl.load(p_q + o_d[None, :], mask=m_row[:, None] & m_d[None, :], other=0.0)
    BLOCK_DC: tl.constexpr = BLOCK_DV // D_CHUNKS
    o_dv, m_dv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)  # [BLOCK_DV]
    o_dc, m_dc, c_v = head_dim_chunk(o_dv, m_dv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)

    if SPLIT != 2:
        if PAGE_SIZE > 0:
            bos_k = 0  # a paged sequence starts at its block-table row
        p_pages = block_table + i_b.to(tl.int64) * stride_bt
        src_k = k + bos_k * stride_kt + i_hk.to(tl.int64) * stride_kh
        src_v = v + bos_k * stride_vt + i_hk.to(tl.int64) * stride_vh
    n_lo, n_full, n_hi = visited_key_range(m_start, seqlen_k, diag, ROWS, BLOCK_N, CAUSAL,
                                           FEATURES)

    if SPLIT == 1:  # chunk i_c's partial, where the tile visits it (design §3.1); no output
        c_lo = i_c * KEY_CHUNK
        if (c_lo < n_hi) & (c_lo + KEY_CHUNK > n_lo):
            lo, mid, hi = chunk_range(c_lo, n_lo, n_full, n_hi, KEY_CHUNK)
            c_acc, c_m, c_l = empty_rows(BLOCK_M, BLOCK_DC)
            c_acc, c_m, c_l = key_range_tiles(  # [BLOCK_M, BLOCK_DC], [BLOCK_M], [BLOCK_M]
                c_acc, c_m, c_l, b_q, src_k, src_v, stride_kt, stride_vt,
                o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, lo, mid, hi,
                KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, False, FEATURES,
                        PAGE_SIZE, REPAIR, PAGE_BLOCK, KEY_CHUNK),
                p_pages, stride_kp, stride_vp,
            )
            n_rows = tl.load(cu_seqlens_q + batch).to(tl.int64)  # after the loop: no live int64
            p_part, o_part = partial_rows(partials, n_rows, i_c, bos_q + m_start, i_hk * group,
                                          o_t, o_g, n_heads_q, HEADS, BLOCK_DV)
            if (D_CHUNKS == 1) or (tl.program_id(2) == 0):
                tl.store(p_part + (o_part + BLOCK_DV), c_m, mask=m_row)
                tl.store(p_part + (o_part + BLOCK_DV + 1), c_l, mask=m_row)
            tl.store(p_part + (o_part[:, None] + o_dc[None, :]), c_acc,
                     mask=m_row[:, None] & m_dc[None, :])
    else:
        b_sink = tl.load(sinks + i_h, mask=m_row, other=0.0) if HAS_SINK else None  # [BLOCK_M]
        if SPLIT == 2:  # the partials of the chunks the tile visits, merged in order
            b_acc, b_m, b_l = empty_rows(BLOCK_M, BLOCK_DC)
            n_rows = tl.load(cu_seqlens_q + batch).to(tl.int64)  # the workspace's rows
            for c_lo in range((n_lo // KEY_CHUNK) * KEY_CHUNK, n_hi, KEY_CHUNK):
                p_part, o_part = partial_rows(partials, n_rows, c_lo // KEY_CHUNK,
                                              bos_q + m_start, i_hk * group, o_t, o_g,
                                              n_heads_q, HEADS, BLOCK_DV)
                c_acc = tl.load(p_part + (o_part[:, None] + o_dc[None, :]),
                                mask=m_row[:, None] & m_dc[None, :], other=0.0)
                c_m = tl.load(p_part + (o_part + BLOCK_DV), mask=m_row, other=float("-inf"))
                c_l = tl.load(p_part + (o_part + BLOCK_DV + 1), mask=m_row, other=0.0)
                b_acc, b_m, b_l = merge_partial(b_acc, b_m, b_l, c_acc, c_m, c_l)
            b_out, b_lse = finish_rows(b_acc, b_m, b_l, b_sink, HAS_SINK)
        else:
            b_out, b_lse = forward_tile(  # [BLOCK_M, BLOCK_DC], [BLOCK_M]
                b_q, src_k, src_v, stride_kt, stride_vt,
                o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, n_lo, n_full, n_hi,
                KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, False, FEATURES,
                        PAGE_SIZE, REPAIR, PAGE_BLOCK, KEY_CHUNK),
                BLOCK_DC, p_pages, stride_kp, stride_vp, b_sink, HAS_SINK,
            )

        o_rows = (bos_q + o_q.to(tl.int64))[:, None]
        p_o = o + o_rows * stride_ot + i_h[:, None] * stride_oh + o_dc[None, :]
        tl.store(p_o, b_out.to(o.dtype.element_ty), mask=m_row[:, None] & m_dc[None, :])
        p_lse = lse + (bos_q + o_q.to(tl.int64)) * n_heads_q + i_h
        if D_CHUNKS == 1:  # noqa: SIM114 - a constexpr branch, then a runtime one
            tl.store(p_lse, b_lse, mask=m_row)
        elif tl.program_id(2) == 0:
            tl.store(p_lse, b_lse, mask=m_row)


@triton.jit
def partial_rows(partials, n_rows, i_c, first_row, first_head, o_t, o_g, n_heads_q,
                 HEADS: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The records of a tile's rows in chunk slot ``i_c`` of the split decode's workspace
    (float32 [slots, n_rows, Hq, BLOCK_DV + 4]: the chunk's acc in the first columns, its m and
    l at ``BLOCK_DV`` and ``BLOCK_DV + 1``; ``n_rows`` = the pack's query rows,
    ``cu_seqlens_q[batch]`` as int64, so the layout needs no size beyond the call's): a scalar
    base (the tile's first row ``first_row`` and head ``first_head``, int64 math once) and the
    rows' int32 offsets [BLOCK_M] from it (tile row ``o_t`` is position ``o_t // HEADS``, head
    ``o_g`` of the group's slice). One int64 address per element instead spills at d128."""
    p_base = partials + ((i_c * n_rows + first_row) * n_heads_q + first_head) * (BLOCK_DV + 4)
    return p_base, ((o_t // HEADS) * n_heads_q + o_g) * (BLOCK_DV + 4)


def heads_per_tile(problem: VarlenProblem) -> int:
    """Query heads of one GQA group packed into a decode tile: the group, rounded up to a power
    of two, at most the tile's rows."""
    return group_heads(problem.cfg, problem.group)


def group_heads(cfg, group: int) -> int:
    """:func:`heads_per_tile` of an entry ``cfg`` and a GQA group of ``group`` query heads (a
    decode tile then holds ``decode_tiles().block_m // group_heads`` query positions)."""
    return tile_heads(group, cfg.decode_tiles().block_m)


def decode_fits(problem: VarlenProblem) -> bool:
    """Whether the decode kernel is the faster forward of an unpaged call: every query row of a
    sequence's group fits one tile, so each K/V tile is read once per kv head. (Paged calls
    always run it; either kernel gives the same bits.)"""
    tiles = problem.cfg.decode_tiles()
    return problem.max_seqlen_q * heads_per_tile(problem) <= tiles.block_m


# A decode whose unsplit grid has fewer programs than this runs each sequence's key chunks in
# programs of their own (design §3.1: with an entry's ``key_chunk``, and keys past one chunk):
# two waves of an H100's or H200's 132 SMs. The bits are the same either way.
SPLIT_BELOW_PROGRAMS = 264
# ... where the partials' workspace stays within this (float32 [slots, rows, Hq, BLOCK_DV + 4]).
SPLIT_MAX_BYTES = 1 << 28
# Off only for tests and measurements (tests/test_decode_ws.py): a split decode's partials run as
# the Gluon kernel where the unsplit one would, the Triton split's bits (perf-notes 123-124).
GLUON_SPLIT = True
# Off only for tests and measurements: the Gluon decode's swapped consumer (decode_swap.py:
# 16-row tiles, the products swapped, the same bits; perf-notes row 127) where it applies
# (:func:`swapped_decode`).
SWAP_DECODE = True


def split_slots(problem: VarlenProblem) -> int:
    """The chunk slots of a split decode of ``problem`` (the key chunks of its longest
    sequence, ``max_seqlen_k``), or 0 where it runs unsplit: no key chunk in the entry, one
    chunk of keys, or a grid that fills the GPU already (:data:`SPLIT_BELOW_PROGRAMS`)."""
    p, chunk = problem, problem.cfg.key_chunk
    if not chunk or p.max_seqlen_k <= chunk:
        return 0
    grid = _decode_grid(p, p.cfg.decode_tiles())
    slots = ceil_div(p.max_seqlen_k, chunk)
    size = slots * p.total_q * p.n_heads_q * (p.block_dv + 4) * 4
    if grid[0] * grid[1] * grid[2] >= SPLIT_BELOW_PROGRAMS or size > SPLIT_MAX_BYTES:
        return 0
    return slots


def plan_decode(problem: VarlenProblem, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                block_table, sinks=None) -> tuple[tuple[KernelLaunch, ...], torch.Tensor | None]:
    """The decode's launches writing ``out`` / ``lse`` (see ``forward.plan_forward``), and the
    workspace of its partials: one launch, or where :func:`split_slots` splits it the chunks'
    partials then their combine (design §3.1); then, where the problem has unseen keys, the
    repair pass (design §3.2).

    q: [total_q, Hq, D]; k, v: packed [total_k, Hkv, D] (``problem.page_size`` 0) or paged
    caches [num_pages, page_size, Hkv, D]; block_table: int32 [B, pages_per_seq] (paged) or
    None; sinks: float32 [Hq] or None. The workspace: float32 [slots, total_q, Hq, Dv
    padded + 4] (``partial_rows``) or None.
    """
    p = problem
    slots = p.memo.get("decode_slots")
    if slots is None:
        slots = p.memo["decode_slots"] = split_slots(p)
    partials = None
    if slots:
        shape = (slots, p.total_q, p.n_heads_q, p.block_dv + 4)
        partials = new_buffer(shape, torch.float32, q.device)
    if p.page_size:
        stride_kp, stride_kt, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        stride_vp, stride_vt, stride_vh = v.stride(0), v.stride(1), v.stride(2)
        table, stride_bt = block_table, block_table.stride(0)
    else:
        stride_kp, stride_kt, stride_kh = 0, k.stride(0), k.stride(1)
        stride_vp, stride_vt, stride_vh = 0, v.stride(0), v.stride(1)
        table, stride_bt = cu_seqlens_k, 0  # not read
    args = (
        q, k, v, out, lse, table, partials,
        cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), stride_kp, stride_kt, stride_kh, stride_vp, stride_vt,
        stride_vh, out.stride(0), out.stride(1), stride_bt,
        p.batch, p.n_heads_q, p.group, p.scale_log2,
    )
    stages = ("decode_split", "decode_combine") if slots else ("decode",)
    stages += ("decode_repair",) * p.has_unseen_keys
    launches = []
    if gluon_decode_applies(p, q, k, v, slots):  # the Gluon kernel, the same bits
        launches.append(_gluon_launch(stages[0], p, q, k, v, out, lse, cu_seqlens_q,
                                      cu_seqlens_k, block_table, partials, slots))  # fmt: skip
        stages = stages[1:]  # it runs the decode, or the split's partials
    for stage in stages:
        key = (stage, p.page_size, sinks is None)
        static = p.memo.get(key)
        if static is None:  # the grid and compile-time parameters: the problem's alone
            static = p.memo[key] = _decode_static(p, p.page_size, sinks is not None, stage, slots)
        grid, params = static
        launches.append(KernelLaunch(stage, attn_decode_kernel, grid, args,
                                     dict(params, sinks=sinks), tma=False))
    return tuple(launches), partials


def gluon_decode_applies(p: VarlenProblem, q, k, v, slots: int = 0) -> bool:
    """Whether the decode (``slots`` > 0: the partials of a split one, :data:`GLUON_SPLIT`)
    runs as the Gluon kernel (``decode_ws.py``): the entry selects it (``decode_ws``) and
    ``plan.gluon_applies``' rule holds (the descriptor path: rows 16-byte aligned, a paged
    cache's pages one after the other), and the call is in its scope: no chunk merge in the key
    loop (a split program's chunk is its loop), one head-dim chunk, a GQA group in one tile,
    pages it copies (``decode_ws.pages_fit``). Else ``attn_decode_kernel`` runs it, with the
    same bits."""
    cfg = p.cfg
    if not cfg.decode_ws or slots and not GLUON_SPLIT:
        return False
    tiles = cfg.decode_tiles()
    tma = rows_aligned(q, k, v) and (not p.page_size or pages_contiguous(k) and pages_contiguous(v))
    supports = decode_ws.decode_ws_supports if decode_ws else None
    kernel = decode_ws.attn_decode_ws_kernel if decode_ws else None
    if not gluon_applies("decode_ws", True, kernel, supports, tiles, p, tma):
        return False
    return ((slots > 0 or not p.chunk_flags()) and cfg.fwd_chunks == 1
            and heads_per_tile(p) >= p.group
            and decode_ws.pages_fit(p.page_size, tiles.block_n))  # fmt: skip


def swapped_decode(p: VarlenProblem) -> bool:
    """Whether the Gluon decode of ``p`` runs its swapped consumer (:data:`SWAP_DECODE`): not
    split-P, and each sequence's query rows (its GQA group times its positions) in one 16-row
    tile."""
    if not SWAP_DECODE or p.split_p:
        return False
    rows = decode_ws.SWAP_ROWS.value
    heads = tile_heads(p.group, rows)
    return heads >= p.group and p.grid_rows_q <= rows // heads


def _gluon_launch(stage: str, p: VarlenProblem, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                  block_table, partials, slots: int) -> KernelLaunch:  # fmt: skip
    """The Gluon decode's launch (``gluon_decode_applies``): the unsplit grid (split: its kv
    heads times the ``slots`` chunks, the partials into ``partials``), k and v as ragged
    descriptors (a paged cache's as its token rows)."""
    tiles = p.cfg.decode_tiles()
    swap = swapped_decode(p)
    static = p.memo.get(("decode_ws", p.page_size, slots, swap))
    if static is None:  # the grid, parameters and descriptors: the problem's alone
        chunk = p.cfg.key_chunk if slots else 0
        rows = decode_ws.SWAP_ROWS.value if swap else tiles.block_m
        params = decode_ws.decode_ws_params(p.head_dim, tiles, tile_heads(p.group, rows),
                                            p.page_size, p.causal, p.split_p, chunk,
                                            swap)  # fmt: skip
        reads = decode_ws.decode_ws_reads(tiles.block_n, p.page_size, p.head_dim)
        blocks, heads, _ = decode_grid(p.grid_rows_q, p.batch, p.n_heads_k, p.group, rows,
                                       p.cfg.fwd_chunks)  # fmt: skip
        grid = (blocks, heads * max(slots, 1))
        static = p.memo[("decode_ws", p.page_size, slots, swap)] = (grid, params, reads)
    grid, params, reads = static
    args = decode_ws.decode_ws_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, block_table,
                                    p.batch, p.group, p.scale_log2, partials)  # fmt: skip
    return KernelLaunch(stage, decode_ws.attn_decode_ws_kernel, grid, args, params,
                        descriptors=reads)


def _decode_static(p: VarlenProblem, page_size: int, has_sink: bool, stage: str = "decode",
                   slots: int = 0) -> tuple[tuple, dict]:
    """A decode launch's grid and its compile-time parameters but ``sinks`` (a tensor):
    ``stage`` decode (the whole key loop), decode_split (``slots`` chunks' partials),
    decode_combine (their merge) or decode_repair (design §3.2)."""
    cfg = p.cfg
    repair = stage == "decode_repair"
    tiles = repair_tiles(cfg.decode_tiles()) if repair else cfg.decode_tiles()
    heads = heads_per_tile(p)
    grid = _decode_grid(p, tiles)
    params = dict(
        HEAD_DIM=p.head_dim, BLOCK_D=p.block_d, **p.value_flags(),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, HEADS=heads, PAGE_SIZE=page_size,
        PAGE_BLOCK=page_block_tiles(cfg.page_block, page_size),
        CAUSAL=p.causal, SPLIT_P=p.split_p, INTERPRET=p.interpret, D_CHUNKS=cfg.fwd_chunks,
        **p.feature_flags(), HAS_SINK=has_sink, **tiles.launch_kwargs(), **p.chunk_flags(),
    )
    if repair:
        params.update(REPAIR=p.cfg.repair_products)
    if stage == "decode_split":
        grid = (grid[0], grid[1] * slots, grid[2])
        params.update(SPLIT=1)
    elif stage == "decode_combine":
        params.update(SPLIT=2)
    return grid, params


def page_block_tiles(family_tiles: int, page_size: int) -> int:
    """The key tiles a decode program reads the block table for at once (``page_block``): the
    family's (``rows.PAGE_BLOCK``) for a cache whose pages are a power of two rows, so a key
    tile holds whole pages or lies in one; else 0, a table read per tile: a packed K/V, and a
    dense cache whose "page" (its S_cache rows) is not a power of two (9 rows: a tile of 64
    keys would span 7.1 pages, a Triton range of 7)."""
    if page_size <= 0 or page_size & (page_size - 1):
        return 0
    return family_tiles


def _decode_grid(p: VarlenProblem, tiles) -> tuple[int, int, int]:
    """The unsplit decode grid: (position tiles x sequences, kv heads x the group's head
    slices, head-dim chunks)."""
    return decode_grid(p.grid_rows_q, p.batch, p.n_heads_k, p.group, tiles.block_m,
                       p.cfg.fwd_chunks)  # fmt: skip
