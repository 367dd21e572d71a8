"""GPU-only tests: bfloat16 at realistic sizes, and offsets past 2**31 elements.

Marked ``gpu``: skipped only where no GPU exists. Run with ``pytest -m gpu`` on the GPU."""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS, Pack, assert_accurate, cu_seqlens, make_pack

import portattn

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_large_skewed_pack_bf16(kernel, causal):
    lens = [1, 4096, 63, 1000, 2049, 129, 64, 65, 0, 777]
    p = make_pack(lens, lens, 16, 4, 128, torch.bfloat16, seed=70)
    assert_accurate(p, kernel, causal)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("kernel", KERNELS)
def test_head_dims_bf16(kernel, head_dim):
    lens_q, lens_k = [300, 1, 0, 513], [280, 700, 5, 513]
    p = make_pack(lens_q, lens_k, 8, 2, head_dim, torch.bfloat16, seed=71 + head_dim)
    assert_accurate(p, kernel, causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_offsets_past_int32(kernel):
    """A pack whose later sequences start beyond 2**31 elements: their results must equal the
    same sequence run alone (int64 offsets), and match the reference."""
    n_heads, head_dim, seqlen = 16, 128, 1024
    n_seqs = 2**31 // (n_heads * head_dim * seqlen) + 2  # the last two start past 2**31
    free, _ = torch.cuda.mem_get_info()
    need = 10 * n_seqs * seqlen * n_heads * head_dim * 2
    if need > free:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of GPU memory, {free / 2**30:.0f} GiB free")
    total = n_seqs * seqlen
    gen = torch.Generator(device="cuda").manual_seed(72)
    q, k, v, do = (
        torch.randn(total, n_heads, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
        for _ in range(4)
    )
    cu = cu_seqlens([seqlen] * n_seqs, "cuda")
    assert q.numel() > 2**31
    qr, kr, vr = (x.requires_grad_() for x in (q, k, v))
    out, lse = portattn.varlen_attention(
        qr, kr, vr, cu, cu, causal=True, return_lse=True, kernel=kernel
    )
    dq, dk, dv = torch.autograd.grad(out, (qr, kr, vr), do)
    last = slice(total - seqlen, total)
    alone = Pack(
        q[last].detach(),
        k[last].detach(),
        v[last].detach(),
        cu_seqlens([seqlen], "cuda"),
        cu_seqlens([seqlen], "cuda"),
        do[last],
        torch.randn(seqlen, n_heads, device="cuda", generator=gen),
    )
    a_q, a_k, a_v = (x.detach().clone().requires_grad_() for x in (alone.q, alone.k, alone.v))
    a_out, a_lse = portattn.varlen_attention(
        a_q, a_k, a_v, alone.cu_q, alone.cu_k, causal=True, return_lse=True, kernel=kernel
    )
    a_dq, a_dk, a_dv = torch.autograd.grad(a_out, (a_q, a_k, a_v), alone.do)
    for got, want in (
        (out[last], a_out),
        (lse[last], a_lse),
        (dq[last], a_dq),
        (dk[last], a_dk),
        (dv[last], a_dv),
    ):
        assert torch.equal(got, want)
    assert_accurate(alone, kernel, causal=True, use_dlse=False)
