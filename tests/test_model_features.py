"""Sliding windows (``window_size=(left, right)``), softcapping (``softcap=c``: scores
``c * tanh(scale * q.k / c)`` before the mask and the softmax), flash-attn's conventions, and
attention sinks (``sinks`` [Hq], gpt-oss):
accuracy against the float64 reference (forward and backward, lse gradient included), the
bitwise invariances of design §3 with each, the paged / decode path, the dense entry point and
the argument checks. CPU: float16 under the interpreter; on a GPU bfloat16 too."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    DEVICE,
    HAS_GPU,
    KERNELS,
    assert_accurate,
    assert_bitwise_equal,
    cu_seqlens,
    make_pack,
    run_kernel,
)
from invariance_checks import pack_of, rows_of

import portattn
from portattn import accuracy
from portattn.reference import reference_varlen_attention

DTYPES = (torch.float16, torch.bfloat16) if HAS_GPU else (torch.float16,)
# (causal, window): causal with a left window (Mistral, Gemma, gpt-oss), two-sided local
# windows, one-sided ones, and a window of one key.
WINDOWS = [
    (True, (7, -1)),
    (True, (0, -1)),
    (False, (5, 3)),
    (False, (-1, 4)),
]
# Odd lengths, an empty sequence, Sq > Sk (causal rows that see no key), Sq < Sk.
LENS_Q = [1, 17, 0, 63, 40, 113]
LENS_K = [5, 17, 3, 40, 90, 113]


def _ids(cases):
    return [f"causal{int(c)}-w{w[0]}_{w[1]}" for c, w in cases]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal, window", WINDOWS, ids=_ids(WINDOWS))
def test_window_accuracy(causal, window, kernel, dtype):
    """out, lse, dq, dk, dv against the float64 reference with the same window, by the usual
    rule (2x the eager error in the input dtype plus a margin); GQA 4/2, d32 (d64 on a GPU)."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 64 if HAS_GPU else 32, dtype, seed=11)
    assert_accurate(p, kernel, causal, window_size=window)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_window_wider_than_every_sequence_is_no_window(kernel, causal):
    """A window no row reaches past gives the bytes of the unwindowed call: the windowed path
    masks every tile it visits, and a fully visible tile gives the same bits masked."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=12)
    full = run_kernel(p, kernel, causal)
    right = -1 if causal else 200
    assert_bitwise_equal(full, run_kernel(p, kernel, causal, window_size=(200, right)))


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_window_spellings_agree(kernel):
    """flash-attn's normalization: with causal the right side is 0 whatever is given, and a
    right side of 0 is causal; every spelling gives the same bytes."""
    p = make_pack([30, 9], [30, 20], 2, 1, 32, seed=13)
    want = run_kernel(p, kernel, True, window_size=(6, -1))
    for causal, window in ((True, (6, 0)), (True, (6, 9)), (False, (6, 0))):
        assert_bitwise_equal(want, run_kernel(p, kernel, causal, window_size=window))
    assert_bitwise_equal(
        run_kernel(p, kernel, True), run_kernel(p, kernel, False, window_size=(-1, 0))
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_window_head_slices(kernel):
    """Whole GQA groups alone give the bytes of those heads in the full call."""
    p = make_pack([21, 40], [30, 40], 4, 2, 32, seed=16)
    full = run_kernel(p, kernel, True, window_size=(8, -1))
    part = type(p)(p.q[:, 2:], p.k[:, 1:], p.v[:, 1:], p.cu_q, p.cu_k, p.do[:, 2:], p.dlse[:, 2:])
    res = run_kernel(part, kernel, True, window_size=(8, -1))
    for name in ("out", "lse", "dq"):
        assert torch.equal(res[name], full[name][:, 2:]), name
    for name in ("dk", "dv"):
        assert torch.equal(res[name], full[name][:, 1:]), name


@pytest.mark.parametrize("kernel", KERNELS)
def test_window_decode_rows_equal_prefill_rows(kernel):
    """The last rows of each sequence through a paged cache (the decode kernel) with a window
    are the bytes of those rows of the windowed prefill."""
    lens = [1, 17, 63, 100]
    left, page = 10, 16
    p = make_pack(lens, lens, 4, 2, 32, seed=17)
    with torch.no_grad():
        out, lse = portattn.varlen_attention(
            p.q,
            p.k,
            p.v,
            p.cu_q,
            p.cu_k,
            causal=True,
            window_size=(left, -1),
            return_lse=True,
            kernel=kernel,
        )
        n_pages = [-(-n // page) for n in lens]
        k_cache = torch.randn(sum(n_pages) + 1, page, 2, 32, device=DEVICE).to(p.k.dtype)
        v_cache = torch.randn_like(k_cache)
        table = torch.zeros(len(lens), max(n_pages), dtype=torch.int32)
        free = list(range(sum(n_pages) + 1))[::-1]  # pages in reverse order
        for b, n in enumerate(lens):
            start = int(p.cu_k[b])
            for j in range(n_pages[b]):
                table[b, j] = free.pop(0)
                rows = slice(j * page, min(n, (j + 1) * page))
                k_cache[table[b, j], : rows.stop - rows.start] = p.k[
                    start + rows.start : start + rows.stop
                ]
                v_cache[table[b, j], : rows.stop - rows.start] = p.v[
                    start + rows.start : start + rows.stop
                ]
        steps = [min(3, n) for n in lens]
        sel = torch.cat(
            [torch.arange(int(p.cu_q[b + 1]) - s, int(p.cu_q[b + 1])) for b, s in enumerate(steps)]
        ).to(DEVICE)
        got, got_lse = portattn.varlen_attention(
            p.q[sel],
            k_cache,
            v_cache,
            cu_seqlens(steps),
            p.cu_k,
            causal=True,
            window_size=(left, -1),
            return_lse=True,
            kernel=kernel,
            block_table=table.to(DEVICE),
        )
    assert torch.equal(got, out[sel]) and torch.equal(got_lse, lse[sel])


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_window_is_varlen_window(kernel):
    """``attention`` on [B, S, H, D] with a window == ``varlen_attention`` on B equal-length
    sequences with it (forward and backward)."""
    batch, seqlen = 2, 37
    p = make_pack([seqlen] * batch, [seqlen] * batch, 2, 1, 32, seed=18)
    var = run_kernel(p, kernel, False, use_dlse=False, window_size=(5, 2))
    qd, kd, vd = (x.detach().view(batch, seqlen, -1, 32).requires_grad_() for x in (p.q, p.k, p.v))
    out = portattn.attention(qd, kd, vd, window_size=(5, 2), kernel=kernel)
    out.backward(p.do.view(batch, seqlen, 2, 32))
    assert torch.equal(out.reshape(-1, 2, 32), var["out"])
    assert torch.equal(qd.grad.reshape(-1, 2, 32), var["dq"])
    assert torch.equal(kd.grad.reshape(-1, 1, 32), var["dk"])


# --- softcap -----------------------------------------------------------------------------

CAP_LENS_Q = [1, 17, 0, 63, 40]
CAP_LENS_K = [5, 17, 3, 40, 90]
# (causal, softcap, window): caps that bite (scores of a few units at scale 1), causal and not,
# and with a sliding window.
CASES = [
    (True, 2.0, (-1, -1)),
    (False, 3.0, (-1, -1)),
    (True, 2.5, (9, -1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal, softcap, window", CASES, ids=[str(c) for c in CASES])
def test_softcap_accuracy(causal, softcap, window, kernel, dtype):
    """out, lse, dq, dk, dv against float64 by the usual rule; softmax_scale 1 so that the
    scores (about N(0, D)) reach the cap."""
    p = make_pack(CAP_LENS_Q, CAP_LENS_K, 4, 2, 32, dtype, seed=21)
    assert_accurate(p, kernel, causal, softmax_scale=1.0, softcap=softcap, window_size=window)


def test_softcap_changes_the_result():
    """The cap is applied (a test of the other tests): capped != uncapped outputs."""
    p = make_pack([40], [40], 2, 1, 32, seed=22)
    capped = run_kernel(p, "varlen", True, softmax_scale=1.0, softcap=2.0)
    plain = run_kernel(p, "varlen", True, softmax_scale=1.0)
    assert (capped["out"].float() - plain["out"].float()).abs().max() > 0.1


def paged_cache(p, lens: list[int], page: int):
    """The pack's K/V (2 kv heads, d32) in a pool of pages of ``page`` keys taken in reverse
    order, the unused slots random: (k pages, v pages [pages, page, 2, 32], int32 block
    table on the device)."""
    n_pages = [math.ceil(n / page) for n in lens]
    pool_k = torch.randn(sum(n_pages), page, 2, 32, device=DEVICE).to(p.k.dtype)
    pool_v = torch.randn_like(pool_k)
    table = torch.zeros(len(lens), max(n_pages), dtype=torch.int32)
    free = list(range(sum(n_pages)))[::-1]
    for b, n in enumerate(lens):
        start = int(p.cu_k[b])
        for j in range(n_pages[b]):
            table[b, j] = free.pop(0)
            rows = range(j * page, min(n, (j + 1) * page))
            pool_k[table[b, j], : len(rows)] = p.k[start + rows.start : start + rows.stop]
            pool_v[table[b, j], : len(rows)] = p.v[start + rows.start : start + rows.stop]
    return pool_k, pool_v, table.to(DEVICE)


# Bad windows and caps: (keyword arguments, error, message).
BAD_FEATURES = [
    (dict(window_size=-1), TypeError, "pair"),
    (dict(window_size=(1, 2, 3)), TypeError, "pair"),
    (dict(window_size=(True, -1)), TypeError, "left must be an int"),
    (dict(window_size=(4, 2.0)), TypeError, "right must be an int"),
    (dict(window_size=(-2, -1)), ValueError, "left must be -1"),
    (dict(window_size=(3, 2**30)), ValueError, "right must be -1"),
    (dict(softcap=True), TypeError, "softcap must be a float"),
    (dict(softcap="1"), TypeError, "softcap must be a float"),
    (dict(softcap=-1.0), ValueError, "softcap must be 0"),
    (dict(softcap=float("nan")), ValueError, "softcap must be 0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be 0"),
]


@pytest.mark.parametrize(
    "kwargs, error, match", BAD_FEATURES, ids=[str(kw) for kw, *_ in BAD_FEATURES]
)
def test_bad_window_or_softcap_raises(kwargs, error, match):
    """Before any launch, from every entry point that takes them."""
    p = make_pack([3], [3], 2, 1, 32, seed=26)
    with pytest.raises(error, match=match):
        portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, **kwargs)
    dense = p.q.view(1, 3, 2, 32), p.k.view(1, 3, 1, 32), p.v.view(1, 3, 1, 32)
    with pytest.raises(error, match=match):
        portattn.attention(*dense, **kwargs)
    with pytest.raises(error, match=match):
        portattn.flash_attn_func(*dense, **kwargs)


# --- sinks ---------------------------------------------------------------------------------


def _sinks(n_heads: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n_heads, generator=gen) * 2).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (-1, -1)), (True, (7, -1))])
def test_sinks_accuracy(causal, window, kernel, dtype):
    """out, lse, dq, dk, dv with sinks by the usual rule (rows that see no key: out 0, lse the
    sink), and the sinks' gradient against float64 autograd by the same rule."""
    p = make_pack(CAP_LENS_Q, CAP_LENS_K, 4, 2, 32, dtype, seed=41)
    sinks = _sinks(4, 41)
    assert_accurate(p, kernel, causal, window_size=window, sinks=sinks)

    def dsinks(compute_dtype, run):
        s = sinks.clone().requires_grad_()
        out, lse = run(s)
        seen = torch.isfinite(lse)
        loss = (out.to(compute_dtype) * p.do.to(compute_dtype)).sum()
        loss = loss + (torch.where(seen, lse, 0) * p.dlse.to(lse.dtype)).sum()
        return torch.autograd.grad(loss, s)[0]

    args = (p.q, p.k, p.v, p.cu_q, p.cu_k)
    common = dict(causal=causal, window_size=window)

    def reference(compute_dtype):
        return lambda s: reference_varlen_attention(
            *args, **common, compute_dtype=compute_dtype, sinks=s.to(compute_dtype)
        )

    kernel_call = dict(common, return_lse=True, kernel=kernel)
    got = dsinks(torch.float32, lambda s: portattn.varlen_attention(*args, **kernel_call, sinks=s))
    ref, eager = dsinks(torch.float64, reference(torch.float64)), dsinks(dtype, reference(dtype))
    err, base = accuracy.rel_err(got, ref), accuracy.rel_err(eager, ref)
    assert err <= accuracy.limit("dsinks", base), (err, base)


