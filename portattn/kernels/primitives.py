"""Shared ``@triton.jit`` primitives of the forward and backward kernels: the numerics that
decide the bits live here.

Everything that decides the *bits* of a result lives here once (products, split-P, masks and
the tile ranges that take them, softcap, the online softmax, the forward's key loop, sinks,
normalisation, the backward's recomputed P and its lse), so the two kernels (``varlen`` and
``fixed_order``) cannot drift apart: they differ only by the constexpr ``SPLIT_P`` (split-P
second MMA) and by where the backward reads O from. The Gluon forward (``forward_ws.py``)
calls the same primitives, so it computes the Triton forward's bits. Where a tile's rows live
(program ids, sequence bounds, strides, descriptors, loads) is ``addressing.py``'s job.

Conventions: ``b_`` block values, ``p_`` pointers, ``o_`` offsets, ``m_`` masks.
Scores are kept in log2 units: ``s2 = (q . k) * scale * log2(e)``, so ``exp2`` replaces ``exp``.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from portattn.kernels.addressing import (
    TMA_HOST,
    load_page_tiles,
    page_block,
    paged_rows,
    ragged_tile,
)
from portattn.kernels.row_state import empty_rows, finish_rows, merge_partial

# 2**15: P <= 1 times this stays below float16's largest finite value (65504).
P_SCALE = tl.constexpr(32768.0)


@triton.jit
def mma(b_a, b_b, b_acc, INTERPRET: tl.constexpr):
    """``b_acc + b_a @ b_b`` in float32 with operands in the input dtype.

    ``INTERPRET`` is set only under Triton's interpreter, whose ``tl.dot`` is numpy's matmul:
    BLAS gives a row different bits depending on its position and the operand's size (OpenBLAS'
    Haswell kernels do), which would break the bitwise invariances on the CPU, and bfloat16
    operands are multiplied as raw bits (triton-lang/triton#11584). There the product is the
    float32 products (exact for float16 / bfloat16 operands) summed over K by ``tl.sum``, so each
    output element depends on its own row and column only. GPUs never take this branch.
    """
    if INTERPRET:
        # [M, K, 1] * [1, K, N] -> [M, K, N], summed over K -> [M, N]
        b_prod = b_a.to(tl.float32)[:, :, None] * b_b.to(tl.float32)[None, :, :]
        b_acc = b_acc + tl.sum(b_prod, 1)
    else:
        b_acc = tl.dot(b_a, b_b, b_acc)
    return b_acc


@triton.jit
def mma_rounded(b_x, b_b, b_acc, SPLIT_P: tl.constexpr, INTERPRET: tl.constexpr):
    """``b_acc + b_x @ b_b`` where ``b_x`` is float32 (P or dS) and must be rounded to the
    input dtype of ``b_b`` for the matrix unit.

    ``SPLIT_P=False`` (varlen): one product with ``round(b_x)``.
    ``SPLIT_P=True`` (fixed_order): ``b_x = hi + lo`` with ``hi = round(b_x)`` and
    ``lo = round(b_x - hi)``; both products are accumulated, ``hi`` first, keeping about twice
    the mantissa of the input dtype.
    """
    b_hi = b_x.to(b_b.dtype)
    b_acc = mma(b_hi, b_b, b_acc, INTERPRET)
    if SPLIT_P:
        b_acc = mma(split_p_lo(b_x, b_hi), b_b, b_acc, INTERPRET)
    return b_acc


@triton.jit
def split_p_lo(b_x, b_hi):
    """Split-P's second part: ``round(b_x - hi)`` in hi's dtype, where ``hi = round(b_x)``."""
    return (b_x - b_hi.to(tl.float32)).to(b_hi.dtype)


@triton.jit
def nonfinite_rows(b_x):
    """[M] int32: 1 where a row of ``b_x`` [M, N] (float32) holds a NaN or an infinity (exactly
    where ``x * 0`` is not 0)."""
    return tl.max(tl.where(b_x * 0.0 == 0.0, 0, 1), 1)


@triton.jit
def mma_visible(b_x, b_b, b_acc, m_vis, SPLIT_P: tl.constexpr, INTERPRET: tl.constexpr,
                PRODUCTS: tl.constexpr = 2):
    """``mma_rounded`` for a masked tile of a repair pass (design §3.2): the entries of ``b_x``
    [M, K] where ``m_vis`` [M, K] is False count as exact zeros whatever they hold (dS there is
    0 times a NaN ``dP - delta`` when a value or an output-gradient row is NaN), and a row of
    ``b_b`` [K, N] holding a NaN or an infinity reaches only the rows of ``b_x`` that see it.
    A row that sees none gets the product with those rows of ``b_b`` zeroed, a clean run's bits;
    a row that sees one gets the plain product (``PRODUCTS`` 2) or NaN (``PRODUCTS`` 1: one
    accumulator, where a second does not fit). ``b_x`` is rounded (and split) by
    ``mma_rounded``'s expressions before the mask: a split-P ``lo`` computed from a masked
    ``b_x`` lost the fma the compiler contracts ``dS - hi`` into, and its bits (sm90)."""
    b_hi = b_x.to(b_b.dtype)
    if SPLIT_P:
        b_lo = tl.where(m_vis, split_p_lo(b_x, b_hi), tl.zeros_like(b_hi))
    b_hi = tl.where(m_vis, b_hi, tl.zeros_like(b_hi))
    b_bad = nonfinite_rows(b_b.to(tl.float32))  # [K]
    b_clean = tl.where(b_bad[:, None] > 0, tl.zeros_like(b_b), b_b)
    b_sees = tl.max(tl.where(m_vis & (b_bad[None, :] > 0), 1, 0), 1)  # [M]
    b_fixed = mma(b_hi, b_clean, b_acc, INTERPRET)
    if SPLIT_P:
        b_fixed = mma(b_lo, b_clean, b_fixed, INTERPRET)
    if PRODUCTS == 1:  # no room for a second accumulator (KernelConfig.repair_products)
        # NaN added to the rows that see one; -0.0 (x + -0.0 is x, zeros' signs included) to
        # the others. A select of the accumulator against a NaN splat crashed Triton 3.6's
        # sm100 pass TritonGPUHoistTMEMAlloc (varlen d256 dK/dV and dQ repairs).
        return b_fixed + tl.where(b_sees > 0, float("nan"), -0.0)[:, None]
    b_plain = mma(b_hi, b_b, b_acc, INTERPRET)
    if SPLIT_P:
        b_plain = mma(b_lo, b_b, b_plain, INTERPRET)
    return tl.where(b_sees[:, None] > 0, b_plain, b_fixed)


@triton.jit
def visible_mask(o_q, o_k, seqlen_k, diag, CAUSAL: tl.constexpr,
                 WINDOW_LEFT: tl.constexpr = -1, WINDOW_RIGHT: tl.constexpr = -1):
    """Which (query, key) pairs are visible. ``o_q`` and ``o_k`` are positions local to the
    sequence, already shaped to broadcast ([M, 1] and [1, N], or transposed for the dK/dV
    program). Causal is bottom-right aligned: query ``i`` sees key ``j`` iff
    ``j <= i + diag`` with ``diag = seqlen_k - seqlen_q``. A sliding window (flash-attn's
    ``window_size``; -1: unbounded on that side) also needs
    ``i + diag - WINDOW_LEFT <= j <= i + diag + WINDOW_RIGHT``."""
    m_vis = o_k < seqlen_k
    if CAUSAL:
        m_vis = m_vis & (o_k <= o_q + diag)
    if WINDOW_RIGHT >= 0:
        m_vis = m_vis & (o_k <= o_q + diag + WINDOW_RIGHT)
    if WINDOW_LEFT >= 0:
        m_vis = m_vis & (o_k >= o_q + diag - WINDOW_LEFT)
    return m_vis


@triton.jit
def key_range(m_start, seqlen_k, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr):
    """For the query tile starting at ``m_start``: (n_full, n_hi). Key tiles starting below
    ``n_full`` are fully visible to every row of the tile (no mask needed); tiles in
    [n_full, n_hi) need the mask; keys from n_hi on are seen by no row of the tile."""
    if CAUSAL:
        n_hi = tl.minimum(seqlen_k, tl.maximum(m_start + BLOCK_M + diag, 0))
        n_full = tl.minimum(tl.maximum(m_start + diag + 1, 0), seqlen_k) // BLOCK_N * BLOCK_N
    else:
        n_hi = seqlen_k
        n_full = seqlen_k // BLOCK_N * BLOCK_N
    return n_full, n_hi


@triton.jit
def feature_mask(o_q, o_k, seqlen_k, diag, CAUSAL: tl.constexpr, FEATURES: tl.constexpr):
    """``visible_mask`` under the window of ``FEATURES`` (:class:`Features`)."""
    return visible_mask(o_q, o_k, seqlen_k, diag, CAUSAL, FEATURES.WINDOW_LEFT,
                        FEATURES.WINDOW_RIGHT)


@triton.jit
def visited_key_range(m_start, seqlen_k, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, FEATURES: tl.constexpr):
    """The key tiles a query tile visits, (n_lo, n_full, n_hi): unmasked from ``n_lo`` below
    ``n_full``, masked from there below ``n_hi``. Without a window: ``key_range`` from 0.
    Under a sliding window (``WINDOW_LEFT`` / ``WINDOW_RIGHT`` >= 0), tiles below ``n_lo`` (a
    multiple of BLOCK_N, so the tiles keep their anchoring at the sequence start) and from
    ``n_hi`` on are seen by no row of the query tile, and every tile in between takes the mask
    (``n_full = n_lo``: a fully visible tile gives the same bits masked, ``mask_scores``)."""
    WINDOW_LEFT: tl.constexpr = FEATURES.WINDOW_LEFT
    WINDOW_RIGHT: tl.constexpr = FEATURES.WINDOW_RIGHT
    if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:
        n_hi = seqlen_k
        if CAUSAL:
            n_hi = tl.minimum(n_hi, tl.maximum(m_start + BLOCK_M + diag, 0))
        if WINDOW_RIGHT >= 0:
            n_hi = tl.minimum(n_hi, tl.maximum(m_start + BLOCK_M + diag + WINDOW_RIGHT, 0))
        n_lo = 0
        if WINDOW_LEFT >= 0:
            n_lo = tl.minimum(tl.maximum(m_start + diag - WINDOW_LEFT, 0), n_hi)
            n_lo = n_lo // BLOCK_N * BLOCK_N
        n_full = n_lo
    else:
        n_lo = 0
        n_full, n_hi = key_range(m_start, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    return n_lo, n_full, n_hi


@triton.jit
def query_range(n_start, seqlen_q, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr):
    """For the key tile starting at ``n_start``: (m_lo, m_full). Query tiles below ``m_lo`` see
    no key of the tile; tiles in [m_lo, m_full) need the causal mask; tiles from ``m_full`` up to
    the sequence end see the whole tile. Tile starts are multiples of BLOCK_M."""
    if CAUSAL:
        m_lo = tl.minimum(tl.maximum(n_start - diag, 0), seqlen_q) // BLOCK_M * BLOCK_M
        m_full = tl.maximum(n_start + BLOCK_N - 1 - diag, 0)
        m_full = tl.minimum((m_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, seqlen_q)
        m_full = tl.maximum(m_full, m_lo)
    else:
        m_lo = 0
        m_full = 0
    return m_lo, m_full


@triton.jit
def window_query_range(n_start, seqlen_q, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr, FEATURES: tl.constexpr):
    """``query_range`` under a sliding window: (m_lo, m_hi). Query tiles below ``m_lo`` (a
    multiple of BLOCK_M) and rows from ``m_hi`` on see no key of the key tile at ``n_start``;
    every tile in between takes the mask."""
    WINDOW_LEFT: tl.constexpr = FEATURES.WINDOW_LEFT
    WINDOW_RIGHT: tl.constexpr = FEATURES.WINDOW_RIGHT
    m_lo = 0
    if CAUSAL:
        m_lo = tl.minimum(tl.maximum(n_start - diag, 0), seqlen_q) // BLOCK_M * BLOCK_M
    elif WINDOW_RIGHT >= 0:
        m_lo = tl.minimum(tl.maximum(n_start - diag - WINDOW_RIGHT, 0), seqlen_q)
        m_lo = m_lo // BLOCK_M * BLOCK_M
    m_hi = seqlen_q
    if WINDOW_LEFT >= 0:
        m_hi = tl.minimum(m_hi, tl.maximum(n_start + BLOCK_N + WINDOW_LEFT - diag, 0))
    return m_lo, tl.maximum(m_hi, m_lo)


@triton.jit
def mask_scores(b_qk, m_vis):
    """Masks *raw* scores (before the scale) with -inf. The scale is applied afterwards in the
    same expression on masked and unmasked tiles, so both compile to the same arithmetic
    (a masked tile that is fully visible gives the very same bits). Requires scale > 0."""
    return tl.where(m_vis, b_qk, float("-inf"))


@triton.jit
def softcap_scores(b_qk, scale_log2, SOFTCAP: tl.constexpr):
    """Softcapping (Gemma 2): raw scores ``qk`` -> ``tanh(u)`` with ``u = scale * qk / c``; the
    capped score in log2 units is ``tanh(u) * c * log2(e)`` (``softcap_log2``), a product
    the softmax applies where it applies the scale of uncapped scores (``scores_log2``), and
    ``tanh`` is also the backward's derivative ``scale * (1 - tanh**2)``. ``tanh(u) = 1 - 2 /
    (exp(2u) + 1)`` with exp2, the same expression on every device and under the interpreter
    (no libdevice)."""
    b_e2u = tl.exp2(b_qk * (scale_log2 * (2.0 / SOFTCAP)))  # exp(2u), u = scale * qk / c
    return 1.0 - 2.0 / (b_e2u + 1.0)


@triton.jit
def softcap_log2(SOFTCAP: tl.constexpr):
    """The factor from ``tanh(u)`` to the capped score in log2 units: ``c * log2(e)``."""
    return SOFTCAP * 1.4426950408889634


@triton.jit
def scores_log2(b_qk, scale_log2, FEATURES: tl.constexpr):
    """The scores of a tile ready for the mask and the softmax, and the factor the softmax
    applies to them: raw scores and ``scale_log2``, or with ``FEATURES.SOFTCAP`` > 0 ``tanh(u)``
    (``softcap_scores``) and ``softcap_log2``. Either way the factor is applied after the mask,
    in ``online_softmax_step`` / ``recompute_p``'s ``exp2(s * factor - m)``: the compiler
    contracts that into one fma in masked and unmasked tiles alike, so a row gets the same bits
    whichever tiles take the mask (a capped score rounded before the mask and contracted after
    it in unmasked tiles gave decode and prefill rows 1-ulp apart on sm90). The backward keeps
    the capped scores of a tile before its mask for ``through_cap``."""
    SOFTCAP: tl.constexpr = FEATURES.SOFTCAP
    if SOFTCAP > 0:
        return softcap_scores(b_qk, scale_log2, SOFTCAP), softcap_log2(SOFTCAP)
    return b_qk, scale_log2


@triton.jit
def through_cap(b_ds, b_capped, FEATURES: tl.constexpr):
    """dS through the cap: ``d(c tanh(u)) / d(scale qk) = 1 - tanh(u)**2``, with ``b_capped``
    the tile's ``scores_log2`` scores before the mask (``tanh(u)``); without a cap dS as it is."""
    if FEATURES.SOFTCAP > 0:
        b_ds = b_ds * (1.0 - b_capped * b_capped)
    return b_ds


@triton.jit
def online_softmax_step(b_qk, b_m, b_l, scale_log2):
    """One step of the online softmax over a key tile.

    b_qk: [M, N] raw scores (masked entries -inf); b_m: [M] running max (log2 units);
    b_l: [M] running sum. Returns (b_p [M, N], b_alpha [M], b_m, b_l).
    A row that has seen no visible key keeps ``m = -inf``; it is shifted by 0 instead, so no
    ``-inf - -inf`` NaN appears. A fully masked tile leaves (m, l) unchanged and has alpha = 1.
    """
    b_m_new = tl.maximum(b_m, tl.max(b_qk, 1) * scale_log2)
    b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_p = tl.exp2(b_qk * scale_log2 - b_m_use[:, None])
    b_alpha = tl.exp2(b_m - b_m_use)
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    return b_p, b_alpha, b_m_new, b_l


class Features(NamedTuple):
    """The optional features' compile-time flags, one constexpr record from
    ``AttentionOptions.kernel_flags`` through every Triton kernel that computes scores to the
    primitives that apply them; their off values compile to the code without them."""

    WINDOW_LEFT: tl.constexpr = -1  # ``visible_mask``: -1 unbounded on that side
    WINDOW_RIGHT: tl.constexpr = -1
    SOFTCAP: tl.constexpr = 0.0  # ``scores_log2``, ``through_cap``


class KeyLoop(NamedTuple):
    """The compile-time options of a key loop (``forward_tile``, ``forward_key_tiles``, the dQ
    kernel's ``_dq_key_tiles``), in one bundle, so that an option reaches every loop as one
    argument. A named tuple of constexprs: build it in the call that takes it (Triton turns
    the constexprs of a tuple assigned to a local into tensors)."""

    BLOCK_M: tl.constexpr  # query rows of the tile
    BLOCK_N: tl.constexpr  # keys per key tile
    CAUSAL: tl.constexpr
    SPLIT_P: tl.constexpr
    INTERPRET: tl.constexpr
    TMA: tl.constexpr  # K/V read through ``key_value_tiles``' descriptors (its TMA values)
    FEATURES: tl.constexpr  # :class:`Features` (``feature_mask``, ``scores_log2``)
    PAGE_SIZE: tl.constexpr = 0  # ``paged_rows``
    # A repair pass (design §3.2): 0 none; else masked tiles through ``mma_visible`` with
    # REPAIR products (KernelConfig.repair_products: 1 or 2)
    REPAIR: tl.constexpr = 0
    PAGE_BLOCK: tl.constexpr = 0  # paged: 0 or the tiles per ``page_block`` (its config field)
    # The key chunk (design §3.1, KernelConfig.key_chunk): 0, one key loop per row; else each
    # chunk of KEY_CHUNK keys from the sequence's first is its own loop, merged in order
    KEY_CHUNK: tl.constexpr = 0


@triton.jit
def forward_key_tiles(
    b_acc, b_m, b_l, b_q,
    src_k, src_v, stride_kt, stride_vt,
    o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2,
    n_lo, n_hi, loop, MASKED: tl.constexpr,
    p_pages=None, stride_kp=0, stride_vp=0,
):
    """The key loop of the Triton forward and decode kernels: accumulate key tiles
    [n_lo, n_hi) (ascending) into (acc, m, l), with the mask where ``MASKED``; the scores use
    all head-dim columns ``o_d``, the accumulator the value columns ``o_dc`` (from ``c_v``).
    ``loop.PAGE_SIZE`` > 0: paged K/V, key ``j`` in page ``p_pages[j // PAGE_SIZE]`` at slot
    ``j % PAGE_SIZE``, the table read per tile (``paged_rows``) or ``loop.PAGE_BLOCK`` tiles at
    a time into registers (``page_block``: the tile loop then loads only K and V, and pipelines
    as the packed one). Same tiles, order and arithmetic as packed: the same bits from any."""
    BLOCK_N: tl.constexpr = loop.BLOCK_N
    if loop.PAGE_SIZE > 0 and loop.PAGE_BLOCK > 0:
        TILES: tl.constexpr = loop.PAGE_BLOCK
        for b_start in range(n_lo, n_hi, TILES * BLOCK_N):
            b_pages = page_block(p_pages, b_start, seqlen_k, BLOCK_N, loop.PAGE_SIZE, TILES)
            for n_start in range(b_start, tl.minimum(b_start + TILES * BLOCK_N, n_hi), BLOCK_N):
                o_k = n_start + tl.arange(0, BLOCK_N)
                b_k, b_v = load_page_tiles(src_k, src_v, b_pages, (n_start - b_start) // BLOCK_N,
                                           o_k, seqlen_k, stride_kp, stride_kt, stride_vp,
                                           stride_vt, o_d, m_d, o_dc, m_dc, BLOCK_N,
                                           loop.PAGE_SIZE, TILES)
                b_acc, b_m, b_l = key_tile_step(b_acc, b_m, b_l, b_q, b_k, b_v, o_q, o_k,
                                                seqlen_k, diag, scale_log2, loop, MASKED)
    else:
        for n_start in range(n_lo, n_hi, BLOCK_N):
            o_k = n_start + tl.arange(0, BLOCK_N)
            if loop.TMA == TMA_HOST:  # ragged_source's of the launch's descriptors
                b_k = ragged_tile(src_k, n_start, 0)  # [BLOCK_N, BLOCK_D]
                b_v = ragged_tile(src_v, n_start, c_v)  # [BLOCK_N, BLOCK_DC]
            elif loop.TMA:
                b_k = src_k.load([n_start, 0])  # [BLOCK_N, BLOCK_D]
                b_v = src_v.load([n_start, c_v])  # [BLOCK_N, BLOCK_DC]
            else:  # both masks and addresses before both loads: keeps the pointer path's code
                m_k = (o_k < seqlen_k)[:, None] & m_d[None, :]
                m_v = (o_k < seqlen_k)[:, None] & m_dc[None, :]  # = m_k when unchunked
                if loop.PAGE_SIZE > 0:
                    o_page, o_slot = paged_rows(p_pages, o_k, seqlen_k, loop.PAGE_SIZE)
                    r_k = o_page * stride_kp + o_slot * stride_kt  # [BLOCK_N] int64
                    r_v = o_page * stride_vp + o_slot * stride_vt
                    p_k = src_k + r_k[:, None] + o_d[None, :]
                    p_v = src_v + r_v[:, None] + o_dc[None, :]
                else:  # the packed layout's addresses, as the forward has always computed them
                    p_k = src_k + o_k.to(tl.int64)[:, None] * stride_kt + o_d[None, :]
                    p_v = src_v + o_k.to(tl.int64)[:, None] * stride_vt + o_dc[None, :]
                b_k = tl.load(p_k, mask=m_k, other=0.0)  # [BLOCK_N, BLOCK_D]
                b_v = tl.load(p_v, mask=m_v, other=0.0)  # [BLOCK_N, BLOCK_DC]
            b_acc, b_m, b_l = key_tile_step(b_acc, b_m, b_l, b_q, b_k, b_v, o_q, o_k, seqlen_k,
                                            diag, scale_log2, loop, MASKED)
    return b_acc, b_m, b_l


@triton.jit
def key_tile_step(b_acc, b_m, b_l, b_q, b_k, b_v, o_q, o_k, seqlen_k, diag, scale_log2, loop,
                  MASKED: tl.constexpr):
    """A key tile of ``forward_key_tiles``, K and V loaded: scores, mask, softmax, product."""
    b_qk = mma(b_q, tl.trans(b_k), tl.zeros([loop.BLOCK_M, loop.BLOCK_N], tl.float32),
               loop.INTERPRET)
    b_qk, step_scale = scores_log2(b_qk, scale_log2, loop.FEATURES)
    if MASKED:
        m_vis = feature_mask(o_q[:, None], o_k[None, :], seqlen_k, diag, loop.CAUSAL,
                             loop.FEATURES)
        b_qk = mask_scores(b_qk, m_vis)
    b_p, b_alpha, b_m, b_l = online_softmax_step(b_qk, b_m, b_l, step_scale)
    b_acc = b_acc * b_alpha[:, None]
    if MASKED and loop.REPAIR:  # a key a row does not see stays out of it (design §3.2)
        b_acc = mma_visible(b_p, b_v, b_acc, m_vis, loop.SPLIT_P, loop.INTERPRET, loop.REPAIR)
    else:
        b_acc = mma_rounded(b_p, b_v, b_acc, loop.SPLIT_P, loop.INTERPRET)  # [M, BLOCK_DC]
    return b_acc, b_m, b_l


@triton.jit
def key_range_tiles(
    b_acc, b_m, b_l, b_q, src_k, src_v, stride_kt, stride_vt,
    o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, lo, mid, hi, loop,
    p_pages=None, stride_kp=0, stride_vp=0,
):
    """``forward_key_tiles`` over the key tiles [lo, mid) that every row sees whole (no mask),
    then [mid, hi) with the mask, ascending, into (acc, m, l)."""
    b_acc, b_m, b_l = forward_key_tiles(
        b_acc, b_m, b_l, b_q, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, lo, mid, loop,
        False, p_pages, stride_kp, stride_vp,
    )
    return forward_key_tiles(
        b_acc, b_m, b_l, b_q, src_k, src_v, stride_kt, stride_vt,
        o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, mid, hi, loop,
        True, p_pages, stride_kp, stride_vp,
    )


@triton.jit
def chunk_range(c_lo, n_lo, n_full, n_hi, KEY_CHUNK: tl.constexpr):
    """The key tiles of the chunk from key ``c_lo`` that a tile visiting [n_lo, n_hi) (whole
    below ``n_full``) visits: (lo, mid, hi), [lo, mid) unmasked, [mid, hi) masked. Its first
    chunk is the one holding ``n_lo``: ``(n_lo // KEY_CHUNK) * KEY_CHUNK`` (design §3.1)."""
    lo = tl.maximum(c_lo, n_lo)
    hi = tl.minimum(c_lo + KEY_CHUNK, n_hi)
    return lo, tl.minimum(tl.maximum(n_full, lo), hi), hi


@triton.jit
def forward_tile(
    b_q, src_k, src_v, stride_kt, stride_vt,
    o_q, o_d, m_d, o_dc, m_dc, c_v, seqlen_k, diag, scale_log2, n_lo, n_full, n_hi,
    loop, BLOCK_DC: tl.constexpr,
    p_pages=None, stride_kp=0, stride_vp=0,
    b_sink=None,
    HAS_SINK: tl.constexpr = False,
):
    """The forward of one query tile (the Triton forward and decode kernels; ``loop``: its
    ``KeyLoop``): the key tiles from ``n_lo`` below ``n_full`` that every row sees whole (no
    mask), then those up to ``n_hi`` that need the mask (``visited_key_range``), in ascending
    order; with ``loop.KEY_CHUNK`` each chunk's tiles from the empty state, merged in order
    (design §3.1; the split decode computes the same partials in programs of their own).
    Returns (out [BLOCK_M, BLOCK_DC], lse [BLOCK_M]) by ``finish_rows``."""
    b_acc, b_m, b_l = empty_rows(loop.BLOCK_M, BLOCK_DC)
    if loop.KEY_CHUNK == 0:
        b_acc, b_m, b_l = key_range_tiles(
            b_acc, b_m, b_l, b_q, src_k, src_v, stride_kt, stride_vt, o_q, o_d, m_d, o_dc,
            m_dc, c_v, seqlen_k, diag, scale_log2, n_lo, n_full, n_hi, loop, p_pages,
            stride_kp, stride_vp,
        )
    else:
        for c_lo in range((n_lo // loop.KEY_CHUNK) * loop.KEY_CHUNK, n_hi, loop.KEY_CHUNK):
            lo, mid, hi = chunk_range(c_lo, n_lo, n_full, n_hi, loop.KEY_CHUNK)
            c_acc, c_m, c_l = empty_rows(loop.BLOCK_M, BLOCK_DC)
            c_acc, c_m, c_l = key_range_tiles(
                c_acc, c_m, c_l, b_q, src_k, src_v, stride_kt, stride_vt, o_q, o_d, m_d, o_dc,
                m_dc, c_v, seqlen_k, diag, scale_log2, lo, mid, hi, loop, p_pages, stride_kp,
                stride_vp,
            )
            b_acc, b_m, b_l = merge_partial(b_acc, b_m, b_l, c_acc, c_m, c_l)
    return finish_rows(b_acc, b_m, b_l, b_sink, HAS_SINK)


@triton.jit
def recompute_p(b_qk, b_lse2_row, scale_log2):
    """Backward: probabilities from raw scores and the forward's log2-sum-exp per row.
    ``b_lse2_row`` must be +inf for rows that saw no key (so P = 0 there), never -inf."""
    return tl.exp2(b_qk * scale_log2 - b_lse2_row)


@triton.jit
def load_lse2(p_lse, m_row):
    """The forward's LSE for backward use, in log2 units. Rows outside the sequence and rows
    that saw no key (lse = -inf) get +inf, so their recomputed P is exactly 0."""
    b_lse = tl.load(p_lse, mask=m_row, other=float("-inf"))
    return tl.where(b_lse == float("-inf"), float("inf"), b_lse * 1.4426950408889634)


@triton.jit
def load_row_lse2(p_lse2, m_row):
    """The preprocess kernel's lse2 (``load_lse2``, stored head-major) of a tile's rows; rows
    past the sequence get +inf, so their recomputed P is exactly 0."""
    return tl.load(p_lse2, mask=m_row, other=float("inf"))

