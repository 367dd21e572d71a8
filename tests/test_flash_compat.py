"""flash-attn compatible entry points: signature, return conventions, same bits as portattn's own
API, and a clear error for every feature portattn does not implement."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import DEVICE, KERNELS, make_pack
from torch._dynamo.testing import CompileCounterWithBackend

import portattn

_EMPTY = inspect.Parameter.empty

# flash-attn 2.8 (flash_attn/flash_attn_interface.py): positional parameters and defaults, in
# order. Both functions take q, k, v first and the same options after their own tensors.
# window_size (-1, -1) means no window; softcap 0.0 means off.
_OPTIONS = [
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("softcap", 0.0),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
]


def _required(*names: str) -> list[tuple[str, object]]:
    """Parameters without a default, in order."""
    return [(name, _EMPTY) for name in names]


FLASH_ATTN_VARLEN_FUNC = [
    *_required("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    *_OPTIONS,
    ("block_table", None),
]
FLASH_ATTN_FUNC = [*_required("q", "k", "v"), *_OPTIONS]

LENS_Q = [9, 0, 17, 1]
LENS_K = [9, 4, 25, 0]


def _positional(fn) -> list[tuple[str, object]]:
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.default) for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]


@pytest.mark.parametrize(
    "fn, expected",
    [
        (portattn.flash_attn_varlen_func, FLASH_ATTN_VARLEN_FUNC),
        (portattn.flash_attn_func, FLASH_ATTN_FUNC),
    ],
)
def test_signature_matches_flash_attn(fn, expected):
    assert _positional(fn) == expected
    extra = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert [(p.name, p.default) for p in extra] == [("kernel", "varlen")]


def _varlen_both(p, kernel, causal, **fa_kwargs):
    """(out, lse [Hq, total_q], dq, dk, dv) through flash_attn_varlen_func, and the same through
    varlen_attention (lse transposed), out and lse both carrying a gradient."""
    results = []
    for use_fa in (True, False):
        q, k, v = (x.detach().requires_grad_() for x in (p.q, p.k, p.v))
        if use_fa:
            out, lse, s_dmask = portattn.flash_attn_varlen_func(
                q,
                k,
                v,
                p.cu_q,
                p.cu_k,
                max(LENS_Q),
                max(LENS_K),
                causal=causal,
                return_attn_probs=True,
                kernel=kernel,
                **fa_kwargs,
            )
            assert s_dmask.numel() == 0
        else:
            out, lse = portattn.varlen_attention(
                q, k, v, p.cu_q, p.cu_k, causal=causal, return_lse=True, kernel=kernel
            )
            lse = lse.t()
        dlse = torch.where(torch.isinf(lse), 0.0, p.dlse.t())
        grads = torch.autograd.grad((out, lse), (q, k, v), (p.do, dlse))
        results.append((out.detach(), lse.detach(), *grads))
    return results


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_varlen_same_bits(kernel, causal):
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=90)
    fa, ours = _varlen_both(p, kernel, causal)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), fa, ours):
        assert torch.equal(a, b), name


def test_varlen_return_conventions():
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=91)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, max(LENS_Q), max(LENS_K))
    out = portattn.flash_attn_varlen_func(*args)
    assert isinstance(out, torch.Tensor) and out.shape == p.q.shape
    got = portattn.flash_attn_varlen_func(*args, return_attn_probs=True)
    assert isinstance(got, tuple) and len(got) == 3
    out2, lse, s_dmask = got
    assert torch.equal(out, out2)
    total_q = sum(LENS_Q)
    assert lse.shape == (4, total_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    _, ref_lse = portattn.varlen_attention(*args[:5], return_lse=True)
    assert torch.equal(lse, ref_lse.t())
    assert s_dmask.shape == (0,) and s_dmask.dtype == p.q.dtype
    # positional arguments in flash-attn's order: dropout_p, softmax_scale, causal
    pos = portattn.flash_attn_varlen_func(*args, 0.0, 0.2, True)
    assert torch.equal(pos, portattn.varlen_attention(*args, causal=True, softmax_scale=0.2))


def test_deterministic_and_causal_window_accepted():
    """deterministic is ignored (always deterministic); window (-1, 0) is flash-attn's causal."""
    p = make_pack(LENS_Q, LENS_K, 2, 1, 32, seed=92)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, max(LENS_Q), max(LENS_K))
    causal = portattn.flash_attn_varlen_func(*args, causal=True)
    assert torch.equal(portattn.flash_attn_varlen_func(*args, window_size=(-1, 0)), causal)
    assert torch.equal(
        portattn.flash_attn_varlen_func(*args, window_size=[-1, -1]),
        portattn.flash_attn_varlen_func(*args),
    )
    det = portattn.flash_attn_varlen_func(*args, causal=True, deterministic=True)
    assert torch.equal(det, causal)


