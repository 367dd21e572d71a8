"""The table's work-splitting fields: ``dkdv_passes`` (dK and dV, and halves of the head dim, in
separate programs) and ``fwd_chunks`` (the forward's output columns in two programs).

On the CPU the interpreter's table entry is replaced by one with the field set, the results
must meet the accuracy rule and equal the unsplit entry's bitwise (the interpreter computes
each element as the same ordered sum either way). On the GPU each split entry of the family's
table meets the accuracy rule (``tests/test_gpu.py`` runs every head dim); here the sm90 split
entries are also run with every pass count at d=128, for accuracy only: across pass counts the
matrix instructions have different shapes, so bitwise equality is not claimed there.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import HAS_GPU, KERNELS, assert_accurate, assert_bitwise_equal, make_pack, run_kernel

from portattn import configs

SPLITS = [dict(dkdv_passes=2), dict(dkdv_passes=4), dict(fwd_chunks=2)]


@pytest.fixture
def override_entry(monkeypatch):
    """Replace one table entry for the test's duration: (kernel, head_dim, dtype, **fields)."""
    table = configs.config_table()

    def apply(kernel: str, head_dim: int, dtype: torch.dtype, **fields):
        family = configs.INTERPRETER if not HAS_GPU else _gpu_family()
        key = (family, kernel, head_dim, dtype)
        monkeypatch.setitem(table, key, dataclasses.replace(table[key], **fields))

    return apply


def _gpu_family() -> str:
    from portattn.families import config_family

    return config_family(torch.device("cuda"))


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("head_dim", [64, 96])
@pytest.mark.parametrize("kernel", KERNELS)
def test_split_same_bits_as_unsplit_cpu(kernel, head_dim, split, override_entry):
    if HAS_GPU:
        pytest.skip("interpreter claim (bitwise across splits); the GPU runs the test below")
    p = make_pack([0, 17, 63, 40], [9, 40, 50, 40], 4, 2, head_dim, torch.float16, seed=90)
    unsplit = run_kernel(p, kernel, causal=True)
    override_entry(kernel, head_dim, torch.float16, **split)
    assert_accurate(p, kernel, causal=True)
    assert_bitwise_equal(run_kernel(p, kernel, causal=True), unsplit)


@pytest.mark.gpu
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("kernel", KERNELS)
def test_split_accurate_gpu(kernel, split, override_entry):
    p = make_pack([300, 1, 0, 513], [280, 700, 5, 513], 8, 2, 128, torch.bfloat16, seed=91)
    override_entry(kernel, 128, torch.bfloat16, **split)
    assert_accurate(p, kernel, causal=True)
    assert_accurate(p, kernel, causal=False)


# The dV launch's own tiles (``bwd_dv``): wider query tiles than the dK launch.
DV_TILES = {False: configs.Tiles(32, 32, 4, 1), True: configs.Tiles(128, 128, 8, 1)}


@pytest.mark.parametrize("kernel", KERNELS)
def test_dv_tiles_accurate_cpu(kernel, override_entry):
    """On the interpreter a 32-row dot is one float32 sum, not two chained 16-row sums, so only
    the accuracy rule is claimed here."""
    if HAS_GPU:
        pytest.skip("interpreter variant; the GPU runs the bitwise test below")
    p = make_pack([0, 17, 63, 40], [9, 40, 50, 40], 4, 2, 64, torch.float16, seed=92)
    override_entry(kernel, 64, torch.float16, dkdv_passes=2, bwd_dv=DV_TILES[False])
    assert_accurate(p, kernel, causal=True)
    assert_accurate(p, kernel, causal=False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_dv_tiles_same_bits_gpu(causal, override_entry):
    """The matrix unit chains the 16-deep steps of a 128-row query tile into the accumulator in
    the same order as two 64-row tiles, so the dV launch's own tiles keep every bit of dK, dV
    (and of dQ, which they do not touch)."""
    p = make_pack(
        [300, 1, 0, 513, 1000], [280, 700, 5, 513, 1000], 8, 2, 128, torch.bfloat16, seed=93
    )
    override_entry("varlen", 128, torch.bfloat16, dkdv_passes=2, bwd_dv=None)
    plain = run_kernel(p, "varlen", causal=causal)
    override_entry("varlen", 128, torch.bfloat16, dkdv_passes=2, bwd_dv=DV_TILES[True])
    assert_accurate(p, "varlen", causal=causal)
    assert_bitwise_equal(run_kernel(p, "varlen", causal=causal), plain)
