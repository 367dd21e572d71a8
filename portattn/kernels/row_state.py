"""The running softmax state of a query row, ``(acc, m, l)`` (unnormalised output, running max
in log2 units, running sum): its empty start (``empty_rows``) and, past the key loop, a key
chunk's partial merged into it (``merge_partial``, design §3.1), an attention sink folded in
(``fold_sink``), and the normalisation to ``(out, lse)`` (``normalize_rows``). Each decides
bits, so each lives here once; every forward kernel (Triton, Gluon, decode and the split
decode's combine) calls them.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # lse leaves the kernels in natural-log units


@triton.jit
def empty_rows(BLOCK_M: tl.constexpr, BLOCK_DC: tl.constexpr):
    """The state of rows that saw no key yet: (acc 0 [BLOCK_M, BLOCK_DC], m -inf, l 0), where a
    key loop or a chunk's partial starts."""
    return (tl.zeros([BLOCK_M, BLOCK_DC], tl.float32),
            tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32))


@triton.jit
def merge_partial(b_acc, b_m, b_l, c_acc, c_m, c_l):
    """Fold a key chunk's partial ``(c_acc, c_m, c_l)`` (its key loop from the empty state)
    into the running state ``(b_acc, b_m, b_l)`` ([M, D], [M], [M]), chunks in ascending
    order (design §3.1). The side with the smaller max is scaled by ``exp2(m_small - m)`` onto
    the larger one in one explicit fma (no contraction left to the compiler); a row whose
    chunk saw no key (``c_m = -inf``) keeps its state, a row with no state yet (``b_m =
    -inf``) takes the chunk's as it is: a row of one chunk has the bits of the unsplit loop."""
    m_new = tl.maximum(b_m, c_m)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    b_larger = b_m >= c_m
    factor = tl.exp2(tl.minimum(b_m, c_m) - m_use)  # the smaller side's, <= 1
    l_new = tl.where(b_larger, tl.fma(c_l, factor, b_l), tl.fma(b_l, factor, c_l))
    acc_new = tl.where(b_larger[:, None], tl.fma(c_acc, factor[:, None], b_acc),
                       tl.fma(b_acc, factor[:, None], c_acc))
    c_empty = c_m == float("-inf")
    b_empty = b_m == float("-inf")
    l_new = tl.where(c_empty, b_l, tl.where(b_empty, c_l, l_new))
    acc_new = tl.where(c_empty[:, None], b_acc, tl.where(b_empty[:, None], c_acc, acc_new))
    return acc_new, tl.where(c_empty, b_m, m_new), l_new


@triton.jit
def fold_sink(b_acc, b_m, b_l, b_sink):
    """An attention sink (gpt-oss): one more score per row, ``b_sink`` (natural log, [M] or a
    scalar), that has no value: it enters the softmax's denominator only. Folded in after the
    key loop as one more online-softmax step, so the key loop is the same with and without
    sinks; the lse then includes it. A sink of -inf is none (a row that saw no key keeps l = 0:
    out 0, lse -inf)."""
    b_sink2 = b_sink * 1.4426950408889634  # log2 units, as the scores
    b_m_new = tl.maximum(b_m, b_sink2)
    b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = tl.exp2(b_m - b_m_use)
    b_l = b_l * b_alpha + tl.exp2(b_sink2 - b_m_use)
    return b_acc * b_alpha[:, None], b_m_new, b_l


@triton.jit
def normalize_rows(b_acc, b_m, b_l):
    """The forward's last step: out = acc / l (b_acc [M, D]) and the natural-log lse
    ``(m + log2 l) ln 2`` [M]. Rows that saw no visible key (l = 0): out 0, lse -inf."""
    m_empty = b_l == 0.0
    b_out = b_acc / tl.where(m_empty, 1.0, b_l)[:, None]
    b_lse = tl.where(m_empty, float("-inf"), (b_m + tl.log2(tl.where(m_empty, 1.0, b_l))) * LN2)
    return b_out, b_lse


@triton.jit
def finish_rows(b_acc, b_m, b_l, b_sink, HAS_SINK: tl.constexpr):
    """The rows' state after their last key: with ``HAS_SINK`` the sinks folded in
    (``fold_sink``), then ``normalize_rows``'s (out, lse)."""
    if HAS_SINK:
        b_acc, b_m, b_l = fold_sink(b_acc, b_m, b_l, b_sink)
    return normalize_rows(b_acc, b_m, b_l)
