"""Shared ``@triton.jit`` addressing of the forward, backward and decode kernels.

One job: where a tile's rows and columns live. The program's sequence, head and first row
(``query_tile``, ``key_tile``, ``tile_index``, ``seq_bounds``), the head-dim columns it covers
(``head_dim_chunk``, ``value_columns``), the strides and descriptors its rows are read through
(``row_strides``, ``row_tiles``, ``key_value_tiles``, ``head_rows_tiles``), the loads of those
rows (``load_key_tile``, ``load_head_rows``), a paged cache's (page, slot) of a key
(``paged_rows``), or its pages read a block of key tiles at a time and a tile's K and V from
them (``page_block``, ``tile_pages``, ``load_page_tiles``), and where a sequence starts in a
head-major buffer (``head_major_start``).
None of it enters a row's arithmetic: what decides the bits is in ``primitives.py``, which
imports the page helpers from here (never the other way round).

Conventions as in ``primitives.py``: ``b_`` block values, ``p_`` pointers, ``o_`` offsets,
``m_`` masks.
"""

import triton
import triton.language as tl

from portattn.kernels import descriptors


@triton.jit
def head_dim_chunk(o_d, m_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   D_CHUNKS: tl.constexpr):
    """The head-dim columns (offsets, mask, first column) of this program: all of ``o_d`` when
    ``D_CHUNKS`` is 1, else chunk ``program_id(2)`` of ``BLOCK_D // D_CHUNKS`` columns (the
    forward's ``fwd_chunks``, the dK/dV launches' halves with ``dkdv_passes`` = 4)."""
    if D_CHUNKS == 1:
        o_dc, m_dc, c_start = o_d, m_d, 0
    else:
        c_start = tl.program_id(2) * (BLOCK_D // D_CHUNKS)
        o_dc = c_start + tl.arange(0, BLOCK_D // D_CHUNKS)
        m_dc = o_dc < HEAD_DIM
    return o_dc, m_dc, c_start


@triton.jit
def value_columns(o_d, m_d, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
    """The value head-dim columns (offsets [BLOCK_DV], mask) of V, O, dO and dV: q's ``o_d``
    and ``m_d`` themselves where v has q's head dim (so those kernels' code is what it was
    before v had its own), else ``HEAD_DIM_V`` columns of their own (MLA: D 192, Dv 128)."""
    if HEAD_DIM_V == HEAD_DIM:
        o_dv, m_dv = o_d, m_d
    else:
        o_dv = tl.arange(0, BLOCK_DV)
        m_dv = o_dv < HEAD_DIM_V
    return o_dv, m_dv


@triton.jit
def row_strides(stride_t, stride_h, DIM: tl.constexpr):
    """The token and head (or page and token) strides of a [..., DIM] tensor as the kernels
    index it. Where DIM is a multiple of 16 (every table head dim, and the borrowed ones) they
    are the arguments themselves, so that code is unchanged. Triton specializes an integer
    argument on divisibility by 16 only, so for an odd multiple of 8 (40, 56, 72, ..., 248)
    the head stride DIM was never specialized: every row offset had divisibility 1, the
    loads were one element per thread (no 16-byte vectors, no cp.async, so no pipelined key
    loop) with a 64-bit address per element, and the decode, preprocess and dQ kernels
    spilled (sm90 d40 decode: 968 bytes). There the strides are rounded down to multiples of
    8 (``// 8 * 8``: the same values, ``buffers.check_row_strides`` requires them), which the
    axis analysis reads as divisibility by 8: 16-byte rows in 16-bit dtypes, as at DIM 48."""
    return row_stride(stride_t, DIM), row_stride(stride_h, DIM)


@triton.jit
def row_stride(stride, DIM: tl.constexpr):
    """One stride of ``row_strides`` (a paged cache's page stride beside its token and head
    strides): rounded down to a multiple of 8 where DIM is an odd multiple of 8, else itself."""
    if DIM % 16 == 8:
        stride = stride // 8 * 8
    return stride


@triton.jit
def row_tiles(base, seqlen, stride_t, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """A tensor descriptor (TMA) of one sequence's rows of one head (``base``: its first row),
    of shape [seqlen, HEAD_DIM] and [BLOCK_R, BLOCK_C] tiles: the copy engine reads 0 past the
    sequence end and the head dim, as the masked pointer loads do."""
    return tl.make_tensor_descriptor(base, [seqlen, HEAD_DIM], [stride_t, 1], [BLOCK_R, BLOCK_C])


# ``TMA``, as the kernels take it: 0 (False) masked pointer loads; ``TMA_PROGRAM`` (1, True)
# descriptors the program makes (``row_tiles``); ``TMA_HOST`` (2) the launch's ragged host
# descriptors (``kernels/descriptors.py``, ``ragged_source``), kernel parameters in place of
# the tensors.
TMA_PROGRAM = tl.constexpr(1)
TMA_HOST = tl.constexpr(descriptors.TMA_HOST)
RAGGED_ROWS = tl.constexpr(descriptors.RAGGED_ROWS)  # 2**30


@triton.jit
def ragged_source(desc, head, bos, seqlen):
    """Where ``ragged_tile`` reads rows of head ``head`` of the sequence [bos, bos + seqlen)
    through a ragged host descriptor ``desc`` (``descriptors.ragged_tl_descriptor``): (desc,
    head, bos + seqlen, 2**30 - seqlen), int32. (The tensor comes first in each sum: Triton
    3.9's interpreter makes ``constexpr - tensor`` a constexpr.)"""
    return desc, head.to(tl.int32), (bos + seqlen).to(tl.int32), -seqlen.to(tl.int32) + RAGGED_ROWS


@triton.jit
def ragged_tile(src, row, col):
    """The [R, C] tile of rows ``row`` onwards and columns ``col`` onwards of a
    ``ragged_source``: the copy's row coordinate passes 2**30 at the sequence's end, where it
    reads 0 (as past the head dim), like a per-sequence descriptor (``row_tiles``)."""
    b_x = src[0].load([src[1], RAGGED_ROWS, src[2], row + src[3], col])  # [1, 1, 1, R, C]
    return b_x.reshape(b_x.shape[3], b_x.shape[4])


@triton.jit
def ragged_store(src, row, col, b_x):
    """Store ``b_x`` [R, C] at rows ``row`` onwards and columns ``col`` onwards of a
    ``ragged_source``: the copy engine writes no row past the sequence's end and no column
    past the head dim (as a per-sequence descriptor's store)."""
    src[0].store([src[1], RAGGED_ROWS, src[2], row + src[3], col],
                 b_x.reshape(1, 1, 1, b_x.shape[0], b_x.shape[1]))


@triton.jit
def key_value_tiles(k, v, bos_k, i_hk, seqlen_k, stride_kt, stride_kh, stride_vt, stride_vh,
                    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DV: tl.constexpr, TMA: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """Where ``load_key_tile`` reads K tiles ([BLOCK_N, BLOCK_D]) and V tiles ([BLOCK_N,
    BLOCK_DV], of V's ``HEAD_DIM_V`` columns) of sequence ``bos_k`` and kv head ``i_hk``:
    ``ragged_source``s of the host descriptors ``k`` and ``v`` (``TMA_HOST``), the program's
    descriptors (``TMA_PROGRAM``) or the base pointers of its first row."""
    if TMA == TMA_HOST:
        src_k = ragged_source(k, i_hk, bos_k, seqlen_k)
        src_v = ragged_source(v, i_hk, bos_k, seqlen_k)
    else:
        p_k_base = k + bos_k * stride_kt + i_hk.to(tl.int64) * stride_kh
        p_v_base = v + bos_k * stride_vt + i_hk.to(tl.int64) * stride_vh
        if TMA:
            src_k = row_tiles(p_k_base, seqlen_k, stride_kt, HEAD_DIM, BLOCK_N, BLOCK_D)
            src_v = row_tiles(p_v_base, seqlen_k, stride_vt, HEAD_DIM_V, BLOCK_N, BLOCK_DV)
        else:
            src_k = p_k_base
            src_v = p_v_base
    return src_k, src_v


@triton.jit
def load_key_tile(src, n_start, c_start, o_k, seqlen_k, stride_t, o_c, m_c, TMA: tl.constexpr):
    """Key rows ``o_k`` (``n_start`` onwards) and columns ``o_c`` (``c_start`` onwards, mask
    ``m_c``) from ``key_value_tiles``; entries past the sequence or the head dim are 0."""
    if TMA:
        b_x = src.load([n_start, c_start])
    else:
        m_x = (o_k < seqlen_k)[:, None] & m_c[None, :]
        b_x = tl.load(src + o_k.to(tl.int64)[:, None] * stride_t + o_c[None, :], mask=m_x,
                      other=0.0)
    return b_x


@triton.jit
def paged_rows(p_pages, o_k, seqlen_k, PAGE_SIZE: tl.constexpr):
    """Where keys ``o_k`` of a sequence live in a paged cache: (page, slot) int64 [N] with
    ``page = p_pages[o_k // PAGE_SIZE]`` (the sequence's row of the block table) and
    ``slot = o_k % PAGE_SIZE``. Keys at or past ``seqlen_k`` read no block-table entry (page
    0, and their K/V loads are masked), so entries past a sequence's pages may hold anything."""
    m_k = o_k < seqlen_k
    o_page = tl.load(p_pages + o_k // PAGE_SIZE, mask=m_k, other=0).to(tl.int64)
    return o_page, (o_k % PAGE_SIZE).to(tl.int64)


@triton.jit
def page_block(p_pages, b_start, seqlen_k, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
               TILES: tl.constexpr):
    """The pages of ``TILES`` key tiles from key ``b_start`` of a sequence (``p_pages``: its
    row of the block table), int32 [TILES, P] with P the pages a tile spans (``BLOCK_N //
    PAGE_SIZE``, at least 1): entry [t, p] is the page of key ``b_start + t * BLOCK_N + p *
    PAGE_SIZE``. An entry whose first key is at or past ``seqlen_k`` is not read (page 0; the
    K/V loads of keys past the end are masked), so entries past a sequence's pages may hold
    anything."""
    P: tl.constexpr = BLOCK_N // PAGE_SIZE if BLOCK_N > PAGE_SIZE else 1
    STEP: tl.constexpr = PAGE_SIZE if BLOCK_N > PAGE_SIZE else BLOCK_N
    o_key = (b_start + tl.arange(0, TILES)[:, None] * BLOCK_N
             + tl.arange(0, P)[None, :] * STEP)  # [TILES, P] first key of each entry
    return tl.load(p_pages + o_key // PAGE_SIZE, mask=o_key < seqlen_k, other=0)  # int32


@triton.jit
def tile_pages(b_pages, i_t, o_k, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
               TILES: tl.constexpr):
    """As ``paged_rows`` for the keys ``o_k`` of tile ``i_t`` of a ``page_block`` of ``TILES``
    tiles: (page, slot) int64 [BLOCK_N], the pages from the registers (no memory read)."""
    P: tl.constexpr = BLOCK_N // PAGE_SIZE if BLOCK_N > PAGE_SIZE else 1
    b_row = tl.sum(tl.where(tl.arange(0, TILES)[:, None] == i_t, b_pages, 0), 0)  # [P]
    if P == 1:
        o_page = tl.broadcast_to(b_row, [BLOCK_N])
    else:
        o_page = tl.reshape(tl.broadcast_to(b_row[:, None], [P, PAGE_SIZE]), [BLOCK_N])
    return o_page.to(tl.int64), (o_k % PAGE_SIZE).to(tl.int64)


@triton.jit
def load_page_tiles(src_k, src_v, b_pages, i_t, o_k, seqlen_k, stride_kp, stride_kt, stride_vp,
                    stride_vt, o_d, m_d, o_dc, m_dc, BLOCK_N: tl.constexpr,
                    PAGE_SIZE: tl.constexpr, TILES: tl.constexpr):
    """K [BLOCK_N, BLOCK_D] and V [BLOCK_N, BLOCK_DC] of keys ``o_k``, tile ``i_t`` of a
    ``page_block`` ``b_pages`` of paged caches; keys past ``seqlen_k`` and masked columns read
    0. Both masks and addresses before both loads, as the forward's pointer path."""
    m_k = (o_k < seqlen_k)[:, None] & m_d[None, :]
    m_v = (o_k < seqlen_k)[:, None] & m_dc[None, :]
    o_page, o_slot = tile_pages(b_pages, i_t, o_k, BLOCK_N, PAGE_SIZE, TILES)
    r_k = o_page * stride_kp + o_slot * stride_kt  # [BLOCK_N] int64
    r_v = o_page * stride_vp + o_slot * stride_vt
    b_k = tl.load(src_k + r_k[:, None] + o_d[None, :], mask=m_k, other=0.0)
    b_v = tl.load(src_v + r_v[:, None] + o_dc[None, :], mask=m_v, other=0.0)
    return b_k, b_v


@triton.jit
def head_rows_tiles(base, seqlen, n_heads, stride_t, stride_h, HEAD_DIM: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """As ``row_tiles`` for rows of any head (a loop over a GQA group's heads): shape
    [seqlen, n_heads, HEAD_DIM], [BLOCK_R, 1, BLOCK_C] tiles; load at [row, head, column]."""
    return tl.make_tensor_descriptor(base, [seqlen, n_heads, HEAD_DIM], [stride_t, stride_h, 1],
                                     [BLOCK_R, 1, BLOCK_C])


@triton.jit
def load_head_rows(desc, p_rows, m_start, i_h32, c_start, o_c, m_row, m_c,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, TMA: tl.constexpr):
    """Rows ``m_start`` onwards of head ``i_h32`` and columns ``o_c`` (from ``c_start``; mask
    ``m_c``): from ``head_rows_tiles`` (``TMA``) or from the rows' pointers ``p_rows``
    ([BLOCK_R, 1], row mask ``m_row``); 0 past the sequence and the head dim."""
    if TMA:
        b_x = desc.load([m_start, i_h32, c_start]).reshape(BLOCK_R, BLOCK_C)
    else:
        b_x = tl.load(p_rows + o_c[None, :], mask=m_row[:, None] & m_c[None, :], other=0.0)
    return b_x


@triton.jit
def head_major_start(bos, i_b, PADDED: tl.constexpr):
    """Where sequence ``i_b`` (first token ``bos``) starts in a head-major [Hq, stride_hm]
    buffer (lse2, delta): at ``bos``, or with ``PADDED`` at ``bos`` rounded up to a multiple of
    4 plus 4 per earlier sequence, so every sequence starts 16-byte aligned (as the offset of a
    tensor-descriptor load must be) and none overlaps the next."""
    if PADDED:
        start = (bos + 3) // 4 * 4 + 4 * i_b
    else:
        start = bos
    return start


@triton.jit
def seq_bounds(cu_seqlens, i_b):
    """Start (int64, so token offsets times strides never overflow) and length of sequence
    ``i_b`` in a packed tensor."""
    bos = tl.load(cu_seqlens + i_b).to(tl.int64)
    eos = tl.load(cu_seqlens + i_b + 1).to(tl.int64)
    return bos, (eos - bos).to(tl.int32)


@triton.jit
def query_tile(cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M: tl.constexpr,
               CAUSAL: tl.constexpr):
    """Where a program of a query-tile grid works (the forward kernels, dQ): program id 0 is
    (tile, sequence) as ``tile_index`` decodes it, id 1 the query head. Returns (sequence,
    query head, its KV head, bos_q, seqlen_q, bos_k, seqlen_k, first query row of the tile).
    Causal grids launch the heaviest tiles first."""
    i_b, i_m = tile_index(batch, CAUSAL)
    i_h = tl.program_id(1)
    i_hk = i_h // group
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    m_start = i_m * BLOCK_M
    return i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_start


@triton.jit
def key_tile(cu_seqlens_q, cu_seqlens_k, batch, BLOCK_N: tl.constexpr):
    """Where a program of a key-tile grid works (the dK/dV kernels): program id 0 is (tile,
    sequence) as ``tile_index`` decodes it, id 1 the kv head. Returns (sequence, kv head,
    bos_q, seqlen_q, bos_k, seqlen_k, first key row of the tile)."""
    i_b, i_n = tile_index(batch, False)
    i_hk = tl.program_id(1)
    bos_q, seqlen_q = seq_bounds(cu_seqlens_q, i_b)
    bos_k, seqlen_k = seq_bounds(cu_seqlens_k, i_b)
    return i_b, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, i_n * BLOCK_N


@triton.jit
def tile_index(batch, REVERSE: tl.constexpr):
    """Decode program id 0 into (sequence, tile) with the sequence fastest.

    The tile index is local to the sequence: tiles are anchored at each sequence's own start.
    ``REVERSE`` launches the last (for causal, the heaviest) tiles first; launch order never
    changes any bits, only scheduling.
    """
    pid = tl.program_id(0)
    n_tiles = tl.num_programs(0) // batch
    i_b = pid % batch
    i_t = pid // batch
    if REVERSE:
        i_t = n_tiles - 1 - i_t
    return i_b, i_t