def test_sinks_change_the_result_and_rows_without_keys_get_the_sink():
    p = make_pack([0, 1, 9], [4, 0, 9], 4, 2, 32, seed=42)  # Sq > Sk causal, and Sk == 0
    sinks = _sinks(4, 42)
    with torch.no_grad():
        out, lse = portattn.varlen_attention(
            p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True, return_lse=True, sinks=sinks
        )
        plain = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # the row of the sequence with no key
    # lse = (sink * log2 e + log2 1) * ln 2: the sink up to float32 rounding of the round trip
    torch.testing.assert_close(lse[0], sinks, rtol=2e-7, atol=0)
    assert (out[1:].float() - plain[1:].float()).abs().max() > 0.05


@pytest.mark.parametrize(
    "sinks, error, match",
    [
        ([0.0, 0.0], TypeError, "sinks must be a torch.Tensor"),
        (torch.zeros(4, dtype=torch.int32), TypeError, "sinks must be float32"),
        (torch.zeros(3), ValueError, r"sinks must be \[Hq\] = \[2\]"),
        (torch.zeros(1, 2), ValueError, r"sinks must be \[Hq\]"),
    ],
    ids=["list", "int32", "three-heads", "2-D"],
)
def test_bad_sinks_raise(sinks, error, match):
    p = make_pack([3], [3], 2, 1, 32, seed=46)
    if isinstance(sinks, torch.Tensor):
        sinks = sinks.to(DEVICE)
    with pytest.raises(error, match=match):
        portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, sinks=sinks)
    dense = p.q.view(1, 3, 2, 32), p.k.view(1, 3, 1, 32), p.v.view(1, 3, 1, 32)
    with pytest.raises(error, match=match):
        portattn.attention(*dense, sinks=sinks)


