"""Head dims without table rows of their own (``configs.BORROWED_HEAD_DIMS``: 48, 80, 112),
run with the next row up: accuracy against the float64 reference, the invariances, and the
refusal of the others. CPU: float16 under the interpreter; on a GPU bfloat16 too."""

from __future__ import annotations

import pytest
import torch
from helpers import HAS_GPU, KERNELS, assert_accurate, assert_bitwise_equal, make_pack, run_kernel
from invariance_checks import pack_of, rows_of

import portattn
from portattn.configs import BORROWED_HEAD_DIMS, HEAD_DIMS, SUPPORTED_HEAD_DIMS, table_head_dim

DTYPES = (torch.float16, torch.bfloat16) if HAS_GPU else (torch.float16,)


def test_borrowed_rows_are_the_next_table_row_up():
    assert [table_head_dim(d) for d in BORROWED_HEAD_DIMS] == [64, 96, 128]
    assert all(table_head_dim(d) == d for d in HEAD_DIMS)
    assert set(SUPPORTED_HEAD_DIMS) == set(HEAD_DIMS) | set(BORROWED_HEAD_DIMS)


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


@pytest.mark.parametrize("head_dim", [16, 40, 72, 160, 200, 264])
def test_other_head_dims_raise(head_dim):
    p = make_pack([3], [3], 2, 1, 32, seed=34)
    q = torch.zeros(3, 2, head_dim, dtype=p.q.dtype, device=p.q.device)
    k = torch.zeros(3, 1, head_dim, dtype=p.q.dtype, device=p.q.device)
    with pytest.raises(ValueError, match=r"head dim must be one of \(32, 48, 64, 80, 96, 112"):
        portattn.varlen_attention(q, k, k, p.cu_q, p.cu_k)
