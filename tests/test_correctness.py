"""Forward and backward against the float64 reference (the acceptance rule of helpers.py).

Runs on the GPU when there is one, else under Triton's interpreter (float16 there)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    DEVICE,
    HAS_GPU,
    KERNELS,
    assert_accurate,
    cu_seqlens,
    make_pack,
    rel_err,
    run_kernel,
)

import portattn
from portattn.families import FAMILIES
from portattn.reference import reference_attention, reference_varlen_attention

# Lengths 0, 1, 17, 63, 113, 200 mixed in one pack; key lengths differ, so the pack has
# Sq < Sk (decode-like) and Sq > Sk (causal rows that see nothing) sequences.
LENS_Q = [17, 0, 113, 1, 200, 63, 40]
LENS_K = [17, 5, 63, 200, 113, 0, 1]
SMALL_Q = [17, 0, 63, 1, 30]
SMALL_K = [17, 9, 40, 33, 1]
DTYPES = [torch.float16, torch.bfloat16] if HAS_GPU else [torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_mixed_pack(kernel, causal, dtype):
    p = make_pack(LENS_Q, LENS_K, 4, 2, 64, dtype, seed=1)
    assert_accurate(p, kernel, causal)


@pytest.mark.parametrize("head_dim", [32, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_head_dims(kernel, causal, head_dim):
    p = make_pack(SMALL_Q, SMALL_K, 2, 1, head_dim, seed=2 + head_dim)
    assert_accurate(p, kernel, causal)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("kernel", KERNELS)
def test_gqa(kernel, group):
    p = make_pack(SMALL_Q, SMALL_K, 4, 4 // group, 64, seed=3 + group)
    assert_accurate(p, kernel, causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_noncontiguous_views(kernel):
    p = make_pack(SMALL_Q, SMALL_K, 4, 2, 64, seed=5, noncontiguous=True)
    assert not p.q.is_contiguous() and not p.do.is_contiguous() and not p.k.is_contiguous()
    got = assert_accurate(p, kernel, causal=True)
    assert got
    # the same values laid out densely give the same bits
    dense = make_pack(SMALL_Q, SMALL_K, 4, 2, 64, seed=5, noncontiguous=True)
    for name in ("q", "k", "v", "do"):
        setattr(dense, name, getattr(dense, name).contiguous())
    a, b = run_kernel(p, kernel, True), run_kernel(dense, kernel, True)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("kernel", KERNELS)
def test_bfloat16(kernel):
    """bfloat16 (on the CPU through the interpreter's float32 upcast of exact operands)."""
    p = make_pack(SMALL_Q, SMALL_K, 2, 1, 64, torch.bfloat16, seed=6)
    assert_accurate(p, kernel, causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_softmax_scale(kernel):
    p = make_pack(SMALL_Q, SMALL_K, 2, 2, 64, seed=7)
    assert_accurate(p, kernel, causal=False, softmax_scale=0.3)


def _lse_only_reference(p, compute_dtype):
    """Gradients of sum(lse * dlse) through the reference in ``compute_dtype``."""
    q, k, v = (x.detach().to(compute_dtype).requires_grad_() for x in (p.q, p.k, p.v))
    _, lse = reference_varlen_attention(
        q, k, v, p.cu_q, p.cu_k, causal=True, compute_dtype=compute_dtype
    )
    dlse = torch.where(torch.isinf(lse), 0.0, p.dlse.to(compute_dtype))
    loss = (torch.where(torch.isinf(lse), 0.0, lse) * dlse).sum()
    grads = torch.autograd.grad(loss, (q, k, v), allow_unused=True)
    return {
        n: torch.zeros_like(x) if g is None else g
        for n, x, g in zip(("dq", "dk", "dv"), (q, k, v), grads)
    }


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("use", ["lse_only", "out_and_lse"])
def test_lse_gradient(kernel, use):
    """lse is differentiable: its gradient folds into the row term (delta - dlse). With only
    lse used downstream, autograd passes no dout at all."""
    p = make_pack(SMALL_Q, SMALL_K, 2, 1, 64, seed=8)
    if use == "out_and_lse":
        assert_accurate(p, kernel, causal=True, use_dlse=True)
        return
    q, k, v = (x.detach().requires_grad_() for x in (p.q, p.k, p.v))
    _, lse = portattn.varlen_attention(
        q, k, v, p.cu_q, p.cu_k, causal=True, return_lse=True, kernel=kernel
    )
    loss = (torch.where(torch.isinf(lse), 0.0, lse) * p.dlse).sum()
    got = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(loss, (q, k, v))))
    ref = _lse_only_reference(p, torch.float64)
    eager = _lse_only_reference(p, p.q.dtype)
    assert torch.equal(got["dv"], torch.zeros_like(got["dv"]))  # lse does not depend on v
    for name in ("dq", "dk"):
        assert not torch.isnan(got[name]).any()
        err, base = rel_err(got[name], ref[name]), rel_err(eager[name], ref[name])
        assert err <= 2 * base + 1e-4, f"{name}: error {err:.3g} > 2 x eager {base:.3g}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_that_see_no_key(kernel):
    """Sk == 0 and causal Sq > Sk rows: out 0, lse -inf, zero gradients, no NaN."""
    p = make_pack([5, 40], [0, 3], 2, 1, 64, seed=9)
    got = run_kernel(p, kernel, causal=True)
    assert torch.equal(got["out"][:5], torch.zeros_like(got["out"][:5]))
    assert torch.isneginf(got["lse"][:5]).all()
    assert torch.isneginf(got["lse"][5 : 5 + 37]).all()  # rows 0..36 of sequence 2 see nothing
    assert torch.isfinite(got["lse"][5 + 37 :]).all()
    assert torch.equal(got["out"][5:42], torch.zeros_like(got["out"][5:42]))
    assert torch.equal(got["dq"][:42], torch.zeros_like(got["dq"][:42]))
    for name in ("out", "dq", "dk", "dv"):
        assert not torch.isnan(got[name]).any()
    assert_accurate(p, kernel, causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_inputs(kernel):
    """total == 0, an empty batch, and all-zero-length sequences are valid."""
    for lens_q, lens_k in (([], []), ([0, 0], [0, 0]), ([0, 3], [4, 0]), ([3], [0])):
        p = make_pack(lens_q, lens_k, 2, 1, 64, seed=10)
        got = run_kernel(p, kernel, causal=False)
        assert got["out"].shape == p.q.shape and got["lse"].shape == p.q.shape[:2]
        assert got["dk"].shape == p.k.shape and got["dv"].shape == p.v.shape
        for name in ("out", "dq", "dk", "dv"):
            assert torch.equal(got[name], torch.zeros_like(got[name])), name
        assert torch.isneginf(got["lse"]).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_wrapper(kernel):
    """attention() on [B, S, H, D] equals varlen_attention on equal lengths, bitwise; lse is
    [B, Hq, Sq]; contiguous input is not copied."""
    gen = torch.Generator().manual_seed(11)
    batch, sq, sk, hq, hk, d = 3, 37, 50, 4, 2, 64
    q = torch.randn(batch, sq, hq, d, generator=gen).half().to(DEVICE)
    k = torch.randn(batch, sk, hk, d, generator=gen).half().to(DEVICE)
    v = torch.randn(batch, sk, hk, d, generator=gen).half().to(DEVICE)
    out, lse = portattn.attention(q, k, v, causal=True, return_lse=True, kernel=kernel)
    assert out.shape == q.shape and lse.shape == (batch, hq, sq) and lse.dtype == torch.float32
    vo, vl = portattn.varlen_attention(
        q.reshape(-1, hq, d),
        k.reshape(-1, hk, d),
        v.reshape(-1, hk, d),
        cu_seqlens([sq] * batch),
        cu_seqlens([sk] * batch),
        causal=True,
        return_lse=True,
        kernel=kernel,
    )
    assert torch.equal(out.reshape(-1, hq, d), vo)
    assert torch.equal(lse.permute(0, 2, 1).reshape(-1, hq), vl)
    ro, rl = reference_attention(q, k, v, causal=True)
    assert (out.double() - ro).norm() / ro.norm() < 1e-3
    assert (lse.double() - rl).abs().max() < 1e-3


def test_default_kernel_is_varlen():
    p = make_pack(SMALL_Q, SMALL_K, 2, 1, 64, seed=12)
    a = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k)
    b = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, kernel="varlen")
    assert torch.equal(a, b)


def test_family_without_gpu():
    if HAS_GPU:
        assert portattn.family() in (None, *FAMILIES)
    else:
        assert portattn.family() is None
