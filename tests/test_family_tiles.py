"""Every family's configuration entries run for correctness on the CPU (issue 28, item 3).

The interpreter normally runs its own small-tile row (``configs.INTERPRETER``). Here its float16
entry is replaced by a real family's entry (sm80, sm90, sm100, sm120, cdna2, cdna3, cdna4: the
rows of the installed Triton), so the planners launch exactly that entry's tiles, dK/dV passes
and dV tiles, forward chunks and descriptor reads (a launch recorder checks it against the
table), and the kernels run under Triton's interpreter through the public API, forward and
backward, against the float64 reference. The table's head dims run, and borrowed ones (the next
row's tiles over a padded, masked head dim: 8, 40, 48, 80, 112 in every family, and each other
one where it has tiles of its own, ``family_head_dims``), for both kernels.

What the interpreter cannot run, it does not see: warps, stages and the AMD knobs change
nothing it computes, and the warp-specialised Gluon kernels (``fwd_ws``, ``bwd_ws``,
``dq_ws``) run as the Triton kernels at the same tiles, as on a GPU where they do not apply.
So entries that differ only there run the same computation, and each such group of entries
(:func:`interpreted`, e.g. cdna3 and cdna4, which share rows) runs once; a field added to
``KernelConfig`` or ``Tiles`` fails :func:`test_interpreted_view_names_every_field` until it is
sorted into what the interpreter sees or not. This checks the tiling logic at each entry's tile
sizes (masks, tile counts, causal and windowless key ranges, splits), not the family's machine
code (the compile check, the GPU suite and the golden files do that).

Sizes cross every tile boundary of an entry with few rows: with ``T`` its largest tile side
(tiles are powers of two), a length of ``T + 1`` ends one row into a tile of every size and
one of ``T - 1`` one row short of one, for queries and for keys, beside a 1-row sequence, an
empty query sequence and queries without keys (more rows cost minutes of CI: the interpreter
runs each program's loop in Python). float16 only: the rows do not depend on the dtype
(checked), and the interpreter's bfloat16 products go through float32 anyway
(``configs.upcast_dot``).

``PORTATTN_FAMILY_TILES=versioned`` runs only the groups that the lowest supported Triton's
table does not have (its ``rows.SINCE_TRITON`` rows): ``nox -s tests_newest`` sets it, after
``nox -s tests`` has run every group under Triton 3.6.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
from helpers import HAS_GPU, KERNELS, assert_accurate, make_pack, run_reference

import portattn
from portattn import backward_replay, configs, forward_replay
from portattn.configs import INTERPRETER, SUPPORTED_HEAD_DIMS, KernelConfig, Tiles
from portattn.families import FAMILIES
from portattn.tools import harness
from portattn.tools.compile_launches import WS_KERNELS, bind_launch, table_mismatches

pytestmark = [
    pytest.mark.skipif(HAS_GPU, reason="interpreter runs; a GPU runs its own family"),
    pytest.mark.triton_version,  # the installed Triton's table (versioned scope under 3.9)
]

DTYPE = torch.float16
HEADS_Q, HEADS_K = 2, 1  # GQA: the dK/dV loop over (head of the group, query tile)
SCOPE = os.environ.get("PORTATTN_FAMILY_TILES", "all")
ALL_FAMILIES_HEAD_DIMS = (*configs.HEAD_DIMS, 8, 40, 48, 80, 112)  # see family_head_dims
# What the interpreter sees of an entry, and what it does not (see the module docstring).
SEEN = {"fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "dkdv_passes", "fwd_chunks", "bwd_dv", "tma"}
SEEN |= {"decode"}  # as the decode kernel's tiles (KernelConfig.decode_tiles)
SEEN |= {"repair_products"}  # one product per masked tile of a repair pass, or two
SEEN |= {"page_block"}  # a paged decode's block-table reads (these tests' calls are unpaged)
SEEN |= {"key_chunk"}  # the key split (design §3.1): which keys each merged loop takes
NOT_SEEN = {"fwd_ws", "bwd_ws", "dq_ws", "decode_ws"}
TILES_SEEN = {"block_m", "block_n"}
TILES_NOT_SEEN = {"num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack"}


def _tiles_seen(tiles: Tiles | None) -> Tiles | None:
    return None if tiles is None else Tiles(tiles.block_m, tiles.block_n, 4, 1)


def interpreted(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` as the interpreter runs it: the fields it does not see at one value."""
    stages = ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "bwd_dv")
    seen = {stage: _tiles_seen(getattr(cfg, stage)) for stage in stages}
    seen["decode"] = _tiles_seen(cfg.decode_tiles())
    return dataclasses.replace(cfg, **seen, **dict.fromkeys(NOT_SEEN, False))


