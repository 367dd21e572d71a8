"""The table's warp-specialised fields: ``fwd_ws``, ``bwd_ws`` and ``dq_ws`` run the forward,
dK/dV and dQ as the Gluon kernels (Hopper) with the same arithmetic as the Triton kernels at the
same tiles, so the same bits (GPU, bitwise against the Triton kernel); on the CPU (no Gluon
interpreter) an entry that sets them runs the Triton kernels, and each kernel's ``supports``
rule agrees with the entries that select it. The other work-splitting fields:
``tests/test_table_variants.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import (
    HAS_GPU,
    assert_accurate,
    assert_bitwise_equal,
    gpu_family,
    make_pack,
    problem_of,
    run_kernel,
)

from portattn import configs
from portattn.kernels import backward_plan, forward, ws_kernels
from portattn.kernels.backward_ws import dkdv_ws_supports
from portattn.kernels.buffers import rows_aligned
from portattn.kernels.dq_ws import dq_ws_supports
from portattn.kernels.forward_ws import ws_supports

# ``fwd_ws``: the forward as the warp-specialised Gluon kernel (Hopper), with the same tiles.


def _ws_tiles(cfg: configs.KernelConfig, head_dim: int) -> configs.Tiles:
    """The entry's forward tiles, or with 128 rows and 8 warps where they have another shape
    (the warp-specialised kernel's 128 rows are two groups of 64; rows are independent, so
    BLOCK_M never changes a row's bits)."""
    if ws_supports(cfg.fwd, head_dim):
        return cfg.fwd
    return dataclasses.replace(cfg.fwd, block_m=128, num_warps=8)


# The warp-specialised kernels' GPU packs: odd lengths, an empty query sequence and an empty key
# sequence (the last), more queries than keys and the reverse, sequences of many tiles.
WS_LENS_Q = [300, 1, 0, 513, 1000, 17, 63, 113, 40]
WS_LENS_K = [280, 700, 5, 513, 1000, 17, 63, 2000, 0]


# Per field: the launchers' choice of its warp-specialised kernel (problem, rows aligned).
_WS_SELECTED = {
    "fwd_ws": forward.use_warp_specialized,
    "bwd_ws": backward_plan.use_warp_specialized_dkdv,
    "dq_ws": backward_plan.use_warp_specialized_dq,
}


def _ws_gpu_matrix(test):
    """The warp-specialised kernels' GPU tests: each case in both dtypes, causal and not."""
    test = pytest.mark.parametrize("causal", [True, False])(test)
    test = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])(
        test
    )
    return pytest.mark.gpu(test)


def _assert_ws_same_bits_as_triton(p, kernel, causal, override_entry, field, fields):
    """The sm90 entry of ``kernel`` at p's head dim and dtype, with ``fields`` and ``field``
    off, then on: on, the launcher picks the warp-specialised kernel, the accuracy rule holds
    and the bits are those of the Triton kernel."""
    head_dim, dtype = p.q.shape[-1], p.q.dtype
    override_entry(kernel, head_dim, dtype, **{field: False}, **fields)
    triton_bits = run_kernel(p, kernel, causal=causal)
    override_entry(kernel, head_dim, dtype, **{field: True}, **fields)
    cfg = configs.get_config("sm90", kernel, head_dim, dtype)
    read = (p.q, p.k, p.v) if field == "fwd_ws" else (p.q, p.k, p.v, p.do)  # the backward: dO
    assert _WS_SELECTED[field](problem_of(p, kernel, cfg), rows_aligned(*read))
    assert_accurate(p, kernel, causal=causal)
    assert_bitwise_equal(run_kernel(p, kernel, causal=causal), triton_bits)


