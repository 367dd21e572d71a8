"""Where a repair pass looks (design §3.2): the check rows of a first pass's tile whose
finiteness stands for the tile's, and the loads that test them. A repair pass recomputes
only the tiles these find holding a NaN or an infinity; the recomputation's arithmetic is
``primitives.mma_visible``'s."""

import triton
import triton.language as tl

from portattn.kernels.primitives import nonfinite_rows


@triton.jit
def tile_is_finite(p_x, m_x):
    """Whether the tile at ``p_x`` (elements where ``m_x``) holds no NaN and no infinity: a
    repair pass's test of what the first pass wrote (masked-off elements are not read)."""
    b_x = tl.load(p_x, mask=m_x, other=0.0).to(tl.float32)
    return tl.max(nonfinite_rows(b_x), 0) == 0


# Query heads whose check rows a repair program over all heads tests with one load.
REPAIR_HEADS = tl.constexpr(16)


@triton.jit
def repair_head_block(p_x, stride_t, stride_h, bos, h_first, n_heads, m_start, seqlen, o_c, m_c,
                      BLOCK: tl.constexpr):
    """A repair program over all heads of one tile (rows from ``m_start`` of a sequence from
    row ``bos``): the check rows (``repair_check_rows``' rows) of heads ``h_first`` onwards,
    ``REPAIR_HEADS`` of them, in one load of ``p_x`` (columns ``o_c`` where ``m_c``). Returns
    (o_h, b_bad), [REPAIR_HEADS * slabs]: each row's head, and 1 where it holds a NaN or an
    infinity (``head_is_bad`` reads one head's)."""
    SLABS: tl.constexpr = (BLOCK + 63) // 64
    SLAB: tl.constexpr = BLOCK // SLABS
    o_r = tl.arange(0, REPAIR_HEADS * SLABS)  # (head, slab) pairs
    o_slab = m_start + (o_r % SLABS) * SLAB
    o_row = tl.minimum(o_slab + SLAB - 1, seqlen - 1)  # the slab's last valid row
    o_h = h_first + o_r // SLABS
    m_r = (o_slab < seqlen) & (o_h < n_heads)
    p_r = (p_x + (bos + o_row.to(tl.int64))[:, None] * stride_t
           + o_h.to(tl.int64)[:, None] * stride_h + o_c[None, :])
    b_x = tl.load(p_r, mask=m_r[:, None] & m_c[None, :], other=0.0).to(tl.float32)
    return o_h, nonfinite_rows(b_x)


@triton.jit
def head_is_bad(o_h, b_bad, i_h):
    """Whether ``repair_head_block`` found a NaN or an infinity in a check row of head ``i_h``."""
    return tl.max(tl.where(o_h == i_h, b_bad, 0), 0) > 0


@triton.jit
def repair_check_rows(o_r, n_valid, BLOCK: tl.constexpr, LAST: tl.constexpr):
    """[BLOCK] mask of the rows of a first pass's tile (positions ``o_r``, ascending from the
    tile's start; ``o_r < n_valid`` are valid) whose finiteness a repair pass tests: one per
    64-row slab, its last valid row (``LAST``) or its first. One row stands for its slab
    (design §3.2): a key a row does not see reaches it only as 0 * (NaN or inf) in a product
    over the slab's tiles, every valid row of the slab takes part in those products with a
    finite factor (rows that see no key too: ``normalize_rows`` divides their sums by 1), so
    the poisoned column is non-finite in every valid row. A warp-specialised first pass gives
    each 64-row group its own tile range, hence one row per slab; a group with no valid row
    takes no product."""
    o_t = tl.arange(0, BLOCK)
    SLABS: tl.constexpr = (BLOCK + 63) // 64
    SLAB: tl.constexpr = BLOCK // SLABS
    if LAST:
        slab_last = o_r - o_t % SLAB + SLAB - 1  # the position of the slab's last row
        pick = o_r == tl.minimum(slab_last, n_valid - 1)
    else:
        pick = o_t % SLAB == 0
    return pick & (o_r < n_valid)
