"""The table's work-splitting fields: ``dkdv_passes`` (dK and dV, and halves of the head dim, in
separate programs) and ``fwd_chunks`` (the forward's output columns in two programs); and
``tma``, which changes how tiles are read, never what is computed; and ``fwd_ws``, ``bwd_ws``
and ``dq_ws``, which run the forward, dK/dV and dQ as other kernels with the same arithmetic
(their tests: ``tests/test_ws_variants.py``).

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
from helpers import (
    HAS_GPU,
    KERNELS,
    assert_accurate,
    assert_bitwise_equal,
    gpu_family,
    make_pack,
    run_kernel,
)

from portattn import configs
from portattn.kernels.buffers import dense_specialized, descriptor_scratch, rows_aligned

# A split stage runs the Triton kernel (the Gluon ones have one program per tile, one pass).
SPLITS = [
    dict(dkdv_passes=2, bwd_ws=False),
    dict(dkdv_passes=4, bwd_ws=False),
    dict(fwd_chunks=2, fwd_ws=False),
]


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
    split = dict(dkdv_passes=2, bwd_ws=False)
    override_entry("varlen", 128, torch.bfloat16, bwd_dv=None, **split)
    plain = run_kernel(p, "varlen", causal=causal)
    override_entry("varlen", 128, torch.bfloat16, bwd_dv=DV_TILES[True], **split)
    assert_accurate(p, "varlen", causal=causal)
    assert_bitwise_equal(run_kernel(p, "varlen", causal=causal), plain)


# ``tma``: tiles read through per-sequence tensor descriptors instead of masked pointer loads.
TMA_SPLITS = [{}, dict(dkdv_passes=4, bwd_ws=False), dict(fwd_chunks=2, fwd_ws=False)]


@pytest.mark.parametrize(
    "split", TMA_SPLITS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain"
)
@pytest.mark.parametrize("kernel", KERNELS)
def test_tma_same_bits_as_pointers_cpu(kernel, split, override_entry):
    """Descriptors read 0 past the sequence end and the head dim (96 of 128 columns here) where
    the pointer path masks; lse2/delta of rows past the end read 0 instead of +inf, and those
    rows' Q and dO are 0, so what they add is exactly 0."""
    if HAS_GPU:
        pytest.skip("interpreter run; the GPU runs the test below")
    p = make_pack([0, 17, 63, 40, 5], [9, 40, 50, 40, 1], 4, 2, 96, torch.float16, seed=94)
    override_entry(kernel, 96, torch.float16, tma=(), **split)
    pointers = run_kernel(p, kernel, causal=True)
    override_entry(kernel, 96, torch.float16, tma=configs.TMA_KERNELS, **split)
    assert_bitwise_equal(run_kernel(p, kernel, causal=True), pointers)


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` whose data starts 2 bytes past a 16-byte boundary (no descriptor)."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    out = flat[1:].view(x.shape)
    out.copy_(x)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_tma_same_bits_as_pointers_gpu(kernel, causal, override_entry):
    """The family's d128 entry with every kernel reading through descriptors, and with none:
    the same bits."""
    if gpu_family() != "sm90":
        pytest.skip("tensor descriptors are switched on by sm90 entries only")
    p = make_pack(
        [300, 1, 0, 513, 1000], [280, 700, 5, 513, 1000], 8, 2, 128, torch.bfloat16, seed=95
    )
    override_entry(kernel, 128, torch.bfloat16, tma=())
    pointers = run_kernel(p, kernel, causal=causal)
    override_entry(kernel, 128, torch.bfloat16, tma=configs.TMA_KERNELS)
    assert_accurate(p, kernel, causal=causal)
    assert_bitwise_equal(run_kernel(p, kernel, causal=causal), pointers)


def _strided(x: torch.Tensor) -> torch.Tensor:
    """A view of the values of ``x`` with head and token strides not divisible by 16."""
    wide = torch.empty(*x.shape[:-1], x.shape[-1] + 8, dtype=x.dtype, device=x.device)
    out = wide[..., : x.shape[-1]]
    out.copy_(x)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["misaligned", "strided"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_input_layout_same_bits_gpu(kernel, causal, layout):
    """Inputs whose rows are not 16-byte aligned (no tensor descriptor; other vector widths),
    or whose strides are not divisible by 16 (another Triton specialization), give the bits of
    dense inputs. Before the backward copied such a dO densely, fixed_order's delta was summed
    in another order for a misaligned dO."""
    p = make_pack([300, 0, 513, 77], [280, 5, 513, 77], 8, 2, 128, torch.bfloat16, seed=96)
    dense = run_kernel(p, kernel, causal=causal)
    move = _misaligned if layout == "misaligned" else _strided
    moved = dataclasses.replace(p, q=move(p.q), k=move(p.k), v=move(p.v), do=move(p.do))
    assert moved.do.data_ptr() % 16 != 0 or moved.do.stride(1) % 16 != 0
    assert_bitwise_equal(run_kernel(moved, kernel, causal=causal), dense)


@pytest.mark.parametrize("kernel", KERNELS)
def test_broadcast_output_gradient_same_bits(kernel, override_entry):
    """An output gradient that broadcasts over tokens and heads (``(out * w).sum()`` gives
    ``w.expand(T, H, D)``, strides (0, 0, 1)) gives the bits of its dense copy; with every
    kernel's descriptors switched on, such a tensor takes the pointer path (``rows_aligned``)."""
    head_dim = 64 if not HAS_GPU else 128
    dtype = torch.float16 if not HAS_GPU else torch.bfloat16
    p = make_pack([0, 17, 63, 40], [9, 40, 50, 40], 4, 2, head_dim, dtype, seed=97)
    if not HAS_GPU or gpu_family() == "sm90":  # descriptors exist on Hopper only
        override_entry(kernel, head_dim, dtype, tma=configs.TMA_KERNELS)
    row = torch.randn(head_dim, generator=torch.Generator().manual_seed(98)).to(dtype)
    broadcast = row.to(p.do.device).expand(p.do.shape)
    assert broadcast.stride()[:2] == (0, 0)
    dense = run_kernel(dataclasses.replace(p, do=broadcast.contiguous()), kernel, causal=True)
    got = run_kernel(dataclasses.replace(p, do=broadcast), kernel, causal=True)
    assert_bitwise_equal(got, dense)


def test_dense_specialized():
    x = torch.randn(10, 4, 64, dtype=torch.float16)
    assert dense_specialized(x) is x and dense_specialized(x[:, 1:3]) is not None
    assert dense_specialized(x[:, 1:3]).data_ptr() == x[:, 1:3].data_ptr()
    for odd in (_misaligned(x), _strided(x)):
        copy = dense_specialized(odd)
        assert copy.is_contiguous() and copy.data_ptr() % 16 == 0 and torch.equal(copy, odd)


def test_tma_only_in_hopper_entries():
    """Tensor descriptors and the warp-specialised Gluon kernels (``wgmma``) are Hopper
    features here: only sm90 entries switch them on (not sm100's, whose rows start from
    sm90's), descriptors only for kernels that have a descriptor path (in the table of every
    supported Triton version)."""
    for version in configs.table_versions():
        for (family, *_), cfg in configs.table_for(version).items():
            assert set(cfg.tma) <= set(configs.TMA_KERNELS)
            if family != "sm90":
                assert cfg.tma == (), (version, family)
                assert not (cfg.fwd_ws or cfg.bwd_ws or cfg.dq_ws), (version, family)


def test_rows_aligned():
    x = torch.randn(10, 4, 64, dtype=torch.float16)
    assert rows_aligned(x, x[:, 1:3], x[2:])
    assert not rows_aligned(_misaligned(x))
    assert not rows_aligned(torch.randn(10, 4, 66, dtype=torch.float16)[:, :, :64])
    assert not rows_aligned(torch.randn(10, 3, 4, dtype=torch.float16))  # 8-byte head stride
    assert not rows_aligned(torch.randn(64, dtype=torch.float16).expand(10, 4, 64))  # stride 0


def test_descriptor_scratch_restores_callers_allocator():
    from triton.runtime import _allocation

    def mine(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8)

    token = _allocation._allocator.set(mine)
    try:
        with descriptor_scratch(torch.device("cpu"), True):
            buf = _allocation._allocator.get()(256, 128, None)
            assert _allocation._allocator.get() is not mine and buf.numel() == 256
        assert _allocation._allocator.get() is mine
        with descriptor_scratch(torch.device("cpu"), False):
            assert _allocation._allocator.get() is mine
    finally:
        _allocation._allocator.reset(token)
