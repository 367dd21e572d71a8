"""Forward kernel: online-softmax attention over a packed (varlen) batch, with LSE export.

One program per (query tile of one sequence, query head). Key tiles are visited in ascending
order, anchored at the sequence's own key start: first the tiles every row of the query tile
fully sees (no mask), then the tiles that need a mask (causal diagonal, sequence end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from portattn.kernels import descriptors
from portattn.kernels.addressing import (
    TMA_HOST,
    head_dim_chunk,
    key_value_tiles,
    query_tile,
    ragged_source,
    ragged_tile,
    row_strides,
    row_tiles,
    seq_bounds,
    tile_index,
    value_columns,
)
from portattn.kernels.buffers import check_row_strides, new_buffer, rows_aligned
from portattn.kernels.decode import decode_fits, plan_decode
from portattn.kernels.descriptors import HostDescriptor, ragged_arguments
from portattn.kernels.plan import (
    KernelLaunch,
    VarlenProblem,
    gluon_applies,
    repair_tiles,
    run_launches,
)
from portattn.kernels.primitives import (
    KeyLoop,
    forward_tile,
    visited_key_range,
)
from portattn.kernels.repair_checks import REPAIR_HEADS, head_is_bad, repair_head_block
from portattn.kernels.ws_kernels import attn_fwd_ws_kernel, ws_launch_options, ws_supports


@triton.jit
def attn_fwd_kernel(
    q, k, v, o, lse, o32,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_o32t, stride_o32h,
    batch, n_heads_q, group, scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT_P: tl.constexpr,
    STORE_O32: tl.constexpr,
    INTERPRET: tl.constexpr,
    D_CHUNKS: tl.constexpr,
    TMA: tl.constexpr,
    FEATURES: tl.constexpr,
    HAS_SINK: tl.constexpr,
    sinks,
    REPAIR: tl.constexpr = 0,
    KEY_CHUNK: tl.constexpr = 0,
):
    """One program per (query tile of one sequence, query head, head-dim chunk). With
    ``D_CHUNKS`` = 2 each program computes the scores and softmax over the whole head dim and
    the output for half of its columns (one [BLOCK_M, D / 2] accumulator), for head dims whose
    full accumulator does not fit beside the tiles; program 0 of the pair writes lse. ``TMA``:
    Q, K and V tiles are read through the launch's ragged host descriptors (``TMA_HOST``: q, k
    and v are descriptors) or the program's per-sequence descriptors (``row_tiles``).
    ``FEATURES`` (``primitives.Features``): with a window side >= 0 a sliding window
    (``feature_mask``); only the key tiles some row of the tile sees are visited
    (``visited_key_range``). With a cap > 0: the
    scores are softcapped (``softcap_scores``). ``HAS_SINK``: float32 ``sinks`` [Hq] (else
    None), the heads' attention sinks (``fold_sink``). ``HEAD_DIM_V`` / ``BLOCK_DV``: v's and
    the output's head dim and its padded width (q's and k's: ``HEAD_DIM`` / ``BLOCK_D``).
    ``REPAIR``: the repair pass after a first pass of the same tiles (design §3.2), one
    program per (query tile, head-dim chunk) over all heads: it recomputes, with masked tiles
    through ``mma_visible``, the heads' tiles that the first pass wrote with a NaN or an
    infinity."""
    stride_qt, stride_qh = row_strides(stride_qt, stride_qh, HEAD_DIM)
    stride_kt, stride_kh = row_strides(stride_kt, stride_kh, HEAD_DIM)
    stride_vt, stride_vh = row_strides(stride_vt, stride_vh, HEAD_DIM_V)
    stride_ot, stride_oh = row_strides(stride_ot, stride_oh, HEAD_DIM_V)
    stride_o32t, stride_o32h = row_strides(stride_o32t, stride_o32h, HEAD_DIM_V)
    if REPAIR:
        # One program per (query tile, chunk), over all query heads: it tests one row a slab of
        # each head's tile (``repair_head_block``, ``REPAIR_HEADS`` heads a load) and
        # recomputes the tiles that hold a NaN or an infinity. So the pass is as many programs
        # as the first pass has query tiles per head: about one wave, where one program per
        # (tile, head) took one wave per 132 programs of the first pass's resources.
        i_b, i_m = tile_index(batch, CAUSAL)
        bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
        bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
        m_start = i_m * BLOCK_M
        if m_start >= seqlen_q:
            return
        o_d = tl.arange(0, BLOCK_D)
        o_rv, m_rv = value_columns(o_d, o_d < HEAD_DIM, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)
        o_rc, m_rc, _ = head_dim_chunk(o_rv, m_rv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)
        for h_first in range(0, n_heads_q, REPAIR_HEADS):
            o_h, b_bad = repair_head_block(o, stride_ot, stride_oh, bos_q, h_first, n_heads_q,
                                           m_start, seqlen_q, o_rc, m_rc, BLOCK_M)
            for h in range(h_first, tl.minimum(h_first + REPAIR_HEADS, n_heads_q)):
                i_h = tl.program_id(1) + h  # program id 1 is 0: the head as a tensor
                if head_is_bad(o_h, b_bad, i_h):
                    forward_program(
                        q, k, v, o, lse, o32, stride_qt, stride_qh, stride_kt, stride_kh,
                        stride_vt, stride_vh, stride_ot, stride_oh, stride_o32t, stride_o32h,
                        n_heads_q, scale_log2, sinks, i_h, i_h // group, bos_q, seqlen_q,
                        bos_k, seqlen_k, m_start, HEAD_DIM, BLOCK_D, HEAD_DIM_V, BLOCK_DV,
                        BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, INTERPRET, D_CHUNKS, TMA,
                        FEATURES, HAS_SINK, REPAIR, KEY_CHUNK,
                    )
    else:
        i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start = query_tile(
            cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
        if m_start >= seqlen_q:
            return
        forward_program(
            q, k, v, o, lse, o32, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
            stride_vh, stride_ot, stride_oh, stride_o32t, stride_o32h, n_heads_q, scale_log2,
            sinks, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start, HEAD_DIM, BLOCK_D,
            HEAD_DIM_V, BLOCK_DV, BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, STORE_O32, INTERPRET,
            D_CHUNKS, TMA, FEATURES, HAS_SINK, REPAIR, KEY_CHUNK,
        )


@triton.jit
def forward_program(
    q, k, v, o, lse, o32,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_o32t, stride_o32h,
    n_heads_q, scale_log2, sinks,
    i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SPLIT_P: tl.constexpr, STORE_O32: tl.constexpr, INTERPRET: tl.constexpr,
    D_CHUNKS: tl.constexpr, TMA: tl.constexpr, FEATURES: tl.constexpr, HAS_SINK: tl.constexpr,
    REPAIR: tl.constexpr, KEY_CHUNK: tl.constexpr = 0,
):
    """The forward of one query tile (rows from ``m_start``) of one query head ``i_h``: the
    kernel's parameters (strides in elements, ``row_strides``'), the tile's sequence bounds,
    and its output, lse and float32 output written."""
    diag = seqlen_k - seqlen_q

    o_q = m_start + tl.arange(0, BLOCK_M)  # [BLOCK_M] positions in the sequence
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    if TMA == TMA_HOST:  # q, k and v are the launch's ragged descriptors
        b_q = ragged_tile(ragged_source(q, i_h, bos_q, seqlen_q), m_start, 0)
    elif TMA:
        p_q = q + bos_q * stride_qt + i_h.to(tl.int64) * stride_qh
        src_q = row_tiles(p_q, seqlen_q, stride_qt, HEAD_DIM, BLOCK_M, BLOCK_D)
        b_q = src_q.load([m_start, 0])  # [BLOCK_M, BLOCK_D]
    else:
        m_q = (o_q < seqlen_q)[:, None] & m_d[None, :]
        p_q = q + (bos_q + o_q.to(tl.int64))[:, None] * stride_qt + i_h.to(tl.int64) * stride_qh
        b_q = tl.load(p_q + o_d[None, :], mask=m_q, other=0.0)  # [BLOCK_M, BLOCK_D]
    # Output columns of this program: all of v's, or one chunk (from column c_v).
    BLOCK_DC: tl.constexpr = BLOCK_DV // D_CHUNKS
    o_dv, m_dv = value_columns(o_d, m_d, HEAD_DIM, HEAD_DIM_V, BLOCK_DV)  # [BLOCK_DV]
    o_dc, m_dc, c_v = head_dim_chunk(o_dv, m_dv, HEAD_DIM_V, BLOCK_DV, D_CHUNKS)
    m_o = (o_q < seqlen_q)[:, None] & m_dc[None, :]  # m_q when unchunked
    src_k, src_v = key_value_tiles(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh, stride_vt,
                                   stride_vh, HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_DC, TMA,
                                   HEAD_DIM_V)

    n_lo, n_full, n_hi = visited_key_range(m_start, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL,
                                           FEATURES)

    b_sink = tl.load(sinks + i_h) if HAS_SINK else None  # the head's sink, natural log
    b_out, b_lse = forward_tile(  # [BLOCK_M, BLOCK_DC], [BLOCK_M]
        b_q, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, n_lo, n_full, n_hi,
        KeyLoop(BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, INTERPRET, TMA, FEATURES, 0, REPAIR, 0,
                KEY_CHUNK), BLOCK_DC, b_sink=b_sink, HAS_SINK=HAS_SINK,
    )

    o_rows = (bos_q + o_q.to(tl.int64))[:, None]
    p_o = o + o_rows * stride_ot + i_h.to(tl.int64) * stride_oh + o_dc[None, :]
    tl.store(p_o, b_out.to(o.dtype.element_ty), mask=m_o)
    p_lse = lse + (bos_q + o_q.to(tl.int64)) * n_heads_q + i_h
    if D_CHUNKS == 1:  # noqa: SIM114 - a constexpr branch, then a runtime one
        tl.store(p_lse, b_lse, mask=o_q < seqlen_q)
    elif tl.program_id(2) == 0:
        tl.store(p_lse, b_lse, mask=o_q < seqlen_q)
    if STORE_O32:
        p_o32 = o32 + o_rows * stride_o32t + i_h.to(tl.int64) * stride_o32h + o_dc[None, :]
        tl.store(p_o32, b_out, mask=m_o)


def use_warp_specialized(problem: VarlenProblem, tma: bool) -> bool:
    """Whether the forward runs as the warp-specialised Gluon kernel (``forward_ws.py``), in
    one program per query tile (``plan.gluon_applies``)."""
    cfg = problem.cfg  # fwd_ws implies fwd_chunks == 1 (checked when the entry is made)
    return gluon_applies("fwd_ws", cfg.fwd_ws, attn_fwd_ws_kernel, ws_supports, cfg.fwd,
                         problem, tma)


@dataclass(frozen=True)
class ForwardPlan:
    """The forward's outputs (out [total_q, Hq, D] in q's dtype, lse float32 [total_q, Hq],
    natural log; out32 float32 [total_q, Hq, D] or None) and the launch that writes them (none
    for an empty pack)."""

    out: torch.Tensor
    lse: torch.Tensor
    out32: torch.Tensor | None
    launches: tuple[KernelLaunch, ...]
    # A workspace: the split decode's partials (decode.plan_decode, design §3.1) or the Gluon
    # forward's parked accumulators (float32, out's shape), else None.
    partials: torch.Tensor | None = None


def plan_forward(problem: VarlenProblem, q, k, v, cu_seqlens_q, cu_seqlens_k,
                 store_o32: bool, block_table: torch.Tensor | None = None,
                 sinks: torch.Tensor | None = None,
                 lse: torch.Tensor | None = None) -> ForwardPlan:
    """Allocate the forward's outputs and plan its launch. ``lse``: float32 [total_q, Hq]
    contiguous to write the lse to (a caller's scratch), or None for a new buffer.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D], or paged caches [num_pages, page_size, Hkv,
    D] with ``block_table`` int32 [B, pages_per_seq]; cu_seqlens_*: int32 [B + 1]. ``store_o32``:
    also write a float32 copy of out (the split-P backward's row term reads it; not paged).
    Paged calls, and calls whose sequences' query rows fit one decode tile, run the decode
    kernel (``decode.py``: the same bits, K/V read once per kv head).
    """
    p, cfg = problem, problem.cfg
    check_row_strides(q, k, v)  # the kernels' row_strides
    out_shape = (p.total_q, p.n_heads_q, p.value_dim)  # v's head dim
    out = new_buffer(out_shape, q.dtype, q.device)
    if lse is None:
        lse = new_buffer((p.total_q, p.n_heads_q), torch.float32, q.device)
    elif lse.shape != (p.total_q, p.n_heads_q) or lse.dtype != torch.float32:
        raise ValueError(f"lse buffer must be float32 {(p.total_q, p.n_heads_q)}, got "
                         f"{lse.dtype} {tuple(lse.shape)}")
    out32 = new_buffer(out_shape, torch.float32, q.device) if store_o32 else None
    if p.total_q == 0 or p.batch == 0:
        return ForwardPlan(out, lse, out32, ())
    fits = p.memo.get("decode_fits")
    if fits is None:
        fits = p.memo["decode_fits"] = decode_fits(p)
    if p.page_size or (not store_o32 and fits):
        launches, partials = plan_decode(p, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                         block_table, sinks)
        return ForwardPlan(out, lse, out32, launches, partials)
    tma = "fwd" in cfg.tma and rows_aligned(q, k, v)
    key = ("fwd", store_o32, tma, sinks is None)
    static = p.memo.get(key)
    if static is None:  # the grid and compile-time parameters: the problem's alone
        static = p.memo[key] = _forward_static(p, store_o32, tma, sinks is not None)
    grid, ws, params, reads = static
    # The Gluon forward parks its running accumulators between key-chunk merges in o32's rows:
    # a float32 workspace of out's shape where the call keeps no float32 copy.
    park = None
    if ws and "KEY_CHUNK" in params and not store_o32:
        park = new_buffer(out_shape, torch.float32, q.device)
    o32_arg = out32 if store_o32 else park  # the kernel's o32: a float32 tensor or ...
    if o32_arg is None:  # ... out, unread (no STORE_O32, no KEY_CHUNK)
        o32_arg = out
    args = (
        q, k, v, out, lse, o32_arg,
        cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), o32_arg.stride(0), o32_arg.stride(1),
        p.batch, p.n_heads_q, p.group, p.scale_log2,
    )
    # The warp-specialised Gluon kernel computes the same bits; it reads through descriptors
    # and has no interpreter.
    # Either kernel takes its descriptors from the launch (reads): it makes none, so it needs
    # no scratch.
    if ws:
        launch = KernelLaunch("fwd", attn_fwd_ws_kernel, grid, args, dict(params), False,
                              descriptors=reads)
    else:
        launch = KernelLaunch("fwd", attn_fwd_kernel, grid, args, dict(params, sinks=sinks),
                              descriptors=reads)
    if not p.has_unseen_keys:
        return ForwardPlan(out, lse, out32, (launch,), park)
    # Design §3.2: the Triton kernel of the same tiles repairs tiles that hold a NaN or inf.
    repair_key = ("fwd_repair", store_o32, tma, sinks is None)
    repair = p.memo.get(repair_key)
    if repair is None:
        repair = p.memo[repair_key] = _forward_static(p, store_o32, tma, sinks is not None, True)
    fix = KernelLaunch("fwd_repair", attn_fwd_kernel, repair[0], args,
                       dict(repair[2], sinks=sinks), descriptors=repair[3])
    return ForwardPlan(out, lse, out32, (launch, fix), park)


def _triton_descriptors(params: dict) -> tuple:
    """The ragged host descriptors of ``attn_fwd_kernel``'s q, k and v for a launch with
    ``params`` (``TMA_HOST``): Q [BLOCK_M, BLOCK_D], K [BLOCK_N, BLOCK_D] and V [BLOCK_N,
    BLOCK_DV / D_CHUNKS] tiles."""
    block_m, block_n, block_d = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_D"]
    block_dc = params["BLOCK_DV"] // params["D_CHUNKS"]
    return ragged_arguments(attn_fwd_kernel, q=(block_m, block_d), k=(block_n, block_d),
                            v=(block_n, block_dc))  # fmt: skip


def _forward_static(p: VarlenProblem, store_o32: bool, tma: bool, has_sink: bool,
                    repair: bool = False) -> tuple[tuple, bool, dict, tuple[HostDescriptor, ...]]:
    """The forward launch's grid, whether the Gluon kernel runs it, its compile-time
    parameters but ``sinks`` (a tensor), and the arguments it takes as ragged host descriptors
    (``KernelLaunch.descriptors``); ``repair``: those of its repair pass (design §3.2), the
    Triton kernel of the same key tiles (``plan.repair_tiles``)."""
    cfg = p.cfg
    gluon = not repair and use_warp_specialized(p, tma)
    tiles = cfg.fwd if gluon else cfg.triton_fwd_tiles()
    if repair:
        tiles = repair_tiles(tiles)
    # A repair program covers every head of its query tile (attn_fwd_kernel's REPAIR).
    heads = 1 if repair else p.n_heads_q
    grid = (triton.cdiv(p.grid_rows_q, tiles.block_m) * p.batch, heads, cfg.fwd_chunks)
    flags = dict(HEAD_DIM=p.head_dim, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                 CAUSAL=p.causal, SPLIT_P=p.split_p, STORE_O32=store_o32)
    if gluon:
        # q, k, v and out as ragged descriptors, Q and out by the consumer groups' tiles
        group_rows = 64  # forward_ws's consumer groups: two or three of 64 rows
        reads = ragged_arguments(attn_fwd_ws_kernel, q=group_rows, k=tiles.block_n,
                                 v=tiles.block_n, o=group_rows)  # fmt: skip
        return grid, True, dict(flags, STAGES=tiles.num_stages, **ws_launch_options(tiles),
                                **p.chunk_flags()), reads
    params = dict(flags, BLOCK_D=p.block_d, **p.value_flags(), INTERPRET=p.interpret,
                  D_CHUNKS=cfg.fwd_chunks, TMA=descriptors.TMA_HOST if tma else False,
                  **p.feature_flags(),  # the options' kernel flags
                  HAS_SINK=has_sink, **tiles.launch_kwargs(), **p.chunk_flags())
    if repair:
        params.update(REPAIR=p.cfg.repair_products)
    return grid, False, params, _triton_descriptors(params) if tma else ()


def attn_fwd(problem: VarlenProblem, q, k, v, cu_seqlens_q, cu_seqlens_k, store_o32: bool,
             before_launch: Callable[[], object] | None = None,
             block_table: torch.Tensor | None = None,
             sinks: torch.Tensor | None = None,
             lse: torch.Tensor | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Plan and launch the forward: returns (out, lse, out32 or None), see
    :class:`ForwardPlan`. ``before_launch``: the caller's checks that need a host copy (they
    may raise), run from the launch itself, after the host-side set-up (``run_launches``).
    ``lse``: the buffer the lse is written to (None: a new one). The ops plan through
    ``portattn.forward_replay`` instead (the same ``plan_forward`` and ``run_launches``); this
    goes, with its two imports, at the next change of this file's kernels (removing the
    imports moves every kernel's lines, so every compile key)."""
    plan = plan_forward(problem, q, k, v, cu_seqlens_q, cu_seqlens_k, store_o32, block_table,
                        sinks, lse)
    run_launches(plan.launches, q.device, before_launch)
    return plan.out, plan.lse, plan.out32
