"""Under Triton's interpreter the kernels' matrix products must not depend on the BLAS.

The interpreter's ``tl.dot`` is numpy's matmul, and OpenBLAS gives a row different float32 bits
depending on its position and the operand's size (its Haswell kernels on AVX2 machines; a
one-row operand takes another code path on every machine). Every bitwise invariance the CPU
suite checks (pack, chunks, decode, split tables) rests on a row's product being the same
wherever the row sits, so ``primitives.mma`` computes it without BLAS under the interpreter.
These tests fail when ``mma`` hands the interpreter's product to ``tl.dot``.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from portattn.configs import interpreter_active
from portattn.kernels.primitives import mma

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="checks the interpreter's path")


@triton.jit
def _product_kernel(p_a, p_b, p_c, n_rows, K: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr):
    """c[:n_rows] = a[:n_rows] @ b through ``mma``, in one tile of BLOCK_M rows."""
    o_m = tl.arange(0, BLOCK_M)
    o_k = tl.arange(0, K)
    o_n = tl.arange(0, N)
    m_row = o_m < n_rows
    b_a = tl.load(p_a + o_m[:, None] * K + o_k[None, :], mask=m_row[:, None], other=0.0)
    b_b = tl.load(p_b + o_k[:, None] * N + o_n[None, :])  # [K, N]
    b_c = mma(b_a, b_b, tl.zeros([BLOCK_M, N], tl.float32), True)  # [BLOCK_M, N]
    tl.store(p_c + o_m[:, None] * N + o_n[None, :], b_c, mask=m_row[:, None])


def _product(a: torch.Tensor, b: torch.Tensor, block_m: int) -> torch.Tensor:
    c = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.float32)
    _product_kernel[(1,)](a, b, c, a.shape[0], K=a.shape[1], N=b.shape[1], BLOCK_M=block_m)
    return c


# The products of test_causal_chunks (D = 64, interpreter tiles 32 x 16): Q @ K^T is K = 64,
# N = 16; P @ V is K = 16, N = 64. Operands of 70 and 128 rows, as the probe used.
@pytest.mark.parametrize(("k", "n"), [(64, 16), (16, 64), (64, 64)])
@pytest.mark.parametrize(("rows", "block_m"), [(70, 128), (128, 128), (32, 32)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_row_product_independent_of_position_and_size(k, n, rows, block_m, dtype):
    gen = torch.Generator().manual_seed(1000 * k + n)
    a = torch.randn(rows, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    full = _product(a, b, block_m)
    assert not full.isnan().any()
    for row in sorted({r for r in (0, 1, 5, 17, 38, rows // 2, rows - 1) if r < rows}):
        alone = _product(a[row : row + 1].contiguous(), b, 1)
        assert torch.equal(full[row : row + 1], alone), (rows, block_m, row)
        # The same row as the last one of a shorter operand (another size, another position).
        prefix = _product(a[: row + 1].contiguous(), b, block_m)
        assert torch.equal(full[row], prefix[row]), (rows, block_m, row)


def test_product_is_exact_float32_of_the_operands():
    """bfloat16 and float16 products are exact in float32; only the sum over K rounds. So the
    interpreter's product stays within float32 rounding of the float64 product (the
    interpreter's own bfloat16 ``tl.dot`` multiplies raw bits, triton-lang/triton#11584)."""
    gen = torch.Generator().manual_seed(7)
    for dtype in (torch.float16, torch.bfloat16):
        a = torch.randn(32, 64, generator=gen).to(dtype)
        b = torch.randn(64, 16, generator=gen).to(dtype)
        got = _product(a, b, 32).double()
        want = a.double() @ b.double()
        bound = 64 * 2.0**-24 * (a.double().abs() @ b.double().abs())
        assert ((got - want).abs() <= bound).all(), dtype
