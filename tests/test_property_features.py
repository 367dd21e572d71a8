"""Property test of the model features together: hypothesis draws a kernel, causal or not, a
sliding window (none, left, right, both sides, or the diagonal alone), a softcap, attention
sinks, the GQA ratio, the head dim (the borrowed 48 and 80 included) and packs with odd and
empty sequences and causal rows that see no key (Sq > Sk). Each example checks

(a) out, lse, dq, dk, dv and dsinks against the float64 reference by the accuracy rule
    (``helpers.assert_outputs_accurate``: 2x the eager input-dtype error plus a margin);
(b) that every output element was written: the kernels' buffers start NaN-filled and no NaN
    may remain;
(c) one invariance of design §3, bitwise (``torch.equal``): one sequence alone gives the bytes
    of its rows in the pack, or (two kv heads) one GQA group alone gives those heads' bytes.
    ``dsinks`` sums over every row and head of the call, so it is outside (c), as a weight's
    gradient is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from helpers import (
    DEVICE,
    HAS_GPU,
    KERNELS,
    Pack,
    assert_bitwise_equal,
    assert_outputs_accurate,
    cu_seqlens,
    make_pack,
    run_kernel,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invariance_checks import rows_of

from portattn.tools.harness import PackShape

# The interpreter is slow: few, small examples on the CPU (each runs the kernels twice).
EXAMPLES = 40 if HAS_GPU else 16
DTYPES = [torch.float16, torch.bfloat16] if HAS_GPU else [torch.float16]
HEAD_DIMS = [32, 48, 64, 80, 112, 128] if HAS_GPU else [32, 48, 64, 80]
MAX_LEN = 150 if HAS_GPU else 70
# Odd lengths (1, 17, 63: no tile size divides them), empty sequences, and anything up to MAX_LEN.
LENGTHS = st.one_of(st.sampled_from([0, 1, 17, 63]), st.integers(0, MAX_LEN))
# Window sides from a few sizes: each distinct window compiles its own kernels on a GPU.
SIDES = st.sampled_from([0, 1, 5, 16, 40])
WINDOWS = st.one_of(
    st.just((-1, -1)),  # none
    st.tuples(SIDES, st.just(-1)),  # left only
    st.tuples(st.just(-1), SIDES),  # right only (0: causal, flash-attn's convention)
    st.tuples(SIDES, SIDES),  # both sides
    st.just((0, 0)),  # the diagonal key alone
)
SOFTCAPS = st.sampled_from([None, 1.0, 2.5, 20.0])  # None: off; 1.0 bends almost every score
SINK_VALUES = st.floats(-6.0, 6.0, allow_nan=False, width=32)


@dataclass(frozen=True)
class Draw:
    """One example: the pack's shape, the features and which invariance (c) checks."""

    kernel: str
    causal: bool
    shape: PackShape
    dtype: torch.dtype
    window: tuple[int, int]
    softcap: float | None
    sinks: tuple[float, ...] | None
    seed: int
    invariance: str  # "alone" (sequence ``target``) or "heads" (the second kv head's group)
    target: int

    def features(self) -> dict:
        kw: dict = {"window_size": self.window, "softcap": self.softcap}
        if self.sinks is not None:
            kw["sinks"] = torch.tensor(self.sinks, dtype=torch.float32, device=DEVICE)
        return kw


@st.composite
def draws(draw) -> Draw:
    n_seqs = draw(st.integers(1, 3))
    lens_q = [draw(LENGTHS) for _ in range(n_seqs)]
    if not sum(lens_q):  # an all-empty pack has nothing to compare (test_correctness has it)
        lens_q[0] = 1
    lens_k = [draw(st.one_of(st.just(n), LENGTHS)) for n in lens_q]  # Sq == / != Sk
    heads_kv = draw(st.integers(1, 2))
    heads_q = heads_kv * draw(st.sampled_from([1, 2, 4]))
    with_sinks = draw(st.booleans())
    sinks = tuple(draw(SINK_VALUES) for _ in range(heads_q)) if with_sinks else None
    return Draw(
        kernel=draw(st.sampled_from(KERNELS)),
        causal=draw(st.booleans()),
        shape=PackShape(
            tuple(lens_q), tuple(lens_k), heads_q, heads_kv, draw(st.sampled_from(HEAD_DIMS))
        ),
        dtype=draw(st.sampled_from(DTYPES)),
        window=draw(WINDOWS),
        softcap=draw(SOFTCAPS),
        sinks=sinks,
        seed=draw(st.integers(0, 2**31 - 1)),
        invariance=draw(st.sampled_from(["alone", "heads"])),
        target=draw(st.integers(0, n_seqs - 1)),
    )