def family_head_dims(family: str, kernel: str, triton=None) -> list[int]:
    """The head dims whose entries run: the table's, the first borrowed ones (48, 80, 112), 8
    (the smallest, a block of 16 on the d32 row) and 40 (an odd multiple of 8) for every
    family, and other borrowed head dims only where their own tiles
    (``configs.rows.BORROWED_TILES``) differ from their row's in what the interpreter sees, the
    first head dim of each such override (elsewhere a head dim runs its row's tiles, which the
    head dims above run through the same masks: 26 more head dims of every family would cost
    the CI minutes)."""
    own: dict[str, int] = {}
    for d in configs.BORROWED_HEAD_DIMS:
        entry = configs.entry_config(family, kernel, d, DTYPE, triton=triton)
        row = configs.table_for(triton or configs.supported_triton_version())[
            (family, kernel, configs.table_head_dim(d), DTYPE)
        ]
        if interpreted(entry) != interpreted(row):
            own.setdefault(repr(interpreted(entry)), d)
    return sorted(set(ALL_FAMILIES_HEAD_DIMS) | set(own.values()))


def family_groups(triton=None) -> dict[tuple[str, int, KernelConfig], list[str]]:
    """(kernel, head dim, interpreted entry) -> the families whose entries run it (both
    dtypes' rows, which must agree), for Triton ``triton`` (default: the installed one)."""
    groups: dict[tuple[str, int, KernelConfig], list[str]] = {}
    for family in FAMILIES:
        for kernel in KERNELS:
            for head_dim in family_head_dims(family, kernel, triton):
                seen = {
                    interpreted(configs.entry_config(family, kernel, head_dim, dt, triton=triton))
                    for dt in configs.DTYPES
                }
                assert len(seen) == 1, (family, kernel, head_dim)  # else: run each dtype's
                groups.setdefault((kernel, head_dim, seen.pop()), []).append(family)
    return groups


def _cases() -> list:
    groups = family_groups()
    if SCOPE == "versioned":
        base = family_groups(configs.SUPPORTED_TRITON[0])
        groups = {key: fams for key, fams in groups.items() if key not in base}
    elif SCOPE != "all":
        raise ValueError(f"PORTATTN_FAMILY_TILES must be 'all' or 'versioned', not {SCOPE!r}")
    return [
        pytest.param(kernel, head_dim, fams, id=f"{kernel}-d{head_dim}-{'+'.join(fams)}")
        for (kernel, head_dim, _), fams in groups.items()
    ]


CASES = _cases()


def test_interpreted_view_names_every_field():
    """Every field of an entry is either seen by the interpreter or not, and one not seen
    really is not: the entries of a group differ only there."""
    assert {f.name for f in dataclasses.fields(KernelConfig)} == SEEN | NOT_SEEN
    assert {f.name for f in dataclasses.fields(Tiles)} == TILES_SEEN | TILES_NOT_SEEN
    sm90 = configs.get_config("sm90", "varlen", 128, DTYPE)
    gluon_off = dataclasses.replace(sm90, fwd_ws=False, bwd_ws=False, dq_ws=False)
    assert sm90.dq_ws and interpreted(sm90) == interpreted(gluon_off)
    warps = dataclasses.replace(sm90.fwd, num_warps=4, num_stages=1)
    assert interpreted(sm90) == interpreted(dataclasses.replace(sm90, fwd=warps))
    for seen in (dict(tma=()), dict(fwd_chunks=2), dict(dkdv_passes=2)):
        assert interpreted(gluon_off) != interpreted(dataclasses.replace(gluon_off, **seen))
    cdna3 = configs.get_config("cdna3", "varlen", 128, DTYPE)
    no_knobs = dataclasses.replace(cdna3.fwd, waves_per_eu=None, matrix_instr_nonkdim=None)
    assert interpreted(cdna3) == interpreted(dataclasses.replace(cdna3, fwd=no_knobs))


