"""Hopper decode kernel in Gluon: the Gluon forward's key loop on a decode tile (issue 37).

A decode program of ``decode.py`` (one per position tile of a sequence and kv head, its 64 rows
the GQA group's query heads times the positions) spends its time on each key tile's own work,
not on DRAM (perf-notes rows 112, 120): Triton waits for each ``wgmma`` right after issuing
it. This kernel runs the same tile through ``forward_ws``'s steps instead (``first_scores``,
``next_tile``, ``last_pv``: the next tile's ``Q K^T`` and this tile's ``P V`` issued together,
the softmax under them), as one consumer warp group of 64 rows fed by a producer warp:

* the program's Q rows (row ``t``: position ``m_start + t // HEADS``, group head ``t % HEADS``,
  as ``attn_decode_kernel``) are gathered by pointer loads into shared memory before the
  partitions fork; rows past the sequence or the group read 0 and are not stored;
* the producer copies K and V tiles by TMA into a ring of ``STAGES`` slots through ragged host
  descriptors (``descriptors.py``): of the packed tensors [total_k, Hkv, D], or (``PAGE_SIZE``
  > 0) of the paged caches seen as [num_pages * PAGE_SIZE, Hkv, D]: one copy a tile where a
  page holds whole tiles, else one per page and 64 columns (``_copy_keys``); a page's rows
  past the sequence's keys read 0, as past a packed sequence's end.

Bits. Each row's are the prefill's: the same key tiles (BLOCK_N of the forward entry), in
ascending order, through the same expressions (``forward_ws``'s steps, which give the Triton
forward's bits; ``normalize_rows``). Which rows share a tile does not enter a row's
arithmetic. The GPU checks are ``tests/test_decode_ws.py`` and ``ci/gluon_decode_ab.py``
(bitwise against ``decode.py``; the second also times both).

Split decode (``KEY_CHUNK`` > 0; design §3.1): one program per (tile, kv head, key chunk)
writes the chunk's partial (acc, m, l) to ``attn_decode_kernel``'s workspace (``partial_rows``'
layout), which its combine (``SPLIT`` 2) merges: the consumer runs the chunk's tiles as a
loop of their own (key positions, ``seqlen_k``, ``diag`` and ``t_full`` counted from the chunk's
first key, which moves no mask), the producer copies them at their own positions.

Scope (the rest runs ``decode.py``): no window, score cap or sinks, no chunk merge in the key
loop, no repair pass, whole GQA groups of at most 64 heads, head dims 64 and 128, pages of at
least 8 rows that divide the key tile or that it divides. The planner runs it where the entry
sets ``decode_ws`` and the call is in this scope (``decode.gluon_decode_applies``): the sm90
d128 entries of both kernels (d64 stays on ``decode.py``, which was faster there: perf-notes
row 122); the split decode too where ``decode.GLUON_SPLIT`` is set (on: the same bits).
"""

from __future__ import annotations

from typing import NamedTuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from portattn.configs import Tiles
from portattn.kernels import ws_common as ws
from portattn.kernels.addressing import seq_bounds, tile_index
from portattn.kernels.decode_rows import gather_q, store_tile
from portattn.kernels.decode_swap import SWAP_ROWS, consume_swapped, p_tiles_shape
from portattn.kernels.descriptors import ragged_arguments, with_descriptors
from portattn.kernels.forward_ws import all_keys
from portattn.kernels.plan import LOG2E, decode_grid, tile_heads

# The producer warp's registers: its per-page copies (pages of 16 rows: 16 a tile) spilled at
# the forward's 24; with one consumer group a program has registers to spare.
PRODUCER_REGS = gl.constexpr(48)


