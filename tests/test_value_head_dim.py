"""A value head dim of its own (issue 25 item 4): q, k [..., D], v [..., Dv], out [..., Dv]
(MLA training and prefill: D 192, Dv 128). Accuracy of out, lse, dq, dk, dv (and dsinks) against
float64, both kernels, with the model features; the invariances bitwise; the decode and paged
paths; the dense and flash-attn entry points; torch.compile; the errors. CPU: float16 under
the interpreter at small head dims where the point is the mechanism; on a GPU bfloat16 and
larger sizes too (``gpu`` marker)."""

from __future__ import annotations

import dataclasses

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
from test_fixed_order import assert_correctly_rounded

import portattn
from portattn.configs import Tiles, pair_config, table_for
from portattn.flash_compat import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from portattn.reference import reference_attention

# Odd lengths, a sequence of one query row, an empty one, causal with Sq > Sk (63 vs 40).
LENS_Q, LENS_K = [1, 17, 0, 63], [5, 17, 3, 40]
DTYPES = (torch.float16, torch.bfloat16) if HAS_GPU else (torch.float16,)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "dims, causal", [((48, 32), True), ((64, 32), False), ((32, 64), True)], ids=str
)
def test_accuracy(dims, causal, kernel):
    """out, lse, dq, dk, dv by the accuracy rule, every element written (NaN-poisoned
    buffers); GQA 4/2, strided views, Dv < D and Dv > D."""
    p = make_pack(LENS_Q, LENS_K, head_dim=dims[0], head_dim_v=dims[1], seed=51, noncontiguous=True)
    got = run_kernel(p, kernel, causal)
    assert got["out"].shape == (sum(LENS_Q), 4, dims[1])
    assert got["dv"].shape == p.v.shape and got["dk"].shape == p.k.shape
    assert_accurate(p, kernel, causal)


@pytest.mark.parametrize("kernel", KERNELS)
def test_mla_192_128(kernel):
    """The MLA pair itself (the d256 row; block widths 256 and 128), causal, GQA."""
    p = make_pack([9, 0, 20], [9, 2, 13], 2, 1, 192, head_dim_v=128, seed=52, noncontiguous=True)
    assert_accurate(p, kernel, True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_with_window_softcap_sinks(kernel):
    """Dv != D combined with a sliding window, softcap and sinks (dsinks checked too)."""
    p = make_pack([17, 30], [17, 40], head_dim=48, head_dim_v=32, seed=53)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=p.q.device)
    feats = dict(window_size=(9, 3), softcap=3.0, sinks=sinks)
    assert_accurate(p, kernel, False, **feats)
    assert_accurate(p, kernel, True, window_size=(6, -1))


@pytest.mark.parametrize("kernel", KERNELS)
def test_pack_positions_bitwise(kernel):
    """A sequence alone gives the bytes it gets first, between and last in a pack."""
    target = make_pack([19], [26], head_dim=48, head_dim_v=32, seed=54)
    dims = dict(head_dim=48, head_dim_v=32)
    others = [make_pack([n], [n], **dims, seed=55 + i) for i, n in enumerate([5, 12])]
    alone = run_kernel(target, kernel, True)
    for j in range(len(others) + 1):
        seqs = others[:j] + [target] + others[j:]
        res = run_kernel(pack_of(seqs), kernel, True)
        q0 = sum(s.q.shape[0] for s in seqs[:j])
        k0 = sum(s.k.shape[0] for s in seqs[:j])
        assert_bitwise_equal(alone, rows_of(res, q0, q0 + 19, k0, k0 + 26))