def test_window_size_is_varlen_attentions():
    """A sliding window goes through to ``varlen_attention`` / ``attention`` (same bits)."""
    p = make_pack([9, 30], [20, 30], 2, 1, 32, seed=96)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, 30, 30)
    for causal, window in ((True, (5, -1)), (False, (7, 3)), (False, (-1, 4))):
        got = portattn.flash_attn_varlen_func(*args, causal=causal, window_size=window)
        want = portattn.varlen_attention(*args, causal=causal, window_size=window)
        assert torch.equal(got, want), (causal, window)
    dense = p.q[9:].view(1, 30, 2, 32), p.k[20:].view(1, 30, 1, 32), p.v[20:].view(1, 30, 1, 32)
    got = portattn.flash_attn_func(*dense, causal=True, window_size=(6, 0))
    want = portattn.attention(*dense, causal=True, window_size=(6, 0))
    assert torch.equal(got, want)


def test_softcap_is_varlen_attentions():
    """``softcap`` goes through to ``varlen_attention`` / ``attention`` (same bits)."""
    p = make_pack([9, 30], [20, 30], 2, 1, 32, seed=97)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, 30, 30)
    got = portattn.flash_attn_varlen_func(*args, causal=True, softcap=2.5)
    assert torch.equal(got, portattn.varlen_attention(*args, causal=True, softcap=2.5))
    dense = p.q[9:].view(1, 30, 2, 32), p.k[20:].view(1, 30, 1, 32), p.v[20:].view(1, 30, 1, 32)
    got = portattn.flash_attn_func(*dense, softcap=2.5, window_size=(4, 4))
    assert torch.equal(got, portattn.attention(*dense, softcap=2.5, window_size=(4, 4)))


UNSUPPORTED = [
    (dict(dropout_p=0.1), "dropout"),
    (dict(alibi_slopes="tensor"), "ALiBi"),
]


@pytest.mark.parametrize("kwargs, feature", UNSUPPORTED, ids=[f for _, f in UNSUPPORTED])
def test_unsupported_features_raise(kwargs, feature):
    p = make_pack([3, 4], [3, 4], 2, 1, 32, seed=93)
    kwargs = {
        name: torch.ones(2, dtype=torch.float32, device=DEVICE) if value == "tensor" else value
        for name, value in kwargs.items()
    }
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, 4, 4)
    with pytest.raises(ValueError, match=feature):
        portattn.flash_attn_varlen_func(*args, **kwargs)
    dense = p.q.view(1, 7, 2, 32)
    with pytest.raises(ValueError, match=feature):
        portattn.flash_attn_func(dense, dense[:, :, :1], dense[:, :, :1], **kwargs)


