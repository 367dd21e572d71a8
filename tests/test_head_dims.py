"""Head dims without table rows of their own (``configs.BORROWED_HEAD_DIMS``: every multiple of
8 from 8 to 256 that is no table row), run with the next row up (and a head dim's own tiles where
that row spills with it, ``configs.borrowed_config``): accuracy against the float64 reference,
the invariances, the stride rule of the odd multiples of 8, the flash-attn entry points, and the
refusal of the others. CPU: float16 under the interpreter; on a GPU bfloat16 too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import (
    HAS_GPU,
    KERNELS,
    assert_accurate,
    assert_bitwise_equal,
    assert_outputs_accurate,
    make_pack,
    run_kernel,
)
from invariance_checks import pack_of, rows_of

import portattn
from portattn import configs
from portattn.configs import (
    BORROWED_HEAD_DIMS,
    HEAD_DIMS,
    SUPPORTED_HEAD_DIMS,
    Tiles,
    table_head_dim,
)

DTYPES = (torch.float16, torch.bfloat16) if HAS_GPU else (torch.float16,)


def test_borrowed_rows_are_the_next_table_row_up():
    assert tuple(range(8, 257, 8)) == SUPPORTED_HEAD_DIMS
    assert set(SUPPORTED_HEAD_DIMS) == set(HEAD_DIMS) | set(BORROWED_HEAD_DIMS)
    assert not set(HEAD_DIMS) & set(BORROWED_HEAD_DIMS)
    assert [table_head_dim(d) for d in (8, 24, 40, 48, 72, 80, 104, 112, 136, 248)] == [
        32,
        32,
        64,
        64,
        96,
        96,
        128,
        128,
        256,
        256,
    ]
    assert all(table_head_dim(d) == d for d in HEAD_DIMS)


def test_borrowed_tiles_of_their_own():
    """A borrowed head dim's own tiles (``configs.rows.BORROWED_TILES``) replace only the kernels
    named, on the row that each Triton version runs; the decode kernel follows a forward
    that changes; the table's own entries (and their content hashes) are the rows'."""
    for triton in configs.table_versions():
        table = configs.table_for(triton)

        def entry(family, kernel, head_dim, triton=triton):
            return configs.entry_config(family, kernel, head_dim, torch.bfloat16, triton=triton)

        def row(family, kernel, head_dim, table=table):
            return table[(family, kernel, table_head_dim(head_dim), torch.bfloat16)]

        sm90 = entry("sm90", "varlen", 200)
        assert sm90 == dataclasses.replace(row("sm90", "varlen", 200), fwd=Tiles(64, 32, 8, 2)), (
            triton
        )
        assert sm90.decode_tiles() == Tiles(64, 32, 8, 2)
        pre = entry("sm90", "fixed_order", 160)
        assert pre == dataclasses.replace(
            row("sm90", "fixed_order", 160), bwd_pre=Tiles(32, 64, 4, 1)
        )
        dkdv = entry("sm100", "varlen", 160).bwd_dkdv
        assert dkdv == Tiles(32, 64, 8, 1)
        sm120 = entry("sm120", "fixed_order", 72)
        assert (
            sm120.decode_tiles() == Tiles(64, 64, 8, 1)
            and sm120.fwd == row("sm120", "fixed_order", 72).fwd
        )
        for key in (("sm90", "varlen", 40), ("cdna3", "fixed_order", 200), ("sm90", "varlen", 256)):
            assert entry(*key) is row(*key), (key, triton)
        assert not any(d in BORROWED_HEAD_DIMS for _, _, d, _ in table)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("head_dim", [8, 40, 72, 200])
def test_multiple_of_8_accuracy(head_dim, kernel):
    """New head dims (8: block 16 on the d32 row; 40, 72, 200: odd multiples of 8 on the d64,
    d96 and d256 rows): out, lse, dq, dk, dv by the accuracy rule, every element written
    (NaN-poisoned buffers); GQA 4/2, odd lengths 1, 17, 63, an empty sequence, causal with
    Sq > Sk (63 queries, 40 keys: its first rows see no key), strided views whose strides are
    multiples of 8."""
    p = make_pack(
        [1, 17, 0, 63],
        [5, 17, 3, 40],
        4,
        2,
        head_dim,
        torch.float16,
        seed=35 + head_dim,
        noncontiguous=True,
    )
    assert p.q.stride(0) % 8 == 0 and p.q.stride(0) != p.q.shape[1] * head_dim
    got = run_kernel(p, kernel, True)
    assert got["out"].shape == (81, 4, head_dim) and got["dk"].shape == p.k.shape
    assert_outputs_accurate(got, p, True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_multiple_of_8_full_and_sequence_alone(kernel):
    """d24, non-causal: accurate, and a sequence alone gives the bytes it gets in a pack."""
    target = make_pack([17], [23], 2, 1, 24, seed=40)
    other = make_pack([9], [5], 2, 1, 24, seed=41)
    assert_accurate(pack_of([other, target]), kernel, False)
    alone = run_kernel(target, kernel, False)
    res = run_kernel(pack_of([other, target]), kernel, False)
    assert_bitwise_equal(alone, rows_of(res, 9, 26, 5, 28))


@pytest.mark.parametrize("head_dim", [40, 8])
def test_odd_multiple_of_8_strides_must_be_multiples_of_8(head_dim):
    """The kernels read the token / head strides of an odd multiple of 8 as multiples of 8
    (``addressing.row_strides``): other strides are a ValueError before any launch, for q, k
    and v; a head dim that is a multiple of 16 takes any strides."""
    p = make_pack([3], [3], 2, 1, head_dim, seed=42)
    q, k, v = p.q, p.k, p.v
    odd_q = torch.zeros(3, 2, head_dim + 4, dtype=q.dtype, device=q.device)[..., :head_dim]
    odd_kv = torch.zeros(3, 1, head_dim + 4, dtype=q.dtype, device=q.device)[..., :head_dim]
    match = "odd multiple of 8 needs token / head strides that are multiples of 8"
    for args in ((odd_q, k, v), (q, odd_kv, v), (q, k, odd_kv)):
        with pytest.raises(ValueError, match=match):
            portattn.varlen_attention(*args, p.cu_q, p.cu_k)
    wide = torch.randn(3, 2, 52, dtype=q.dtype, device=q.device)[..., :48]
    kv48 = torch.randn(3, 1, 48, dtype=q.dtype, device=q.device)
    out = portattn.varlen_attention(wide, kv48, kv48, p.cu_q, p.cu_k)
    assert out.shape == (3, 2, 48) and not torch.isnan(out).any()


def test_flash_compat_takes_multiples_of_8():
    """``flash_attn_varlen_func`` (d40) and ``flash_attn_func`` (d8) run these head dims (they
    refused them before: "head dim must be one of (32, 48, ...)"), with portattn's bits."""
    from portattn.flash_compat import flash_attn_func, flash_attn_varlen_func

    p = make_pack([5, 11], [7, 11], 4, 2, 40, seed=43)
    got = flash_attn_varlen_func(p.q, p.k, p.v, p.cu_q, p.cu_k, 11, 11, causal=True)
    want = portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, causal=True)
    assert torch.equal(got, want)
    gen = torch.Generator().manual_seed(44)
    q, k, v = (
        torch.randn(2, 6, 2, 8, generator=gen).to(torch.float16).to(p.q.device) for _ in range(3)
    )
    got = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(got, portattn.attention(q, k, v, causal=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("head_dim, causal", [(48, True), (80, True), (80, False), (112, True)])
def test_borrowed_head_dim_accuracy(head_dim, causal, kernel, dtype):
    """out, lse, dq, dk, dv by the usual rule; odd lengths, an empty sequence, Sq > Sk, GQA,
    strided views (the padded head-dim columns are masked, never read or written)."""
    p = make_pack(
        [1, 17, 0, 40], [5, 17, 3, 63], 4, 2, head_dim, dtype, seed=31, noncontiguous=True
    )
    assert_accurate(p, kernel, causal)


@pytest.mark.parametrize("kernel", KERNELS)
def test_borrowed_head_dim_pack_positions(kernel):
    """d80: a sequence alone gives the bytes it gets anywhere in a pack."""
    target = make_pack([33], [40], 4, 2, 80, seed=32)
    others = [make_pack([n], [n], 4, 2, 80, seed=33 + i) for i, n in enumerate([7, 20])]
    alone = run_kernel(target, kernel, True)
    for j in range(len(others) + 1):
        seqs = others[:j] + [target] + others[j:]
        res = run_kernel(pack_of(seqs), kernel, True)
        q0 = sum(s.q.shape[0] for s in seqs[:j])
        assert_bitwise_equal(alone, rows_of(res, q0, q0 + 33, q0, q0 + 40))


@pytest.mark.parametrize("head_dim", [4, 12, 36, 100, 196, 264])
def test_other_head_dims_raise(head_dim):
    p = make_pack([3], [3], 2, 1, 32, seed=34)
    q = torch.zeros(3, 2, head_dim, dtype=p.q.dtype, device=p.q.device)
    k = torch.zeros(3, 1, head_dim, dtype=p.q.dtype, device=p.q.device)
    with pytest.raises(
        ValueError, match=r"head dim must be one of the multiples of 8 from 8 to 256"
    ):
        portattn.varlen_attention(q, k, k, p.cu_q, p.cu_k)