def test_every_family_entry_runs():
    """Each (family, kernel, head dim) is in exactly one group (all of them without a scope)."""
    groups = family_groups()
    ran = [(kernel, d, fam) for (kernel, d, _), fams in groups.items() for fam in fams]
    want = {(k, d, f) for f in FAMILIES for k in KERNELS for d in family_head_dims(f, k)}
    assert len(ran) == len(set(ran)) and set(ran) == want
    assert {d for _, d, _ in ran} >= set(configs.HEAD_DIMS) | {8, 40, 48, 80, 112}
    assert {d for _, d, _ in ran} <= set(SUPPORTED_HEAD_DIMS)
    if SCOPE == "all":
        assert len(CASES) == len(groups)


@pytest.fixture
def family_entry(monkeypatch):
    """``force(family, kernel, head_dim)``: the interpreter's float16 entry of that head dim's
    row becomes the family's (for the test's duration); returns the entry. Launches are
    recorded in ``force.launches``."""
    table = configs.config_table()
    launches: list = []
    # The interpreter's product (``primitives.mma`` under INTERPRET) forms the [M, K, N] float32
    # products before summing over K; at the families' tiles (128 x 128 x 128: 2M elements)
    # that exceeds Triton's cap on a block's elements (2^20), which stands for a GPU's limits
    # and no GPU ever builds this tensor (it runs tl.dot). The cap is raised for these tests.
    monkeypatch.setattr(triton._utils, "TRITON_MAX_TENSOR_NUMEL", 1 << 24)

    def recording(run):
        def run_launches(planned, device, *args, **kwargs):
            launches.extend(planned)
            return run(planned, device, *args, **kwargs)

        return run_launches

    # every backward's launches, planned or replayed (ops runs backward_replay)
    monkeypatch.setattr(backward_replay, "run_launches", recording(backward_replay.run_launches))
    # every forward's launches, planned or replayed
    monkeypatch.setattr(forward_replay, "run_launches", recording(forward_replay.run_launches))

    def force(family: str, kernel: str, head_dim: int) -> KernelConfig:
        row = configs.table_head_dim(head_dim)
        cfg = configs.entry_config(family, kernel, head_dim, DTYPE)  # with its own tiles
        monkeypatch.setitem(table, (INTERPRETER, kernel, row, DTYPE), cfg)
        assert configs.resolve_config(torch.device("cpu"), kernel, head_dim, DTYPE) is cfg
        return cfg

    force.launches = launches
    return force


def _check_launches(launches, cfg: KernelConfig, expected: set[str]) -> None:
    """Every launch ran with the entry's tiles and options (as the compile check compiles them),
    and the stages run are ``expected``."""
    assert {launch.stage for launch in launches} == expected
    for planned in launches:
        launch = bind_launch(planned.stage, planned.kernel, planned.args, planned.params)
        assert table_mismatches(launch, cfg) == [], planned.stage
        assert planned.kernel.__name__ not in WS_KERNELS  # no Gluon on the interpreter


def _tile_sides(cfg: KernelConfig) -> set[int]:
    tiles = [cfg.stage_tiles(s) for s in ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "decode")]
    tiles += [cfg.bwd_dv] if cfg.bwd_dv is not None else []
    return {side for t in tiles for side in (t.block_m, t.block_n)}