def test_decode_rows_and_paged_cache_bitwise():
    """Decode (the decode kernel: one query row) equals the prefill's last row; a paged cache
    with v's own head dim gives the same bytes as the packed call."""
    p = make_pack([24], [24], head_dim=48, head_dim_v=32, seed=56)
    prefill = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True)
    cu1 = cu_seqlens([1], p.q.device)
    last = portattn.varlen_attention(p.q[-1:], p.k, p.v, cu1, p.cu_k, causal=True)
    assert torch.equal(last, prefill[-1:])
    k_cache = torch.zeros(2, 16, 2, 48, dtype=p.q.dtype, device=p.q.device)
    v_cache = torch.zeros(2, 16, 2, 32, dtype=p.q.dtype, device=p.q.device)
    k_cache.view(32, 2, 48)[:24], v_cache.view(32, 2, 32)[:24] = p.k, p.v
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=p.q.device)
    out = flash_attn_with_kvcache(
        p.q[None, -1:], k_cache, v_cache, cache_seqlens=24, block_table=table, causal=True
    )
    assert out.shape == (1, 1, 4, 32) and torch.equal(out[0], prefill[-1:])


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_and_flash_compat(kernel):
    """``attention`` (BSHD) and flash-attn's functions take v with its own head dim and give
    the varlen bytes; the dense reference agrees with the varlen one."""
    p = make_pack([12, 12], [15, 15], head_dim=64, head_dim_v=32, seed=57)
    want, want_lse = portattn.varlen_attention(
        p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True, return_lse=True, kernel=kernel
    )
    q, k, v = p.q.view(2, 12, 4, 64), p.k.view(2, 15, 2, 64), p.v.view(2, 15, 2, 32)
    out, lse = portattn.attention(q, k, v, causal=True, return_lse=True, kernel=kernel)
    assert out.shape == (2, 12, 4, 32) and torch.equal(out.reshape(24, 4, 32), want)
    assert torch.equal(lse.permute(0, 2, 1).reshape(24, 4), want_lse)
    got = flash_attn_varlen_func(p.q, p.k, p.v, p.cu_q, p.cu_k, 12, 15, causal=True, kernel=kernel)
    assert torch.equal(got, want)
    assert torch.equal(flash_attn_func(q, k, v, causal=True, kernel=kernel), out)
    ref, _ = reference_attention(q, k, v, causal=True)
    assert ref.shape == out.shape


def test_under_torch_compile():
    """fullgraph=True: the fake ops give out [T, Hq, Dv] and the gradients their inputs'
    shapes; compiled forward and backward give the eager bytes (lse differentiable)."""
    p = make_pack([9, 14], [9, 14], head_dim=48, head_dim_v=32, seed=58)

    def fn(q, k, v):
        out, lse = portattn.varlen_attention(
            q, k, v, p.cu_q, p.cu_k, 14, 14, causal=True, return_lse=True, kernel="fixed_order"
        )
        return out, lse

    def fwd_bwd(f):
        leaves = [x.detach().requires_grad_() for x in (p.q, p.k, p.v)]
        out, lse = f(*leaves)
        (out.float() * p.do.float()).sum().add((lse * p.dlse).sum()).backward()
        return out, lse, *(x.grad for x in leaves)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for got, want in zip(fwd_bwd(compiled), fwd_bwd(fn)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "dims, dtype",
    [((48, 32), torch.float16)]
    + ([(d, t) for d in ((192, 128), (64, 128)) for t in DTYPES] if HAS_GPU else []),
    ids=str,
)
def test_fixed_order_correctly_rounded(dims, dtype):
    """fixed_order keeps split-P with v's own head dim: >= 99% of out/dq/dk/dv correctly
    rounded, Frobenius error within 1.05x of the rounding floor, lse within 1e-5 (as
    test_fixed_order.test_correctly_rounded holds for Dv == D)."""
    p = make_pack([63, 17, 30, 1], [63, 30, 40, 1], 2, 1, dims[0], dtype, 65, head_dim_v=dims[1])
    assert_correctly_rounded(p, True)


def test_pair_rows():
    """A pair runs its wider head dim's row; from Triton 3.9 the sm90 fixed_order (192, 128)
    dQ has half the key tile (d256's spills with the pair there) and the sm80 fixed_order
    forward one program per query tile; Dv == D is the row itself."""
    for triton in ((3, 6), (3, 9)):
        table = table_for(triton)
        for kernel in KERNELS:
            row = table[("sm90", kernel, 256, torch.bfloat16)]
            got = pair_config(row, "sm90", kernel, 192, 128, triton)
            changed = kernel == "fixed_order" and triton >= (3, 9)
            assert got.bwd_dq == (Tiles(128, 16, 8, 2) if changed else row.bwd_dq)
            assert dataclasses.replace(got, bwd_dq=row.bwd_dq) == row  # nothing else differs
            assert pair_config(row, "sm90", kernel, 256, 256, triton) is row
    # sm80 fixed_order under 3.9: d256's two programs per query tile (fwd_chunks=2) spill with
    # the pair; it runs one, the row's tiles otherwise.
    for triton in ((3, 6), (3, 9)):
        row = table_for(triton)[("sm80", "fixed_order", 256, torch.bfloat16)]
        got = pair_config(row, "sm80", "fixed_order", 192, 128, triton)
        assert row.fwd_chunks == (2 if triton >= (3, 9) else 1)
        assert got == dataclasses.replace(row, fwd_chunks=1)


