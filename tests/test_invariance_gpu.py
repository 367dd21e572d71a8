"""Design §3 (docs/design.md) on real hardware: both kernels, both dtypes, causal and not, GQA
and not, d = 64 and 128, forward and backward, all bitwise. ``PORTATTN_STRESS=1`` runs 1000
repeats instead of 200 in the run-to-run check."""

from __future__ import annotations

import os

import invariance_checks as checks
import pytest
import torch
from helpers import KERNELS

pytestmark = pytest.mark.gpu

REPEATS = 1000 if os.environ.get("PORTATTN_STRESS") == "1" else 200
OTHER_LENS = [(1, 1), (63, 63), (64, 64), (65, 65), (1000, 1000), (0, 0), (0, 17)]
GRID = pytest.mark.parametrize(
    "kernel,dtype,heads,head_dim",
    [
        (k, dt, h, d)
        for k in KERNELS
        for dt in (torch.bfloat16, torch.float16)
        for h in ((8, 8), (8, 2))
        for d in (64, 128)
    ],
)


@pytest.mark.parametrize("causal", [False, True])
@GRID
def test_run_to_run(kernel, dtype, heads, head_dim, causal):
    lens_q = [1000, 1, 0, 63, 257, 129]
    lens_k = [1000, 300, 5, 63, 200, 129]
    checks.check_run_to_run(kernel, causal, lens_q, lens_k, heads, head_dim, dtype, REPEATS, 100)


@pytest.mark.parametrize("causal", [False, True])
@GRID
def test_pack_positions(kernel, dtype, heads, head_dim, causal):
    checks.check_pack_positions(kernel, causal, (300, 300), OTHER_LENS, heads, head_dim, dtype, 110)
    checks.check_pack_positions(kernel, causal, (77, 500), OTHER_LENS, heads, head_dim, dtype, 120)


@pytest.mark.parametrize("causal", [False, True])
@GRID
def test_batch_size(kernel, dtype, heads, head_dim, causal):
    checks.check_batch_size(
        kernel, causal, [129, 1, 1000, 0, 64, 65, 300, 17], heads, head_dim, dtype, 130
    )


@pytest.mark.parametrize("causal", [False, True])
@GRID
def test_head_slices(kernel, dtype, heads, head_dim, causal):
    group = heads[0] // heads[1]
    slices = [(0, group), (group, 3 * group), (heads[0] - group, heads[0])]
    checks.check_head_slices(
        kernel, causal, [500, 1, 129], [400, 77, 129], heads, head_dim, dtype, 140, slices
    )


@GRID
def test_causal_chunks(kernel, dtype, heads, head_dim):
    chunks = [(0, 128), (128, 256), (256, 700), (1, 64), (63, 65), (100, 333), (699, 700)]
    checks.check_causal_chunks(kernel, 700, 700, heads, head_dim, dtype, 150, chunks)
    checks.check_causal_chunks(
        kernel, 300, 1000, heads, head_dim, dtype, 151, [(0, 1), (17, 200), (299, 300)]
    )


@GRID
def test_decode_steps(kernel, dtype, heads, head_dim):
    checks.check_decode_steps(kernel, 777, 16, heads, head_dim, dtype, 160)


@pytest.mark.parametrize("causal", [False, True])
@GRID
def test_dense_vs_varlen(kernel, dtype, heads, head_dim, causal):
    checks.check_dense_vs_varlen(kernel, causal, 4, 333, 333, heads, head_dim, dtype, 170)