def _crosses_every_tile(lengths: list[int], sides: set[int]) -> bool:
    """Some length ends one row into a tile of each side, and some one row short of one."""
    return all({1, side - 1} <= {n % side for n in lengths} for side in sides)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("kernel", "head_dim", "families"), CASES)
def test_family_entry_forward_backward(kernel, head_dim, families, causal, family_entry):
    """Forward and backward at the entry's tiles meet the accuracy rule against float64 (every
    output written: the buffers start as NaN), with sequences that cross each tile boundary:
    ``T + 1`` queries and keys (one row into the next tile; causal: the last query tile sees a
    whole key tile, so the unmasked loop runs), 1 query against ``T - 1`` keys (one short of a
    tile), 0 queries against 5 keys (dK, dV zero), ``T - 1`` queries against ``T / 2 - 1``
    keys (causal, bottom-right: its first ``T / 2`` rows see no key, whole query tiles of
    every size up to ``T / 2``) and 3 queries without keys."""
    cfg = family_entry(families[0], kernel, head_dim)
    sides = _tile_sides(cfg)
    t = max(sides)
    lens_q = [t + 1, 1, 0, t - 1, 3]
    lens_k = [t + 1, t - 1, 5, t // 2 - 1, 0]
    assert _crosses_every_tile(lens_q, sides) and _crosses_every_tile(lens_k, sides)
    p = make_pack(lens_q, lens_k, HEADS_Q, HEADS_K, head_dim, DTYPE, seed=head_dim + t)
    assert_accurate(p, kernel, causal=causal)
    stages = {"fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"}
    repairs = {"fwd_repair", "bwd_dkdv_repair", "bwd_dq_repair"}  # design §3.2
    _check_launches(family_entry.launches, cfg, stages | repairs if causal else stages)
    passes = sum(launch.stage == "bwd_dkdv" for launch in family_entry.launches)
    assert passes == (2 if cfg.dkdv_passes > 1 else 1)


@pytest.mark.parametrize(("kernel", "head_dim", "families"), CASES)
def test_family_entry_decode(kernel, head_dim, families, family_entry):
    """The decode kernel at the entry's decode tiles (a forward without gradients whose query
    sequences fit one tile takes it): out and lse meet the accuracy rule and equal, bit for bit,
    the prefill forward's rows (the same call with a larger ``max_seqlen_q``, which runs the
    forward kernel at the entry's forward tiles). Key lengths cross the key tile."""
    cfg = family_entry(families[0], kernel, head_dim)
    n = cfg.fwd.block_n
    lens_q, lens_k = [1, 4, 1, 0, 2], [2 * n - 1, n + 1, 1, 3, 0]
    assert _crosses_every_tile(lens_k, {n}) and cfg.decode_tiles().block_n == n
    p = make_pack(lens_q, lens_k, HEADS_Q, HEADS_K, head_dim, DTYPE, seed=head_dim + n)

    def forward_only(max_seqlen_q: int):
        with torch.no_grad():
            return portattn.varlen_attention(
                *(p.q, p.k, p.v, p.cu_q, p.cu_k, max_seqlen_q, max(lens_k)),
                causal=True,
                return_lse=True,
                kernel=kernel,
            )

    out, lse = forward_only(max(lens_q))
    # causal with several query rows: each pass and its repair (design §3.2)
    _check_launches(family_entry.launches, cfg, {"decode", "decode_repair"})
    family_entry.launches.clear()
    prefill_out, prefill_lse = forward_only(cfg.decode_tiles().block_m + 1)
    _check_launches(family_entry.launches, cfg, {"fwd", "fwd_repair"})
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(out, prefill_out) and torch.equal(lse, prefill_lse)
    ref = run_reference(p, causal=True)
    eager = run_reference(p, causal=True, compute_dtype=DTYPE)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref["lse"]))
    for name, got in (("out", out), ("lse", lse)):
        err, base, bound = harness.measure(name, got, ref[name], eager[name])
        assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g} (2 x eager {base:.3g})"