def _tensors(q_dim: int, k_dim: int, v_dim: int, tk: int = 3, hk: int = 1, hv: int = 1):
    z = dict(dtype=torch.float16, device=DEVICE)
    q = torch.zeros(3, 2, q_dim, **z)
    return q, torch.zeros(tk, hk, k_dim, **z), torch.zeros(3, hv, v_dim, **z)


@pytest.mark.parametrize(
    "dims, counts, match",
    [
        ((64, 64, 40), {}, r"v head dim must equal q's \(64\) or be one of"),
        ((64, 64, 264), {}, r"v head dim must equal q's \(64\) or be one of"),
        ((64, 32, 32), {}, r"k head dim must equal q's \(64\), got 32"),
        ((200, 200, 128), {}, r"v head dim must equal q's \(200\) or be one of .*\(192, 128\)"),
        ((192, 192, 64), {}, r"v head dim must equal q's \(192\) or be one of .*\(192, 128\)"),
        ((196, 196, 128), {}, r"head dim must be one of .*\(192, 128\)"),
        ((64, 64, 32), dict(tk=4), "k and v must have the same shape but for the head dim"),
        ((64, 64, 32), dict(hk=2, hv=1), "k and v must have the same shape but for the head"),
    ],
    ids=["dv40", "dv264", "dk-not-dq", "d200-dv128", "d192-dv64", "d196-dv128", "tokens", "heads"],
)
def test_errors(dims, counts, match):
    q, k, v = _tensors(*dims, **counts)
    cu = cu_seqlens([3], DEVICE)
    with pytest.raises(ValueError, match=match):
        portattn.varlen_attention(q, k, v, cu, cu_seqlens([k.shape[0]], DEVICE))
    with pytest.raises(ValueError, match=match):
        portattn.attention(q[None], k[None], v[None])


def test_kvcache_append_errors():
    """The new values to append must have v_cache's head dim, the new keys k_cache's."""
    z = dict(dtype=torch.float16, device=DEVICE)
    q = torch.zeros(1, 1, 2, 48, **z)
    k_cache, v_cache = torch.zeros(1, 16, 1, 48, **z), torch.zeros(1, 16, 1, 32, **z)
    k_new, v_new = torch.zeros(1, 1, 1, 48, **z), torch.zeros(1, 1, 1, 48, **z)
    with pytest.raises(ValueError, match=r"v must be \[B, S_new, Hkv, v_cache's head dim\]"):
        flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=3)


# --- GPU (skipped without one): bfloat16, the MLA pair at training sizes ---------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dims", [(192, 128), (128, 64), (64, 128)], ids=str)
def test_gpu_accuracy(dims, causal, kernel, dtype):
    p = make_pack(
        [1, 17, 0, 300, 1000],
        [5, 17, 3, 200, 1000],
        16,
        4,
        dims[0],
        dtype,
        61,
        head_dim_v=dims[1],
        noncontiguous=True,
    )
    assert_accurate(p, kernel, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_mla_features_and_pack_bitwise(kernel, dtype):
    """(192, 128) with window, softcap and sinks; a sequence alone vs in a pack; its last row
    by the decode kernel (fixed_order on sm90: two output chunks) == the prefill's."""
    p = make_pack([700, 129], [700, 300], 8, 2, 192, dtype, 62, head_dim_v=128)
    sinks = torch.linspace(-1.0, 1.0, 8, device=p.q.device)
    assert_accurate(p, kernel, True, window_size=(256, -1), softcap=20.0, sinks=sinks)
    target = make_pack([513], [513], 8, 2, 192, dtype, 63, head_dim_v=128)
    other = make_pack([77], [77], 8, 2, 192, dtype, 64, head_dim_v=128)
    alone = run_kernel(target, kernel, True)
    res = run_kernel(pack_of([other, target]), kernel, True)
    assert_bitwise_equal(alone, rows_of(res, 77, 77 + 513, 77, 77 + 513))
    with torch.no_grad():
        t = target
        last = portattn.varlen_attention(
            t.q[-1:], t.k, t.v, cu_seqlens([1], DEVICE), t.cu_k, causal=True, kernel=kernel
        )
    assert torch.equal(last, alone["out"][-1:])