def test_block_table_is_paged_varlen_attention():
    """flash-attn's varlen function with a block_table reads paged caches, as
    ``varlen_attention(..., block_table=)`` does (the same bits)."""
    p = make_pack([1, 2], [20, 5], 2, 1, 32, seed=95)
    page = 16
    k_cache = torch.randn(4, page, 1, 32, device=DEVICE).to(p.k.dtype)
    v_cache = torch.randn(4, page, 1, 32, device=DEVICE).to(p.k.dtype)
    table = torch.tensor([[2, 0], [3, -1]], dtype=torch.int32, device=DEVICE)
    for b, (start, n) in enumerate([(0, 20), (20, 5)]):
        for j in range(n):
            k_cache[table[b, j // page], j % page] = p.k[start + j]
            v_cache[table[b, j // page], j % page] = p.v[start + j]
    with torch.no_grad():
        got = portattn.flash_attn_varlen_func(
            p.q, k_cache, v_cache, p.cu_q, p.cu_k, 2, 20, causal=True, block_table=table
        )
        packed = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True)
    assert torch.equal(got, packed)


def _paged_call_args():
    """A paged flash_attn_varlen_func call: 2 sequences of 20 and 5 keys in pages of 16."""
    p = make_pack([1, 2], [20, 5], 2, 1, 32, seed=97)
    cache = torch.randn(4, 16, 1, 32, device=DEVICE).to(p.k.dtype)
    table = torch.tensor([[2, 0], [3, -1]], dtype=torch.int32, device=DEVICE)
    return p, cache, table


def test_block_table_out_of_range_is_a_runtime_error():
    """flash-attn's bounds test expects a RuntimeError where a block table names a page
    outside the cache (its CUDA check): portattn's CacheIndexError is a RuntimeError and a
    ValueError (portattn's bad-value convention), so either ``except`` catches it."""
    p, cache, table = _paged_call_args()
    assert issubclass(portattn.CacheIndexError, RuntimeError)
    assert issubclass(portattn.CacheIndexError, ValueError)
    bad_page = table.clone()
    bad_page[0, 1] = 4  # the cache has pages 0..3
    too_many = torch.tensor([0, 33, 38], dtype=torch.int32, device=DEVICE)  # 2 pages hold 32
    cases = [
        (bad_page, p.cu_k, "names page 4, outside the cache's 4 pages"),
        (table, too_many, r"sequence 0 has 33 keys \(cu_seqlens_k\), more than"),
    ]
    for block_table, cu_k, match in cases:
        for max_seqlen in ((2, 40), (None, None)):  # values checked in the op / before it
            with torch.no_grad(), pytest.raises(RuntimeError, match=match) as err:
                portattn.flash_attn_varlen_func(
                    p.q, cache, cache, p.cu_q, cu_k, *max_seqlen, block_table=block_table
                )
            assert isinstance(err.value, portattn.CacheIndexError)


def test_block_table_with_packed_k_says_why_4d():
    """A block_table makes k and v paged caches: a 3-D (packed) k is told so."""
    p, _, table = _paged_call_args()
    with torch.no_grad(), pytest.raises(ValueError, match=r"k must be 4-D .*with a block_table"):
        portattn.flash_attn_varlen_func(p.q, p.k, p.v, p.cu_q, p.cu_k, 2, 20, block_table=table)


def test_bad_types_raise():
    p = make_pack([3], [3], 2, 1, 32, seed=94)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, 3, 3)
    with pytest.raises(TypeError, match="window_size"):
        portattn.flash_attn_varlen_func(*args, window_size=-1)
    with pytest.raises(TypeError, match="dropout_p"):
        portattn.flash_attn_varlen_func(*args, dropout_p="0")
    with pytest.raises(ValueError, match="max_seqlen_q"):  # portattn's own checks run too
        portattn.flash_attn_varlen_func(*args[:5], 2, 3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_same_bits(kernel):
    """flash_attn_func equals portattn.attention bitwise; lse [B, Hq, Sq] contiguous."""
    gen = torch.Generator().manual_seed(95)
    q = torch.randn(2, 11, 4, 32, generator=gen).half().to(DEVICE)
    k = torch.randn(2, 14, 2, 32, generator=gen).half().to(DEVICE)
    v = torch.randn(2, 14, 2, 32, generator=gen).half().to(DEVICE)
    out = portattn.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    out2, lse, s_dmask = portattn.flash_attn_func(
        q, k, v, causal=True, return_attn_probs=True, kernel=kernel
    )
    ref_out, ref_lse = portattn.attention(q, k, v, causal=True, return_lse=True, kernel=kernel)
    assert torch.equal(out, ref_out) and torch.equal(out2, ref_out)
    assert lse.shape == (2, 4, 11) and lse.is_contiguous() and torch.equal(lse, ref_lse)
    assert s_dmask.numel() == 0


def test_compile_fullgraph():
    """The flash-attn entry point compiles without a graph break (max_seqlen is always given)."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=96)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, max(LENS_Q), max(LENS_K))

    def fn(*a):
        return portattn.flash_attn_varlen_func(*a, causal=True, return_attn_probs=True)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    for a, b in zip(fn(*args)[:2], compiled(*args)[:2]):
        assert torch.equal(a, b)
    assert counter.frame_count == 1


def test_flags_must_be_bools():
    """return_attn_probs, causal and deterministic: Python or numpy bools, nothing else
    (TypeError naming the flag and the qualified type)."""
    import numpy as np

    p = make_pack([3], [3], 2, 1, 32, seed=97)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, 3, 3)
    dense = p.q.view(1, 3, 2, 32)
    dense_kv = p.k.view(1, 3, 1, 32)
    calls = (
        lambda **kw: portattn.flash_attn_varlen_func(*args, **kw),
        lambda **kw: portattn.flash_attn_func(dense, dense_kv, dense_kv, **kw),
    )
    for call in calls:
        for flag in ("return_attn_probs", "causal", "deterministic"):
            with pytest.raises(TypeError, match=f"{flag} must be a bool, got str"):
                call(**{flag: "no"})
            with pytest.raises(TypeError, match=f"{flag} must be a bool, got numpy.int64"):
                call(**{flag: np.int64(0)})
        got = call(return_attn_probs=np.True_, causal=np.bool_(True), deterministic=np.False_)
        assert isinstance(got, tuple) and len(got) == 3
        ref = call(return_attn_probs=True, causal=True)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
        assert isinstance(call(return_attn_probs=np.False_), torch.Tensor)
    with pytest.raises(TypeError, match="dropout_p must be a float, got numpy.str_"):
        portattn.flash_attn_varlen_func(*args, dropout_p=np.str_("0"))


def test_rank_and_head_dim_checked_first():
    """A 0-D q or head dim 0 through the flash-attn entry points: portattn's ValueError."""
    p = make_pack([3], [3], 2, 1, 32, seed=98)
    scalar = torch.tensor(1.0, dtype=p.q.dtype, device=DEVICE)
    with pytest.raises(ValueError, match=r"q must be 3-D, got shape \(\)"):
        portattn.flash_attn_varlen_func(scalar, p.k, p.v, p.cu_q, p.cu_k, 3, 3)
    with pytest.raises(ValueError, match="head dim must be one of .*, got 0"):
        portattn.flash_attn_varlen_func(
            p.q[..., :0], p.k[..., :0], p.v[..., :0], p.cu_q, p.cu_k, 3, 3
        )
    dense = p.q.view(1, 3, 2, 32)
    with pytest.raises(ValueError, match=r"q must be 4-D, got shape \(\)"):
        portattn.flash_attn_func(scalar, dense, dense)
    with pytest.raises(ValueError, match="head dim must be one of .*, got 0"):
        portattn.flash_attn_func(dense[..., :0], dense[..., :0], dense[..., :0])


def test_max_seqlen_numpy_and_0d_tensors():
    """max_seqlen_q / max_seqlen_k as numpy integers or 0-d integer tensors (what transformers'
    prepare_fa_kwargs_from_position_ids returns): read as ints, the same bits as ints."""
    import numpy as np

    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=99)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k)
    ref = portattn.flash_attn_varlen_func(*args, max(LENS_Q), max(LENS_K), causal=True)
    for wrap in (
        np.int64,
        np.int32,
        lambda n: torch.tensor(n),
        lambda n: torch.tensor(n, dtype=torch.int32, device=DEVICE),
        lambda n: torch.tensor(n, dtype=torch.uint8),
    ):
        got = portattn.flash_attn_varlen_func(
            *args, wrap(max(LENS_Q)), wrap(max(LENS_K)), causal=True
        )
        assert torch.equal(got, ref)
    # the values are still checked against cu_seqlens
    with pytest.raises(ValueError, match="max_seqlen_q"):
        portattn.flash_attn_varlen_func(*args, torch.tensor(2), torch.tensor(max(LENS_K)))


def test_max_seqlen_bools_and_floats_raise():
    import numpy as np

    p = make_pack([3], [3], 2, 1, 32, seed=100)
    args = (p.q, p.k, p.v, p.cu_q, p.cu_k)
    for bad in (True, np.True_, 3.0, np.float64(3), torch.tensor(True), torch.tensor(3.0), "3"):
        with pytest.raises(TypeError, match="max_seqlen_q"):
            portattn.flash_attn_varlen_func(*args, bad, 3)
        with pytest.raises(TypeError, match="max_seqlen_k"):
            portattn.flash_attn_varlen_func(*args, 3, bad)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be .* 0-d .* shape \(1,\)"):
        portattn.flash_attn_varlen_func(*args, torch.tensor([3]), 3)


def test_max_seqlen_0d_tensor_under_compile():
    """Under torch.compile a 0-d tensor is read with .item(): one graph when scalar outputs are
    captured (transformers' advice for its flash path), the same bits as eager."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=101)

    def fn(q, k, v, cu_q, cu_k, max_q, max_k):
        return portattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)

    args = (p.q, p.k, p.v, p.cu_q, p.cu_k, torch.tensor(max(LENS_Q)), torch.tensor(max(LENS_K)))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        got = torch.compile(fn, fullgraph=True, backend=counter)(*args)
    assert torch.equal(got, fn(*args))
    assert counter.frame_count == 1
