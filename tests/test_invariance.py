"""The invariance contract (design §3 in docs/design.md), bitwise, for both kernels: small
shapes, so the CPU interpreter runs them in CI (float16). The GPU module test_invariance_gpu.py
runs the same checks at realistic sizes in both dtypes."""

from __future__ import annotations

import invariance_checks as checks
import pytest
import torch
from helpers import KERNELS

F16 = torch.float16
D = 64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_run_to_run(kernel, causal):
    # One repeat: the interpreter has no scheduling to vary, so a second repeat proves nothing
    # more here; tests/test_invariance_gpu.py repeats on the GPU, where order could vary.
    checks.check_run_to_run(kernel, causal, [40, 0, 17, 63], [33, 5, 17, 70], (4, 2), D, F16, 1, 20)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_pack_position(kernel, causal):
    others = [(1, 1), (63, 17), (0, 9), (33, 64), (17, 0)]
    checks.check_pack_positions(kernel, causal, (45, 52), others, (4, 2), D, F16, 21)


@pytest.mark.parametrize("kernel", KERNELS)
def test_batch_size(kernel):
    checks.check_batch_size(kernel, True, [1, 33, 0, 16], (2, 1), D, F16, 25)


@pytest.mark.parametrize("kernel", KERNELS)
def test_head_slices(kernel):
    checks.check_head_slices(
        kernel, True, [30, 17], [41, 17], (8, 4), D, F16, 30, [(2, 6), (0, 2), (4, 8)]
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_chunks(kernel):
    chunks = [(0, 32), (32, 70), (5, 38), (17, 18), (69, 70), (1, 64)]
    checks.check_causal_chunks(kernel, 70, 75, (2, 1), D, F16, 40, chunks)


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_steps(kernel):
    checks.check_decode_steps(kernel, 50, 4, (2, 2), D, F16, 41)


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_vs_varlen(kernel):
    checks.check_dense_vs_varlen(kernel, True, 2, 20, 37, (2, 1), D, F16, 42)
