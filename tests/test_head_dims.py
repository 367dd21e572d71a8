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
    """A borrowed head dim's own tiles (``configs._BORROWED_TILES``) replace only the kernels
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