class _Decode(NamedTuple):
    """The runtime state of one decode program, read by name by both partitions and by
    ``forward_ws``'s steps (which read the ring, its barriers, ``t_full``, ``seqlen_k``,
    ``diag`` and ``scale_log2``: a split program's counted from its chunk's first key)."""

    q_smem: gl.shared_memory_descriptor  # [BLOCK_M, HEAD_DIM]: the tile's Q rows
    k_ring: gl.shared_memory_descriptor  # [STAGES, BLOCK_N, HEAD_DIM]
    v_ring: gl.shared_memory_descriptor
    k_bars: gl.shared_memory_descriptor
    v_bars: gl.shared_memory_descriptor
    free_bars: gl.shared_memory_descriptor
    o: gl.tensor  # [total_q, Hq, D]
    lse: gl.tensor  # [total_q, Hq]
    stride_ot: gl.tensor
    stride_oh: gl.tensor
    bos_q: gl.tensor
    seqlen_q: gl.tensor
    seqlen_k: gl.tensor
    diag: gl.tensor
    t_full: gl.tensor
    n_tiles: gl.tensor
    m_start: gl.tensor
    i_hk: gl.tensor
    group: gl.tensor
    n_heads_q: gl.tensor
    scale_log2: gl.tensor
    # The producer's: K / V ragged descriptors, the sequence's first key row (packed), its
    # block-table row (paged), its keys and the first key the program reads (split: its
    # chunk's; else 0).
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    bos_k: gl.tensor
    pages: gl.tensor
    keys: gl.tensor
    key_off: gl.tensor
    # A split program's: the workspace, the call's query rows (its layout) and the chunk.
    partials: gl.tensor
    n_rows: gl.tensor
    i_c: gl.tensor
    # The swapped consumer's (``SWAP``): P^T tiles for P V's B operand (``decode_swap.py``).
    p_smem: gl.shared_memory_descriptor


@gluon.jit
def _consumer(consume: gl.constexpr, st, cfg):
    """The consumer partition: ``consume`` (``_consume``, or ``SWAP``'s ``consume_swapped``)."""
    consume(st, cfg)


@gluon.jit
def _consume(st, cfg):
    """The consumer warp group: the key loop (``forward_ws.all_keys``), then the rows' out and
    lse (or a split program's partial) by pointer stores."""
    s_layout: gl.constexpr = ws.acc_layout(cfg.BLOCK_N)
    o_layout: gl.constexpr = ws.acc_layout(cfg.HEAD_DIM)
    p_layout: gl.constexpr = ws.operand_layout(o_layout)
    b_acc, b_m, b_l = all_keys(st.q_smem, st, cfg, st.m_start, s_layout, o_layout, p_layout)
    store_tile(st, cfg, b_acc, b_m, b_l, o_layout)


