"""The table's work-splitting fields: ``dkdv_passes`` (dK and dV, and halves of the head dim, in
separate programs) and ``fwd_chunks`` (the forward's output columns in two programs); and
``tma``, which changes how tiles are read, never what is computed; and ``fwd_ws``, ``bwd_ws``
and ``dq_ws``, which run the forward, dK/dV and dQ as other kernels with the same arithmetic.

On the CPU the interpreter's table entry is replaced by one with the field set, the results
must meet the accuracy rule and equal the unsplit entry's bitwise (the interpreter computes
each element as the same ordered sum either way). On the GPU each split entry of the family's
table meets the accuracy rule (``tests/test_gpu.py`` runs every head dim); here the sm90 split
entries are also run with every pass count at d=128, for accuracy only: across pass counts the
matrix instructions have different shapes, so bitwise equality is not claimed there.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import HAS_GPU, KERNELS, assert_accurate, assert_bitwise_equal, make_pack, run_kernel

from portattn import configs
from portattn.kernels import backward_plan, forward, ws_kernels
from portattn.kernels.backward_ws import dkdv_ws_supports
from portattn.kernels.buffers import dense_specialized, descriptor_scratch, rows_aligned
from portattn.kernels.dq_ws import dq_ws_supports
from portattn.kernels.forward_ws import ws_supports
from portattn.kernels.plan import plan_problem
from portattn.options import AttentionOptions

# A split stage runs the Triton kernel (the Gluon ones have one program per tile, one pass).
SPLITS = [
    dict(dkdv_passes=2, bwd_ws=False),
    dict(dkdv_passes=4, bwd_ws=False),
    dict(fwd_chunks=2, fwd_ws=False),
]


@pytest.fixture
def override_entry(monkeypatch):
    """Replace one table entry for the test's duration: (kernel, head_dim, dtype, **fields)."""
    table = configs.config_table()

    def apply(kernel: str, head_dim: int, dtype: torch.dtype, **fields):
        family = configs.INTERPRETER if not HAS_GPU else _gpu_family()
        key = (family, kernel, head_dim, dtype)
        monkeypatch.setitem(table, key, dataclasses.replace(table[key], **fields))

    return apply


def _problem(p, kernel: str, cfg):
    """The launchers' problem record of pack ``p`` with the table entry ``cfg``."""
    options = AttentionOptions(causal=True, softmax_scale=1.0, kernel=kernel)
    return plan_problem(p.q, p.k, p.cu_q, p.q.shape[0], p.k.shape[0], options, cfg)


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
    if _gpu_family() != "sm90":
        pytest.skip("tensor descriptors are switched on by sm90 entries only")
    p = make_pack(
        [300, 1, 0, 513, 1000], [280, 700, 5, 513, 1000], 8, 2, 128, torch.bfloat16, seed=95
    )
    override_entry(kernel, 128, torch.bfloat16, tma=())
    pointers = run_kernel(p, kernel, causal=causal)
    override_entry(kernel, 128, torch.bfloat16, tma=configs.TMA_KERNELS)
    assert_accurate(p, kernel, causal=causal)
    assert_bitwise_equal(run_kernel(p, kernel, causal=causal), pointers)


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
    assert _WS_SELECTED[field](_problem(p, kernel, cfg), rows_aligned(*read))
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
    if _gpu_family() != "sm90":
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
    if _gpu_family() != "sm90":
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
    if _gpu_family() != "sm90":
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
    if _gpu_family() != "sm90":
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
    if _gpu_family() != "sm90":
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
    if not HAS_GPU or _gpu_family() == "sm90":  # descriptors exist on Hopper only
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
