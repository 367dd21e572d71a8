"""The rows of a Gluon decode tile (``decode_ws.py``, ``decode_swap.py``): which query row each
tile row is, the gather of their Q rows, and the stores of their out and lse (or of a split
program's partial). A tile has ``cfg.BLOCK_M`` rows: 64 (one wgmma M) in ``decode_ws``'s
consumer, 16 (one wgmma N) in the swapped one; row ``t`` is position ``m_start + t // HEADS``
of head ``t % HEADS`` of the kv head's GQA group, as ``attn_decode_kernel``'s rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from portattn.kernels.row_state import normalize_rows


@gluon.constexpr_function
def rows_layout(head_dim):
    """A blocked layout of a [rows, head_dim] 16-bit tile for 4 warps, 16 bytes a thread."""
    cols = head_dim // 8
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // cols, cols],
                            warps_per_cta=[4, 1], order=[1, 0])


@gluon.jit
def tile_heads(m_start, seqlen_q, i_hk, group, ROWS: gl.constexpr, HEADS: gl.constexpr,
               layout: gl.constexpr):
    """The tile's rows: (o_q [ROWS] positions, i_h [ROWS] query heads (int64), valid [ROWS])."""
    o_t = gl.arange(0, ROWS, layout=layout)
    o_q = m_start + o_t // HEADS
    o_g = o_t % HEADS
    return o_q, (i_hk * group + o_g).to(gl.int64), (o_q < seqlen_q) & (o_g < group)


@gluon.jit
def gather_q(q, bos_q, seqlen_q, m_start, i_hk, group, stride_qt, stride_qh,
             ROWS: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """The tile's Q rows [ROWS, HEAD_DIM] by pointer loads (rows past the sequence or the group
    read 0)."""
    q_layout: gl.constexpr = rows_layout(HEAD_DIM)
    o_q, i_h, m_row = tile_heads(m_start, seqlen_q, i_hk, group, ROWS, HEADS,
                                 gl.SliceLayout(1, q_layout))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
    p_q = q + (bos_q + o_q.to(gl.int64))[:, None] * stride_qt + i_h[:, None] * stride_qh
    return gl.load(p_q + o_d[None, :], mask=m_row[:, None] & (o_d < HEAD_DIM)[None, :],
                   other=0.0)


@gluon.jit
def store_rows(st, cfg, b_acc, b_m, b_l, o_layout: gl.constexpr):
    """The tile's rows normalised: out [ROWS, D] and lse [ROWS] of its (position, head) rows;
    ``b_acc`` in ``o_layout``, ``b_m`` and ``b_l`` in its row slice."""
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    b_out, b_lse = normalize_rows(b_acc, b_m, b_l)  # [ROWS, D], [ROWS]
    o_q, i_h, m_row = tile_heads(st.m_start, st.seqlen_q, st.i_hk, st.group, cfg.BLOCK_M,
                                 cfg.HEADS, row_layout)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_rows = (st.bos_q + o_q.to(gl.int64))[:, None]
    p_o = st.o + o_rows * st.stride_ot + i_h[:, None] * st.stride_oh + o_d[None, :]
    gl.store(p_o, b_out.to(st.o.dtype.element_ty), mask=m_row[:, None] & (o_d < HEAD_DIM)[None, :])
    gl.store(st.lse + (st.bos_q + o_q.to(gl.int64)) * st.n_heads_q + i_h, b_lse, mask=m_row)


@gluon.jit
def store_partial(st, cfg, b_acc, b_m, b_l, o_layout: gl.constexpr):
    """The tile's rows' (acc [ROWS, D], m [ROWS], l [ROWS]) of chunk ``st.i_c`` into the
    workspace float32 [slots, n_rows, Hq, D + 4] (``decode.partial_rows``: acc, then m and l)."""
    RECORD: gl.constexpr = cfg.HEAD_DIM + 4
    o_t = gl.arange(0, cfg.BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    o_g = o_t % cfg.HEADS
    m_row = (st.m_start + o_t // cfg.HEADS < st.seqlen_q) & (o_g < st.group)
    first = (st.i_c * st.n_rows + st.bos_q + st.m_start) * st.n_heads_q + st.i_hk * st.group
    p_part = st.partials + first * RECORD  # int64 once, then int32 offsets
    o_part = ((o_t // cfg.HEADS) * st.n_heads_q + o_g) * RECORD
    o_d = gl.arange(0, cfg.HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(p_part + (o_part[:, None] + o_d[None, :]), b_acc,
             mask=m_row[:, None] & (o_d < cfg.HEAD_DIM)[None, :])
    gl.store(p_part + (o_part + cfg.HEAD_DIM), b_m, mask=m_row)
    gl.store(p_part + (o_part + cfg.HEAD_DIM + 1), b_l, mask=m_row)


@gluon.jit
def store_tile(st, cfg, b_acc, b_m, b_l, o_layout: gl.constexpr):
    """The tile's result: a split program's partial (``KEY_CHUNK`` > 0, merged by
    ``attn_decode_kernel``'s combine), else its rows' out and lse."""
    if cfg.KEY_CHUNK > 0:
        store_partial(st, cfg, b_acc, b_m, b_l, o_layout)
    else:
        store_rows(st, cfg, b_acc, b_m, b_l, o_layout)