@gluon.jit
def _copy_keys(desc, st, cfg, key0, bar, tile):
    """Keys [key0, key0 + BLOCK_N) of the sequence into ``tile``: one ragged copy (packed, or
    a tile inside one page), or (pages smaller than the tile) one per page and 64 columns.

    A [BLOCK_N, HEAD_DIM] tile of ``SWIZZLED_128B`` holds its 64-column halves one after the
    other ([HEAD_DIM // 64, BLOCK_N, 64]: 128-byte rows, as the TMA copy writes them), so a
    page's rows are a slice of each half; ``desc`` then copies [PAGE_SIZE, 64] boxes (a copy
    into a row slice of the whole tile put its second half at the slice's offset, not the
    tile's: session 47's H100 run)."""
    BLOCK_N: gl.constexpr = cfg.BLOCK_N
    PAGE_SIZE: gl.constexpr = cfg.PAGE_SIZE
    keys = st.seqlen_k
    if cfg.KEY_CHUNK > 0:  # the consumer's seqlen_k counts from the chunk's first key
        keys = st.keys
    if PAGE_SIZE == 0:
        ws.ragged_load(desc, st.bos_k, keys, key0, st.i_hk, bar, tile)
    elif PAGE_SIZE >= BLOCK_N:
        page = gl.load(st.pages + key0 // PAGE_SIZE)
        first = key0 // PAGE_SIZE * PAGE_SIZE  # the page's first key
        ws.ragged_load(desc, page.to(gl.int64) * PAGE_SIZE,
                       gl.minimum(keys - first, PAGE_SIZE), key0 - first, st.i_hk, bar,
                       tile)
    else:
        HALVES: gl.constexpr = cfg.HEAD_DIM // 64
        halves = ws.as_shape(tile, [HALVES * BLOCK_N, 64], ws.SWIZZLED_128B)
        for i in gl.static_range(BLOCK_N // PAGE_SIZE):
            first = key0 + i * PAGE_SIZE
            # A page past the sequence's keys is not in its block-table row: page 0's rows,
            # read as none (0 rows), keep the copy's byte count.
            page = gl.load(st.pages + first // PAGE_SIZE, mask=first < keys, other=0)
            rows = gl.maximum(gl.minimum(keys - first, PAGE_SIZE), 0)
            for c in gl.static_range(HALVES):
                ws.ragged_load(desc, page.to(gl.int64) * PAGE_SIZE, rows, 0, st.i_hk, bar,
                               halves.slice(c * BLOCK_N + i * PAGE_SIZE, PAGE_SIZE), c * 64)


@gluon.jit
def _produce(st, cfg):
    """One warp: K and V tiles into the ring as the consumer frees its slots."""
    STAGES: gl.constexpr = cfg.STAGES
    COPIES: gl.constexpr = copies_per_tile(cfg.BLOCK_N, cfg.PAGE_SIZE, cfg.HEAD_DIM)
    for i_tile in range(st.n_tiles):
        slot = i_tile % STAGES
        ws.wait_free(st.free_bars, i_tile, STAGES)
        mbarrier.expect(st.k_bars.index(slot), st.k_desc.block_type.nbytes * COPIES)
        _copy_keys(st.k_desc, st, cfg, st.key_off + i_tile * cfg.BLOCK_N,
                   st.k_bars.index(slot), st.k_ring.index(slot))
        mbarrier.expect(st.v_bars.index(slot), st.v_desc.block_type.nbytes * COPIES)
        _copy_keys(st.v_desc, st, cfg, st.key_off + i_tile * cfg.BLOCK_N,
                   st.v_bars.index(slot), st.v_ring.index(slot))


@gluon.constexpr_function
def copies_per_tile(block_n, page_size, head_dim):
    """The TMA copies of one K (or V) tile: one, or per page and 64 columns (``_copy_keys``).
    (A constexpr function: the kernel's and the host's.)"""
    if page_size == 0 or page_size >= block_n:
        return 1
    return block_n // page_size * (head_dim // 64)


@gluon.jit
def attn_decode_ws_kernel(
    q, k, v, o, lse, block_table, partials,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    batch, n_heads_q, group, scale_log2,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEADS: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAUSAL: gl.constexpr,
    SPLIT_P: gl.constexpr,
    STAGES: gl.constexpr,
    KEY_CHUNK: gl.constexpr = 0,
    SWAP: gl.constexpr = False,
):
    """Program ids: 0 = (position tile, sequence) as ``tile_index`` decodes it; 1 = kv head
    (``KEY_CHUNK`` > 0: times the key chunks, slowest, as ``attn_decode_kernel``'s ``SPLIT``
    1). q [total_q, Hq, D] (pointer loads); k, v: ragged host descriptors of the packed K/V or
    of the paged caches as token rows; block_table int32 [B, pages] (paged; else not read);
    partials: the split's workspace (else None). ``SWAP``: the tile's 16 rows through the
    swapped products (``decode_swap.py``), else its 64 rows through ``forward_ws``'s steps."""
    TILE_ROWS: gl.constexpr = SWAP_ROWS if SWAP else ws.GROUP_ROWS
    ROWS: gl.constexpr = TILE_ROWS // HEADS  # query positions per tile
    i_b, i_m = tile_index(batch, CAUSAL)
    i_hk = gl.program_id(1)
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    m_start = i_m * ROWS
    if m_start >= seqlen_q:
        return
    diag, t_full, n_tiles = ws.query_key_tiles(m_start, seqlen_q, seqlen_k, ROWS, BLOCK_N,
                                               CAUSAL)
    keys, key_off, n_rows, i_c = None, 0, 0, 0  # a split program's (module docstring)
    if KEY_CHUNK > 0:  # chunk i_c's tiles, counted from its first key (module docstring)
        CHUNK_TILES: gl.constexpr = KEY_CHUNK // BLOCK_N
        i_c = i_hk // (n_heads_q // group)
        i_hk = i_hk % (n_heads_q // group)
        t_lo = i_c * CHUNK_TILES
        if t_lo >= n_tiles:  # a chunk past the tile's keys: no partial (the combine skips it)
            return
        key_off = t_lo * BLOCK_N
        keys, seqlen_k, diag = seqlen_k, seqlen_k - key_off, diag - key_off
        t_full = gl.maximum(t_full - t_lo, 0)
        n_tiles = gl.minimum(n_tiles - t_lo, CHUNK_TILES)
        n_rows = gl.load(cu_seqlens_q + batch).to(gl.int64)

    # Q rows gathered into shared memory (a wgmma operand) before the partitions fork.
    b_q = gather_q(q, bos_q, seqlen_q, m_start, i_hk, group, stride_qt, stride_qh, TILE_ROWS,
                   HEADS, HEAD_DIM)
    dtype: gl.constexpr = q.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [TILE_ROWS, HEAD_DIM], ws.SWIZZLED_128B, b_q)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    k_bars = ws.barriers(STAGES, 1)
    v_bars = ws.barriers(STAGES, 1)
    free_bars = ws.barriers(STAGES, 1)  # one consumer group
    p_smem = None
    if SWAP:
        p_smem = gl.allocate_shared_memory(dtype, p_tiles_shape(BLOCK_N), ws.SWIZZLED_128B)
    fence_async_shared()

    pages = block_table + i_b.to(gl.int64) * stride_bt
    program = _Decode(
        q_smem=q_smem, k_ring=k_ring, v_ring=v_ring, k_bars=k_bars, v_bars=v_bars,
        free_bars=free_bars, o=o, lse=lse, stride_ot=stride_ot, stride_oh=stride_oh,
        bos_q=bos_q, seqlen_q=seqlen_q, seqlen_k=seqlen_k, diag=diag, t_full=t_full,
        n_tiles=n_tiles, m_start=m_start, i_hk=i_hk, group=group, n_heads_q=n_heads_q,
        scale_log2=scale_log2, k_desc=k, v_desc=v, bos_k=bos_k, pages=pages, keys=keys,
        key_off=key_off, partials=partials, n_rows=n_rows, i_c=i_c, p_smem=p_smem)
    # The Config built in the calls: assigned to a local, its constexprs would become tensors.
    consume: gl.constexpr = consume_swapped if SWAP else _consume
    gl.warp_specialize([
        (_consumer, (consume, program, ws.Config(HEAD_DIM, TILE_ROWS, BLOCK_N, CAUSAL, SPLIT_P,
                                                 STAGES, KEY_CHUNK=KEY_CHUNK, HEADS=HEADS,
                                                 PAGE_SIZE=PAGE_SIZE))),
        (_produce, (program, ws.Config(HEAD_DIM, TILE_ROWS, BLOCK_N, CAUSAL, SPLIT_P, STAGES,
                                       KEY_CHUNK=KEY_CHUNK, HEADS=HEADS, PAGE_SIZE=PAGE_SIZE))),
    ], [1], [PRODUCER_REGS])


def decode_ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for (``plan.gluon_applies``' rule): the
    decode's 64 rows (one consumer group), 64 or 128 keys, a ring of at least two slots."""
    return (tiles.block_m == ws.GROUP_ROWS.value and tiles.block_n in (64, 128)
            and tiles.num_stages >= 2 and head_dim in (64, 128))  # fmt: skip


def pages_fit(page_size: int, block_n: int) -> bool:
    """Whether the producer copies this cache's pages (``_copy_keys``): packed K/V (0), pages
    that hold whole key tiles, or pages of at least 8 rows that divide a tile (a dense cache's
    one "page" of S_cache rows fits where S_cache is a multiple of the tile)."""
    return (page_size == 0 or page_size % block_n == 0
            or (block_n % page_size == 0 and page_size >= 8))  # fmt: skip


def copy_box(block_n: int, page_size: int, head_dim: int) -> tuple[int, int]:
    """The rows and columns of one TMA copy of K or V (0 columns: the head dim)."""
    if copies_per_tile(block_n, page_size, head_dim) == 1:
        return (block_n if page_size == 0 else min(page_size, block_n)), 0
    return page_size, 64


def decode_ws_launch_options() -> dict[str, int]:
    """Launch options: 4 warps, the consumer group (the producer warp is
    ``gl.warp_specialize``'s)."""
    return {"num_warps": ws.GROUP_WARPS.value}


def decode_ws_params(head_dim: int, tiles: Tiles, heads: int, page_size: int, causal: bool,
                     split_p: bool, key_chunk: int = 0, swap: bool = False) -> dict:  # fmt: skip
    """The compile-time parameters and launch options of a launch at the entry's decode
    ``tiles`` (its key tile, ``num_stages`` ring slots); ``key_chunk`` > 0: a split decode's
    partials (``KEY_CHUNK``), ``swap``: the swapped consumer (``SWAP``); each left out when
    off (the kernel's default)."""
    extra = {"KEY_CHUNK": key_chunk} if key_chunk else {}
    if swap:
        extra["SWAP"] = True
    return dict(HEAD_DIM=head_dim, BLOCK_N=tiles.block_n, HEADS=heads, PAGE_SIZE=page_size,
                CAUSAL=causal, SPLIT_P=split_p, STAGES=tiles.num_stages, **extra,
                **decode_ws_launch_options())  # fmt: skip


def decode_ws_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, block_table, batch: int,
                   group: int, scale_log2: float, partials=None) -> tuple:  # fmt: skip
    """The kernel's arguments, k and v as tensors (``decode_ws_reads`` names them);
    ``partials``: a split decode's workspace (``decode.plan_decode``'s), else None."""
    if block_table is None:
        table, stride_bt = cu_seqlens_k, 0  # not read
    else:
        table, stride_bt = block_table, block_table.stride(0)
    return (q, k, v, out, lse, table, partials, cu_seqlens_q, cu_seqlens_k,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), stride_bt,
            batch, q.shape[1], group, scale_log2)  # fmt: skip


def decode_ws_reads(block_n: int, page_size: int, head_dim: int) -> tuple:
    """``KernelLaunch.descriptors`` of a launch: k and v as ragged descriptors of
    ``copy_box``'s copies (a paged cache's as its token rows)."""
    rows, cols = copy_box(block_n, page_size, head_dim)
    return ragged_arguments(attn_decode_ws_kernel, gluon_cols=cols, k=rows, v=rows)


class DecodeWsLaunch(NamedTuple):
    """One launch of :func:`attn_decode_ws_kernel` outside the planner (ci/gluon_decode_ab.py,
    tests/test_decode_ws.py): grid, arguments, parameters, and the arguments that go as
    ragged descriptors."""

    grid: tuple[int, int]
    args: tuple
    params: dict
    descriptors: tuple


def plan_decode_ws(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                   block_table, scale: float, causal: bool, split_p: bool, block_n: int,
                   stages: int, swap: bool = False) -> DecodeWsLaunch:  # fmt: skip
    """The launch of a decode (see the module's scope) writing ``out`` [total_q, Hq, D] and
    ``lse`` float32 [total_q, Hq]: q [total_q, Hq, D]; k, v packed [total_k, Hkv, D]
    (``block_table`` None) or paged caches [num_pages, page_size, Hkv, D] whose pages lie one
    after the other (``block_table`` int32 [B, pages a sequence]); ``swap``: 16-row tiles
    through the swapped consumer (``decode_swap.py``)."""
    head_dim = q.shape[2]
    page_size = 0 if block_table is None else k.shape[1]
    group = q.shape[1] // k.shape[-2]
    if swap and split_p:
        raise ValueError("the swapped decode consumer has no split-P (decode_swap.py)")
    rows = SWAP_ROWS.value if swap else ws.GROUP_ROWS.value
    heads = tile_heads(group, rows)
    if heads < group:
        raise ValueError(f"a GQA group of {group} query heads does not fit one decode tile")
    batch = cu_seqlens_q.shape[0] - 1
    grid = decode_grid(max_seqlen_q, batch, k.shape[-2], group, rows)[:2]
    tiles = Tiles(rows, block_n, ws.GROUP_WARPS.value, stages)
    args = decode_ws_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, block_table, batch,
                          group, scale * LOG2E)  # fmt: skip
    params = decode_ws_params(head_dim, tiles, heads, page_size, causal, split_p, swap=swap)
    return DecodeWsLaunch(grid, args, params, decode_ws_reads(block_n, page_size, head_dim))


def launch_decode_ws(launch: DecodeWsLaunch) -> None:
    """Run a launch of :func:`plan_decode_ws` (no checks: the caller's plan is the contract)."""
    attn_decode_ws_kernel[launch.grid](*with_descriptors(launch.args, launch.descriptors),
                                       **launch.params)