@_ws_gpu_matrix
@pytest.mark.parametrize(
    "kernel, head_dim",
    [("varlen", 128), ("fixed_order", 128), ("varlen", 64), ("fixed_order", 64)],
)
def test_fwd_ws_same_bits_as_triton_gpu(kernel, head_dim, causal, dtype, override_entry):
    """The warp-specialised forward (producer warp, two consumer groups, K/V ring) and the
    Triton forward give the same out and lse bits (and so the same gradients) for the same
    tiles: odd lengths, an empty sequence, more queries than keys and the reverse, GQA 8/2,
    sequences of many key tiles (the ring wraps), split-P for fixed_order."""
    if gpu_family() != "sm90":
        pytest.skip("the warp-specialised forward is a Hopper kernel")
    p = make_pack(WS_LENS_Q[:8], WS_LENS_K[:8], 8, 2, head_dim, dtype, seed=99)
    tiles = _ws_tiles(configs.get_config("sm90", kernel, head_dim, dtype), head_dim)
    fields = dict(fwd=tiles, tma=configs.TMA_KERNELS)
    _assert_ws_same_bits_as_triton(p, kernel, causal, override_entry, "fwd_ws", fields)


@_ws_gpu_matrix
@pytest.mark.parametrize("tiles", [(192, 64, 12, 3), (192, 128, 12, 2)])
def test_fwd_ws_three_groups_same_bits_as_triton_gpu(tiles, causal, dtype, override_entry):
    """The d64 forward in three consumer groups of 64 rows (192-row tiles, FlashAttention-3/4's
    d64 shape) gives the bits of the Triton forward at one group's tiles
    (``KernelConfig.triton_fwd_tiles``: 64 rows, 4 warps, the same key tiles)."""
    if gpu_family() != "sm90":
        pytest.skip("the warp-specialised forward is a Hopper kernel")
    p = make_pack(WS_LENS_Q[:8], WS_LENS_K[:8], 8, 2, 64, dtype, seed=98)
    fields = dict(fwd=configs.Tiles(*tiles), tma=configs.TMA_KERNELS)
    _assert_ws_same_bits_as_triton(p, "varlen", causal, override_entry, "fwd_ws", fields)


def test_three_group_tiles_cpu():
    """192-row forward tiles are the Gluon forward's three groups, at d64 only; the Triton
    forward (its fallback, the repair pass) and the decode run one group's 64 rows in 4 warps
    at the same key tiles, and every stage compiles for sm90 without spills."""
    from ci.golden_dev.keys import in_compiler_process
    from ci.tune_sm90 import variant_problems

    tiles = configs.Tiles(192, 64, 12, 3)
    assert ws_supports(tiles, 64) and not ws_supports(tiles, 128)
    assert not ws_supports(configs.Tiles(192, 64, 8, 3), 64)
    base = configs.get_config("sm90", "varlen", 64, torch.bfloat16)
    cfg = dataclasses.replace(base, fwd=tiles, fwd_ws=True)
    assert cfg.triton_fwd_tiles() == configs.Tiles(64, 64, 4, 3)
    assert cfg.decode_tiles() == configs.Tiles(64, 64, 4, 3)
    assert base.triton_fwd_tiles() == base.fwd
    # (192, 128) tiles compile without spills under Triton 3.6, not 3.9 (632 B): not checked
    overrides = {"fwd": [192, 64, 12, 3], "fwd_ws": True}
    assert in_compiler_process(variant_problems, "varlen", 64, overrides) == []


@pytest.mark.parametrize("tiles", [(128, 64, 8, 2), (192, 64, 12, 2)])
def test_fwd_ws_falls_back_under_interpreter_cpu(override_entry, tiles):
    """Gluon has no CPU interpreter: an entry with ``fwd_ws`` (and tiles the kernel supports)
    runs the Triton forward there, with the bits of the entry without it."""
    if HAS_GPU:
        pytest.skip("interpreter run; the GPU runs the test above")
    p = make_pack([0, 17, 63, 130], [9, 40, 50, 130], 4, 2, 64, torch.float16, seed=93)
    tiles = configs.Tiles(*tiles)
    assert ws_supports(tiles, 64)
    override_entry("varlen", 64, torch.float16, fwd=tiles, tma=configs.TMA_KERNELS)
    plain = run_kernel(p, "varlen", causal=True)
    override_entry("varlen", 64, torch.float16, fwd=tiles, tma=configs.TMA_KERNELS, fwd_ws=True)
    assert_bitwise_equal(run_kernel(p, "varlen", causal=True), plain)


# ``bwd_ws``: dK/dV as the warp-specialised Gluon kernel (Hopper), with the same tiles.


