"""Shared test helpers: random packs, running kernel and reference, the accuracy rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import portattn
from portattn import accuracy
from portattn.accuracy import limit, rel_err
from portattn.reference import reference_varlen_attention

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
KERNELS = ("varlen", "fixed_order")


def cu_seqlens(lengths: list[int], device=DEVICE) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


@dataclass
class Pack:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    do: torch.Tensor
    dlse: torch.Tensor


def make_pack(
    lens_q: list[int],
    lens_k: list[int],
    n_heads_q: int = 4,
    n_heads_k: int = 2,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    noncontiguous: bool = False,
    device: str = DEVICE,
) -> Pack:
    """Random packed inputs (never zeros). With ``noncontiguous``, q/k/v/dO are strided views
    (token stride and head stride larger than dense) with ``stride(-1) == 1``."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    if noncontiguous:
        qkv_q = rand(tq, n_heads_q + 3, head_dim + 8)
        q = qkv_q[:, 1 : n_heads_q + 1, 8:]
        kv = rand(tk, 2, n_heads_k, head_dim)
        k, v = kv[:, 0], kv[:, 1]
        do = rand(tq, n_heads_q, 2 * head_dim)[:, :, :head_dim]
    else:
        q = rand(tq, n_heads_q, head_dim)
        k = rand(tk, n_heads_k, head_dim)
        v = rand(tk, n_heads_k, head_dim)
        do = rand(tq, n_heads_q, head_dim)
    dlse = torch.randn(tq, n_heads_q, generator=gen).to(device)
    return Pack(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), do, dlse)


def run_kernel(p: Pack, kernel: str, causal: bool, use_dlse: bool = True, **kw):
    """Forward + backward through autograd; returns dict of out, lse, dq, dk, dv."""
    # detach() keeps the (possibly non-contiguous) strides of the inputs
    q, k, v = (x.detach().requires_grad_() for x in (p.q, p.k, p.v))
    out, lse = portattn.varlen_attention(
        q, k, v, p.cu_q, p.cu_k, causal=causal, return_lse=True, kernel=kernel, **kw
    )
    grads = [p.do] + ([torch.where(torch.isinf(lse), 0.0, p.dlse)] if use_dlse else [None])
    outs = [out] + ([lse] if use_dlse else [])
    dq, dk, dv = torch.autograd.grad(outs, (q, k, v), grads[: len(outs)])
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_reference(p: Pack, causal: bool, compute_dtype=torch.float64, use_dlse: bool = True, **kw):
    """The same computation through the reference, in ``compute_dtype``."""
    q, k, v = (x.detach().to(compute_dtype).requires_grad_() for x in (p.q, p.k, p.v))
    out, lse = reference_varlen_attention(
        q, k, v, p.cu_q, p.cu_k, causal=causal, compute_dtype=compute_dtype, **kw
    )
    loss = (out * p.do.to(compute_dtype)).sum()
    if use_dlse:
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * p.dlse.to(compute_dtype)).sum()
    if q.numel() + k.numel() == 0:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    else:
        dq, dk, dv = torch.autograd.grad(loss, (q, k, v), allow_unused=True)
        dq = torch.zeros_like(q) if dq is None else dq
        dk = torch.zeros_like(k) if dk is None else dk
        dv = torch.zeros_like(v) if dv is None else dv
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error over rows that see keys; -inf must match exactly."""
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "lse -inf rows differ"
    return accuracy.lse_err(lse, ref)


def assert_accurate(p: Pack, kernel: str, causal: bool, **kw) -> dict:
    """The acceptance rule (``portattn.accuracy``): every output's error against float64 is at
    most 2x the error of the same computation done eagerly in the input dtype, plus a small
    margin. Also: no NaN, and lse is -inf on exactly the reference's rows."""
    got = run_kernel(p, kernel, causal, **kw)
    ref = run_reference(p, causal, **kw)
    eager = run_reference(p, causal, compute_dtype=p.q.dtype, **kw)
    report = {}
    for name in ("out", "dq", "dk", "dv", "lse"):
        assert not torch.isnan(got[name]).any(), f"{name} has NaN (unwritten or bad math)"
        err_of = lse_err if name == "lse" else rel_err
        err, base = err_of(got[name], ref[name]), err_of(eager[name].to(got[name].dtype), ref[name])
        report[name] = (err, base)
        bound = limit(name, base)
        assert err <= bound, (
            f"{name}: error {err:.3g} > {bound:.3g} (2 x eager {base:.3g} + margin)"
        )
    return report


def assert_bitwise_equal(a: dict, b: dict, names=("out", "lse", "dq", "dk", "dv")) -> None:
    for name in names:
        assert torch.equal(a[name], b[name]), f"{name} differs bitwise"