def _sequence(p: Pack, b: int) -> Pack:
    """Sequence ``b`` of the pack as a pack of its own (the same tensors' rows)."""
    q0, q1, k0, k1 = (int(x) for x in (p.cu_q[b], p.cu_q[b + 1], p.cu_k[b], p.cu_k[b + 1]))
    return Pack(
        p.q[q0:q1],
        p.k[k0:k1],
        p.v[k0:k1],
        cu_seqlens([q1 - q0], p.q.device),
        cu_seqlens([k1 - k0], p.q.device),
        p.do[q0:q1],
        p.dlse[q0:q1],
    )


def check_alone(d: Draw, p: Pack, full: dict) -> None:
    """Sequence ``d.target`` alone == its rows of the whole pack (design §3: pack positions)."""
    b = d.target
    alone = run_kernel(_sequence(p, b), d.kernel, d.causal, poison=True, **d.features())
    lens_q, lens_k = d.shape.lens_q, d.shape.lens_k
    q0, k0 = sum(lens_q[:b]), sum(lens_k[:b])
    rows = rows_of(full, q0, q0 + lens_q[b], k0, k0 + lens_k[b])
    assert_bitwise_equal(alone, rows)


def check_heads(d: Draw, p: Pack, full: dict) -> None:
    """The second kv head's GQA group alone == those heads of the full call (head slices)."""
    group = d.shape.heads_q // d.shape.heads_kv
    a, b = group, 2 * group
    part = Pack(p.q[:, a:b], p.k[:, 1:], p.v[:, 1:], p.cu_q, p.cu_k, p.do[:, a:b], p.dlse[:, a:b])
    kw = d.features()
    if "sinks" in kw:
        kw["sinks"] = kw["sinks"][a:b]
    res = run_kernel(part, d.kernel, d.causal, poison=True, **kw)
    for name in ("out", "lse", "dq"):
        assert torch.equal(res[name], full[name][:, a:b]), name
    for name in ("dk", "dv"):
        assert torch.equal(res[name], full[name][:, 1:]), name


# Combinations every run includes, whatever hypothesis draws: the borrowed head dims with all
# three features, a two-sided window, Sq > Sk causal rows and an empty sequence.
_EXAMPLES = [
    Draw(
        *("fixed_order", False, PackShape((17, 0, 40), (5, 9, 63), 4, 2, 80), torch.float16),
        *((5, 3), 2.5),
        *((1.5, -3.0, 0.0, 4.0), 7, "heads", 0),
    ),
    Draw(
        *("varlen", True, PackShape((63, 1, 30), (17, 63, 30), 4, 1, 48), torch.float16),
        *((16, -1), None),
        *((-2.0, 0.5, 2.0, 6.0), 8, "alone", 0),
    ),
]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(d=draws())
@example(d=_EXAMPLES[0])
@example(d=_EXAMPLES[1])
def test_feature_combinations(d: Draw):
    shape = d.shape
    p = make_pack(
        *(list(shape.lens_q), list(shape.lens_k), shape.heads_q, shape.heads_kv, shape.head_dim),
        *(d.dtype, d.seed),
    )
    features = d.features()
    # (b): poison=True NaN-fills the output buffers; assert_outputs_accurate rejects any NaN.
    full = run_kernel(p, d.kernel, d.causal, poison=True, **features)
    assert set(full) >= {"out", "lse", "dq", "dk", "dv"} | ({"dsinks"} if d.sinks else set())
    assert_outputs_accurate(full, p, d.causal, **features)  # (a)
    if d.invariance == "heads" and shape.heads_kv == 2:  # (c)
        check_heads(d, p, full)
    else:
        check_alone(d, p, full)