@_ws_gpu_matrix
@pytest.mark.parametrize(
    "kernel, head_dim, tiles",
    [
        ("varlen", 128, (64, 128, 8, 2)),
        ("varlen", 64, (64, 128, 8, 3)),
        ("fixed_order", 128, (32, 128, 8, 2)),  # split-P
        ("fixed_order", 64, (64, 128, 8, 2)),  # split-P at fixed_order d64's own table tiles
    ],
)
def test_bwd_ws_same_bits_as_triton_gpu(kernel, head_dim, tiles, causal, dtype, override_entry):
    """The warp-specialised dK/dV kernel (producer warp, two consumer groups of 64 keys, a ring
    of Q/dO tiles) and the Triton dK/dV kernel at the same tiles give the same dk and dv bits:
    odd lengths, an empty query sequence and an empty key sequence, more queries than keys and
    the reverse, GQA 8/2 (the ring runs over the group's heads), causal tiles that a group
    skips or masks, split-P for fixed_order."""
    if gpu_family() != "sm90":
        pytest.skip("the warp-specialised dK/dV kernel is a Hopper kernel")
    p = make_pack(WS_LENS_Q, WS_LENS_K, 8, 2, head_dim, dtype, seed=97)
    fields = dict(
        bwd_dkdv=configs.Tiles(*tiles), dkdv_passes=1, bwd_dv=None, tma=configs.TMA_KERNELS
    )
    _assert_ws_same_bits_as_triton(p, kernel, causal, override_entry, "bwd_ws", fields)


# ``dq_ws``: dQ as the warp-specialised Gluon kernel (Hopper), with the same tiles.


@_ws_gpu_matrix
@pytest.mark.parametrize(
    "kernel, head_dim", [("varlen", 128), ("varlen", 64), ("fixed_order", 128)]
)
def test_dq_ws_same_bits_as_triton_gpu(kernel, head_dim, causal, dtype, override_entry):
    """The warp-specialised dQ kernel (producer warp, two consumer groups of 64 query rows, a
    K/V ring) and the Triton dQ kernel at the same tiles give the same dq bits: odd lengths,
    empty query and key sequences, more queries than keys and the reverse, GQA 8/2, sequences of
    many key tiles (the ring wraps), split-P for fixed_order."""
    if gpu_family() != "sm90":
        pytest.skip("the warp-specialised dQ kernel is a Hopper kernel")
    p = make_pack(WS_LENS_Q, WS_LENS_K, 8, 2, head_dim, dtype, seed=89)
    fields = dict(bwd_dq=configs.Tiles(128, 64, 8, 3), tma=configs.TMA_KERNELS)
    _assert_ws_same_bits_as_triton(p, kernel, causal, override_entry, "dq_ws", fields)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["varlen", "fixed_order"])
@pytest.mark.parametrize("causal", [False, True])
def test_ws_kernels_read_no_row_of_the_next_sequence_gpu(kernel, causal):
    """The Gluon kernels' copies stop at each sequence's end (per-sequence descriptors, or the
    launch's ragged ones: perf-notes row 103): a sequence of partial tiles keeps the bits it
    has alone, out, lse and gradients, when the next sequence's q, k, v and dO hold NaN and
    inf."""
    if gpu_family() != "sm90":
        pytest.skip("the warp-specialised kernels are Hopper kernels")
    p = make_pack([100, 200], [130, 300], 8, 2, 128, torch.bfloat16, seed=97)
    alone = dataclasses.replace(
        p,
        q=p.q[:100].clone(),
        k=p.k[:130].clone(),
        v=p.v[:130].clone(),
        do=p.do[:100].clone(),
        dlse=p.dlse[:100].clone(),
        cu_q=p.cu_q[:2].clone(),
        cu_k=p.cu_k[:2].clone(),
    )
    p.q[100:], p.do[100:] = math.nan, -math.inf  # the next sequence's rows
    p.k[130:], p.v[130:] = math.inf, math.nan
    cfg = configs.get_config("sm90", kernel, 128, torch.bfloat16)
    assert cfg.fwd_ws or cfg.dq_ws  # the entry runs Gluon kernels
    packed, single = run_kernel(p, kernel, causal=causal), run_kernel(alone, kernel, causal=causal)
    for name, rows in (("out", 100), ("lse", 100), ("dq", 100), ("dk", 130), ("dv", 130)):
        assert torch.equal(packed[name][:rows], single[name]), name