@pytest.mark.parametrize("kernel", KERNELS)
def test_features_compile_fullgraph_same_bytes(kernel):
    """A window, a cap and sinks together under ``torch.compile(fullgraph=True)``: the bytes of
    eager mode, out, lse and every gradient (the sinks' included)."""
    p = make_pack([9, 30], [20, 30], 4, 2, 32, seed=47)
    sinks = _sinks(4, 47)

    def fn(q, k, v, s):
        return portattn.varlen_attention(
            q,
            k,
            v,
            p.cu_q,
            p.cu_k,
            30,
            30,
            causal=True,
            window_size=(6, -1),
            softcap=3.0,
            sinks=s,
            return_lse=True,
            kernel=kernel,
        )

    def run(f):
        leaves = [x.detach().requires_grad_() for x in (p.q, p.k, p.v, sinks)]
        out, lse = f(*leaves)
        return (out, lse, *torch.autograd.grad((out, lse), leaves, (p.do, p.dlse)))

    torch._dynamo.reset()
    eager, compiled = run(fn), run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), eager, compiled):
        assert torch.equal(a, b), name


PACKED_FEATURES = [
    (True, dict(window_size=(9, -1))),
    (False, dict(window_size=(6, 11))),
    (True, dict(softcap=1.5)),
    (True, dict(sinks=True)),  # the test makes them
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "causal, features", PACKED_FEATURES, ids=[str(f) for _, f in PACKED_FEATURES]
)
def test_features_pack_positions(kernel, causal, features):
    """With each feature, a sequence alone gives the bytes (out, lse, dq, dk, dv) it gets
    first, in the middle or last of a pack: windows, caps and sinks do not change the tiles'
    anchoring at each sequence's start."""
    if "sinks" in features:
        features = dict(sinks=_sinks(4, 43))
    target = make_pack([45], [50], 4, 2, 32, seed=14)
    others = [
        make_pack([n], [m], 4, 2, 32, seed=15 + i)
        for i, (n, m) in enumerate([(7, 7), (33, 20), (1, 60)])
    ]
    alone = run_kernel(target, kernel, causal, **features)
    for j in range(len(others) + 1):
        seqs = others[:j] + [target] + others[j:]
        res = run_kernel(pack_of(seqs), kernel, causal, **features)
        q0 = sum(s.q.shape[0] for s in seqs[:j])
        k0 = sum(s.k.shape[0] for s in seqs[:j])
        assert_bitwise_equal(alone, rows_of(res, q0, q0 + 45, k0, k0 + 50))


DECODED_FEATURES = [
    dict(softcap=4.0),
    dict(sinks=True),
    dict(sinks=True, softcap=2.0, window_size=(20, -1)),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("features", DECODED_FEATURES, ids=str)
def test_features_decode_rows_equal_prefill_rows(kernel, features):
    """The last row of each sequence through a paged cache (the decode kernel, whose tile holds
    the rows of several heads; pages of 16 in reverse order) is, with caps and sinks, the
    byte-equal row of the prefill with them."""
    if "sinks" in features:
        features = dict(features, sinks=_sinks(4, 45))
    lens = [1, 17, 63]
    p = make_pack(lens, lens, 4, 2, 32, seed=25)
    pool_k, pool_v, table = paged_cache(p, lens, 16)
    last = (p.cu_q[1:] - 1).long()
    common = dict(causal=True, return_lse=True, kernel=kernel, **features)
    with torch.no_grad():
        out, lse = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, **common)
        one = cu_seqlens([1] * len(lens))
        got, got_lse = portattn.varlen_attention(
            p.q[last], pool_k, pool_v, one, p.cu_k, block_table=table, **common
        )
    assert torch.equal(got, out[last]) and torch.equal(got_lse, lse[last])