@pytest.mark.parametrize("field", ["bwd_ws", "dq_ws"])
def test_bwd_ws_falls_back_under_interpreter_cpu(field, override_entry):
    """Gluon has no CPU interpreter: an entry with ``bwd_ws`` or ``dq_ws`` runs the Triton
    kernel there, with the bits of the entry without it."""
    if HAS_GPU:
        pytest.skip("interpreter run; the GPU runs the tests above")
    p = make_pack([0, 17, 63, 130], [9, 40, 50, 130], 4, 2, 64, torch.float16, seed=91)
    fields = dict(
        bwd_dkdv=configs.Tiles(32, 128, 8, 2),
        bwd_dq=configs.Tiles(128, 64, 8, 2),
        tma=configs.TMA_KERNELS,
    )
    assert dkdv_ws_supports(fields["bwd_dkdv"], 64) and dq_ws_supports(fields["bwd_dq"], 64)
    override_entry("varlen", 64, torch.float16, **fields)
    plain = run_kernel(p, "varlen", causal=True)
    override_entry("varlen", 64, torch.float16, **fields, **{field: True})
    assert_bitwise_equal(run_kernel(p, "varlen", causal=True), plain)


# Per field: the Gluon kernel, its ``supports``, the stage whose tiles it takes (by the same
# name in ``tma``: the entry must read them through descriptors) and the field that must be 1
# there (one pass; None: that stage has none); tiles the kernel is written for (at d128); and
# tiles it must refuse, with their head dim (one ring slot would hang; other shapes, head dims).
_WS_FIELDS = {
    "fwd_ws": (
        (forward.attn_fwd_ws_kernel, ws_supports, "fwd", "fwd_chunks"),
        (128, 128, 8, 2),
        [((128, 128, 8, 1), 128), ((64, 64, 4, 3), 128), ((128, 128, 8, 3), 96)],
    ),
    "bwd_ws": (
        (ws_kernels.attn_bwd_dkdv_ws_kernel, dkdv_ws_supports, "bwd_dkdv", "dkdv_passes"),
        (64, 128, 8, 2),
        [((64, 128, 8, 1), 128), ((32, 64, 4, 3), 128), ((64, 128, 8, 2), 96)],
    ),
    "dq_ws": (
        (ws_kernels.attn_bwd_dq_ws_kernel, dq_ws_supports, "bwd_dq", None),
        (128, 64, 8, 3),
        [((128, 64, 8, 1), 128), ((128, 32, 8, 3), 128), ((128, 64, 8, 3), 96)],
    ),
}


@pytest.mark.parametrize("field", sorted(_WS_FIELDS))
def test_ws_entries_are_supported(field):
    """Every entry that selects a warp-specialised kernel is a Hopper entry that reads that
    kernel's tiles through descriptors (in one program per tile, one pass), with tiles the
    kernel is written for: else the launcher would quietly run the Triton kernel. Checked in
    the table of every supported Triton version (a later one may select fewer of them)."""
    (ws_kernel, supports, stage, one_pass), accepted, refused = _WS_FIELDS[field]
    assert ws_kernel is not None  # Triton >= 3.6 (CI pins 3.6): Gluon is there
    for version in configs.table_versions():
        selected = 0
        for (family, kernel, head_dim, _), cfg in configs.table_for(version).items():
            if getattr(cfg, field):
                selected += 1
                where = (version, family, kernel, head_dim)
                assert family == "sm90" and stage in cfg.tma, where
                assert one_pass is None or getattr(cfg, one_pass) == 1, where
                assert supports(getattr(cfg, stage), head_dim), where
        assert selected or version > configs.SUPPORTED_TRITON[0], field  # the base table has it
    assert supports(configs.Tiles(*accepted), 128)
    for tiles, head_dim in refused:
        assert not supports(configs.Tiles(*tiles), head_dim), (tiles, head_dim)
