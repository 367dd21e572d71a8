"""The one configuration table: fixed launch parameters per (family, kernel, head_dim, dtype).

No autotuning, and nothing here depends on max_seqlen, batch size or SM count: a sequence's
bits depend only on the family, the kernel, its head dim and dtype. The table is looked up
lazily, at the first call, never at import.

Triton versions: the kernels and this table are checked with Triton 3.6 through 3.9
(:data:`SUPPORTED_TRITON`); the first lookup checks the installed version and raises
:class:`UnsupportedTritonError` outside that range. A row that a later Triton compiles into
register spills has a per-version row in :data:`_SINCE_TRITON`, which replaces it from that
Triton version on; Triton 3.6 runs the base rows alone, so what 3.6 compiles never changes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

import torch

KERNELS = ("varlen", "fixed_order")
HEAD_DIMS = (32, 64, 96, 128, 256)  # the table's rows
# Head dims without rows of their own, run with the next row up (``table_head_dim``): every
# multiple of 8 from 8 to 256 that is no table row (flash-attn's and FA4's rule for q/k = v).
# Each runs the row's tiles with its padded power-of-two blocks (``VarlenProblem.block_d``,
# at least 16) and masked head-dim columns, except where that row spills with it: then the
# kernels that spill take tiles of their own (``_BORROWED_TILES``, ``borrowed_config``). The
# odd multiples of 8 (8, 24, 40, ..., 248) need token / head strides that are multiples of 8
# (``buffers.check_row_strides``, ``primitives.row_strides``).
BORROWED_HEAD_DIMS = tuple(d for d in range(8, 257, 8) if d not in HEAD_DIMS)
SUPPORTED_HEAD_DIMS = tuple(sorted(HEAD_DIMS + BORROWED_HEAD_DIMS))
# The head dims that pair with a value head dim of another width (D != Dv): those supported
# before every multiple of 8 was (the compile check and the tests cover their pairs).
PAIR_HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128, 256)
# A value head dim of its own (v, out: [..., Dv]; q, k: [..., D]): any two of PAIR_HEAD_DIMS,
# and these (D, Dv) pairs whose D is not one of them (MLA training and prefill:
# DeepSeek V3, Kimi K2). A pair runs the row of the wider head dim, table_head_dim(max(D, Dv)),
# with per-version tiles where that row spills with it (``pair_config``), and only the Triton
# kernels (``plan.gluon_applies``); the compile check covers each pair (``python -m portattn
# compile --head-dim 192 --head-dim-v 128``: no spills in any family, Triton 3.6 and 3.9).
VALUE_HEAD_DIM_PAIRS = ((192, 128),)


def table_head_dim(head_dim: int) -> int:
    """The table row a head dim runs with: the smallest table head dim at or above it. Its
    padded width (``VarlenProblem.block_d``, the next power of two) is the row's own, so the
    row's tiles take the same registers and shared memory (the compile check checks it)."""
    return next(d for d in HEAD_DIMS if d >= head_dim)


DTYPES = (torch.float16, torch.bfloat16)
INTERPRETER = "interpreter"  # pseudo-family: CPU tensors under TRITON_INTERPRET=1
TILE_FIELDS = ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq")  # KernelConfig's Tiles, in field order
TMA_KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")  # kernels that can read through tensor descriptors
# Triton releases the kernels and this table are checked with: (major, minor) from the first
# supported up to the first unsupported one. pyproject.toml's `triton>=3.6,<3.10` says the same.
SUPPORTED_TRITON = ((3, 6), (3, 10))
AMD_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


@dataclass(frozen=True)
class Tiles:
    """Launch parameters of one kernel. AMD-only knobs are None on CUDA."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None
    kpack: int | None = None

    def launch_kwargs(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages} | self.amd_knobs()

    def amd_knobs(self) -> dict[str, int]:
        """The AMD launch knobs that are set (empty on CUDA)."""
        return {k: getattr(self, k) for k in AMD_KNOBS if getattr(self, k) is not None}


@dataclass(frozen=True)
class KernelConfig:
    """Tiles of the four kernels of one (family, kernel, head_dim, dtype). ``dkdv_passes``: 1,
    dK and dV summed by one program; 2, by separate programs (one float32 accumulator each
    instead of two; both compute ``K Q^T``); 4, separate programs per gradient and half of the
    head dim. More passes fit wider tiles in registers at the cost of recomputed products.
    ``fwd_chunks``: 1, or 2 forward programs per query tile, each computing the output for
    half of the head dim (scores and softmax computed by both), where the full [BLOCK_M, D]
    accumulator does not fit. ``bwd_dv``: tiles of the dV launch where ``dkdv_passes`` > 1
    (None: those of ``bwd_dkdv``); with one accumulator and two products per tile, the dV
    launch fits wider query tiles than the dK launch. ``tma`` (Hopper): the kernels among
    ``TMA_KERNELS`` that read their row tiles through per-sequence tensor descriptors (the copy
    engine) where the tensors' addresses allow it, else through masked pointer loads (the dK/dV
    kernel then also stores dK and dV through descriptors); both read and write the same
    values, so the bits do not depend on it. ``fwd_ws`` (Hopper, with ``fwd`` in ``tma``):
    the forward runs as the warp-specialised Gluon kernel of ``kernels/forward_ws.py`` (a
    producer warp and two consumer warp groups whose softmax overlaps the products) where the
    descriptor path applies, else as the Triton kernel; the forward tiles mean the same
    (BLOCK_M 128 = two groups of 64 rows, 8 consumer warps, ``num_stages`` K/V ring slots) and
    so do the bits. ``bwd_ws`` (Hopper, with ``bwd_dkdv`` in ``tma`` and one pass): the dK/dV
    sums run as the warp-specialised Gluon kernel of ``kernels/backward_ws.py`` where the
    descriptor path applies, else as the Triton kernel at the same tiles (BLOCK_N 128 = two
    groups of 64 key rows, 8 consumer warps, ``num_stages`` ring slots of BLOCK_M query rows);
    the bits are the same. ``dq_ws`` (Hopper, with ``bwd_dq`` in ``tma``): dQ runs as the
    warp-specialised Gluon kernel of ``kernels/dq_ws.py`` where the descriptor path applies
    (BLOCK_M 128 = two groups of 64 query rows, 8 consumer warps, ``num_stages`` K/V ring
    slots of BLOCK_N 64 keys), else as the Triton kernel; the bits are the same."""

    fwd: Tiles
    bwd_pre: Tiles
    bwd_dkdv: Tiles
    bwd_dq: Tiles
    dkdv_passes: int = 1
    fwd_chunks: int = 1
    bwd_dv: Tiles | None = None
    tma: tuple[str, ...] = ()
    fwd_ws: bool = False
    bwd_ws: bool = False
    dq_ws: bool = False
    decode: Tiles | None = None  # the decode kernel's tiles where the derived ones do not fit

    def __post_init__(self) -> None:
        """An entry is checked when it is made: a field outside what the launchers implement,
        or a warp-specialised kernel selected where it cannot run (it has one program per tile
        and one dK/dV pass), is a ValueError, never a quiet fallback at launch."""
        problems = []
        if self.dkdv_passes not in (1, 2, 4):
            problems.append(f"dkdv_passes must be 1, 2 or 4, got {self.dkdv_passes}")
        if self.fwd_chunks not in (1, 2):
            problems.append(f"fwd_chunks must be 1 or 2, got {self.fwd_chunks}")
        if not set(self.tma) <= set(TMA_KERNELS):
            problems.append(f"tma must name kernels of {TMA_KERNELS}, got {self.tma}")
        if self.fwd_ws and self.fwd_chunks != 1:
            problems.append("fwd_ws needs fwd_chunks == 1")
        if self.bwd_ws and self.dkdv_passes != 1:
            problems.append("bwd_ws needs dkdv_passes == 1")
        if self.decode is not None and self.decode.block_n != self.fwd.block_n:
            problems.append("decode tiles need the forward's block_n (a row's key tiles)")
        if problems:
            raise ValueError("bad configuration entry: " + "; ".join(problems))

    def stage_tiles(self, stage: str) -> Tiles:
        """The tiles of a kernel stage: a tile field (``fwd``, ``bwd_pre``, ``bwd_dkdv``,
        ``bwd_dq``) or ``decode`` (:meth:`decode_tiles`)."""
        return self.decode_tiles() if stage == "decode" else getattr(self, stage)

    def dkdv_launch_tiles(self, want_dk: bool) -> Tiles:
        """Tiles of a dK/dV launch: the dV-only launch may have its own."""
        if not want_dk and self.bwd_dv is not None:
            return self.bwd_dv
        return self.bwd_dkdv

    def decode_tiles(self) -> Tiles:
        """Tiles of the decode kernel (``kernels/decode.py``), derived from the forward's, so the
        content hash covers them: the same key tile (a row's bits depend on its key tiles), at
        most 64 query rows (a decode step fills few), the forward's warps and stages (fewer
        warps spill on sm90 d128, and 64 rows keep Hopper's wgmma products)."""
        if self.decode is not None:  # an entry's own decode row
            return self.decode
        fwd = self.fwd
        block_m = min(fwd.block_m, 64)
        warps = fwd.num_warps
        return dataclasses.replace(fwd, block_m=block_m, num_warps=warps)

    def content_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the canonical JSON of this entry. ``dkdv_passes``,
        ``fwd_chunks``, ``bwd_dv``, ``tma``, ``fwd_ws``, ``bwd_ws``, ``dq_ws`` and ``decode`` (added later) enter only when they
        are not their defaults, so the hashes of entries without them are the ones recorded
        before they existed."""
        fields = asdict(self)
        for later, default in (
            ("dkdv_passes", 1),
            ("fwd_chunks", 1),
            ("bwd_dv", None),
            ("tma", ()),
            ("fwd_ws", False),
            ("bwd_ws", False),
            ("dq_ws", False),
            ("decode", None),
        ):
            if fields[later] == default:
                del fields[later]
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _tiles(spec: tuple[int, ...], amd: dict[str, int]) -> Tiles:
    """(block_m, block_n, warps, stages[, waves_per_eu]): a fifth number overrides the row's
    ``waves_per_eu`` for this one kernel."""
    knobs = dict(amd, waves_per_eu=spec[4]) if len(spec) == 5 else amd
    return Tiles(*spec[:4], **knobs)


def _cfg(
    fwd,
    dkdv,
    dq,
    amd=None,
    dkdv_passes=1,
    fwd_chunks=1,
    dv=None,
    tma=(),
    fwd_ws=False,
    bwd_ws=False,
    dq_ws=False,
) -> KernelConfig:
    """Compact row: (block_m, block_n, warps, stages) per kernel; ``amd`` = AMD knobs;
    ``dv``: the dV launch's own tiles (with ``dkdv_passes`` > 1)."""
    amd = amd or {}
    pre = Tiles(64, 64, 4, 1, **amd)
    return KernelConfig(
        _tiles(fwd, amd),
        pre,
        _tiles(dkdv, amd),
        _tiles(dq, amd),
        dkdv_passes,
        fwd_chunks,
        _tiles(dv, amd) if dv else None,
        tuple(tma),
        fwd_ws,
        bwd_ws,
        dq_ws,
    )


def _retuned(
    row: KernelConfig, fwd=None, dkdv=None, dq=None, decode=None, pre=None, **fields
) -> KernelConfig:
    """``row`` with some kernels' tiles replaced (compact tuples as in ``_cfg``; ``pre``: the
    preprocess kernel's; the AMD knobs stay those of the kernel replaced, a fifth number still
    overrides ``waves_per_eu``) and other fields (``fwd_ws=False``...) set: a per-version row
    says only what differs."""
    stages = (
        ("fwd", fwd),
        ("bwd_dkdv", dkdv),
        ("bwd_dq", dq),
        ("decode", decode),
        ("bwd_pre", pre),
    )
    for stage, spec in stages:
        if spec is not None:
            knobs = getattr(row, "fwd" if stage == "decode" else stage).amd_knobs()
            fields[stage] = _tiles(spec, knobs)
    return dataclasses.replace(row, **fields)


# Rows are chosen so that every kernel compiles without register spills, within the family's
# shared memory / LDS, using its matrix instructions (``python -m portattn compile`` checks it).
# fixed_order keeps two rounded copies of P and dS (split-P), so where it needs smaller tiles
# than varlen it has its own row in _FIXED_ORDER. ``dkdv_passes`` (default 1) splits the dK/dV
# sums over separate programs where the two float32 accumulators do not fit beside wgmma tiles,
# and ``fwd_chunks`` the forward's output columns (sm90 fixed_order d256: every single-program
# wgmma tiling spills).
_AMD = dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)
_AMD1 = dict(waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1)
# fmt: off
# head_dim:        fwd (BM, BN, warps, stages)   dK/dV (BM, BN, w, s)   dQ (BM, BN, w, s)
# (``tma``: the kernels that read through tensor descriptors, where that measured faster;
# sm90 d96 dK/dV: both gradients by one program of one warp group at (32, 64), two CTAs per
# SM, perf-notes rows 42-45; ``fwd_ws``: the varlen d128 forward warp-specialised, rows 49-51;
# ``bwd_ws``: the varlen d64/d128 dK/dV warp-specialised, 128 keys in two groups, row 53;
# ``dq_ws``: the d128 dQ warp-specialised, 128 query rows in two groups, row 54)
_FWD, _DKDV, _DQ = "fwd", "bwd_dkdv", "bwd_dq"
_SM90 = {
    32:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2), tma=(_DKDV,)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ),
              bwd_ws=True),
    96:  _cfg((128, 128, 8, 3),  (32, 64, 4, 3),   (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ)),
    128: _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ),
              fwd_ws=True, bwd_ws=True, dq_ws=True),
    256: _cfg((64, 64, 8, 2),    (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=2),
}
_SM80 = {
    32:  _cfg((128, 64, 4, 3),   (16, 64, 4, 2),   (64, 32, 4, 2)),
    64:  _cfg((128, 64, 8, 3),   (32, 32, 4, 2),   (64, 32, 4, 2)),
    96:  _cfg((64, 64, 8, 3),    (16, 64, 8, 2),   (64, 32, 4, 2)),
    128: _cfg((64, 64, 8, 3),    (16, 64, 8, 2),   (64, 32, 4, 2)),
    256: _cfg((64, 64, 8, 1),    (32, 32, 8, 1),   (32, 32, 4, 1)),
}
# sm100 (B200, GB200): sm90's tiles without its Hopper-only fields (descriptors, Gluon
# kernels); Triton's Blackwell path turns the products into tcgen05 (accumulators in tensor
# memory). dQ at d96/d128 keeps two stages, not three (three spill: 32 / 8 bytes).
_SM100 = {
    32:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3)),
    96:  _cfg((128, 128, 8, 3),  (32, 64, 4, 3),   (128, 64, 8, 2)),
    128: _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    256: _cfg((64, 64, 8, 2),    (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=2),
}
# sm120 (RTX 50xx, RTX PRO 6000 Blackwell; 99 KiB of shared memory per block, mma.sync like
# sm80): sm80's rows, whose largest kernel takes 88 KiB. A retune of sm80 moves them too
# (golden/sm120.json's fingerprints say so); copy the rows here first to keep them.
_SM120 = _SM80
# CDNA: d32 to d128 run one row (written once; each head dim still gets its own entry).
_CDNA_UP_TO_128 = (32, 64, 96, 128)
_CDNA3 = {
    **{d: _cfg((128, 64, 4, 1),  (32, 64, 4, 1),   (64, 32, 4, 1), _AMD) for d in _CDNA_UP_TO_128},
    256: _cfg((64, 64, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), _AMD1),
}
_CDNA2 = {
    **{d: _cfg((64, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), _AMD) for d in _CDNA_UP_TO_128},
    256: _cfg((64, 32, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), _AMD1),
}
# fixed_order rows that differ from the family's row (a fifth number is waves_per_eu). sm90
# d64-d128 forwards (and varlen d64's): one warp group per CTA at (64, 64), so two CTAs share
# an SM and one's softmax runs under the other's products (perf-notes rows 34-35).
_FIXED_ORDER = {
    "sm90": {
        64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ)),
        96:  _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 2), tma=(_FWD, _DKDV)),
        128: _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ),
                  dq_ws=True),
        256: _cfg((128, 64, 8, 2),   (32, 64, 8, 2),   (128, 32, 8, 2), dkdv_passes=4,
                  fwd_chunks=2),
    },
    "cdna2": {
        96:  _cfg((64, 64, 4, 1),    (16, 64, 4, 1),   (64, 32, 4, 1), _AMD),
        128: _cfg((64, 64, 4, 1),    (16, 64, 4, 1),   (64, 32, 4, 1), _AMD),
    },
    "cdna3": {
        96:  _cfg((128, 64, 4, 1, 1), (16, 64, 4, 1),  (32, 32, 4, 1), _AMD),
        128: _cfg((128, 64, 4, 1, 1), (16, 64, 4, 1),  (32, 32, 4, 1), _AMD),
        256: _cfg((64, 64, 4, 1),    (16, 32, 4, 1),   (32, 32, 4, 1), _AMD1),
    },
}
_FIXED_ORDER["cdna4"] = _FIXED_ORDER["cdna3"]
# sm100: sm90's fixed_order rows (without descriptors and Gluon); d32: the decode kernel
# spills at 8 warps (24 bytes, bf16) and fits at 4; d256: dQ at 64 query rows (Triton 3.6
# compiles 128-row dQ tiles to a kernel that is only a trap, no tcgen05).
_FIXED_ORDER["sm100"] = {
    32:  _retuned(_SM100[32], decode=(64, 128, 4, 3)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3)),
    96:  _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 2)),
    128: _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 3)),
    256: _cfg((128, 64, 8, 2),   (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=4, fwd_chunks=2),
}
# sm80 fixed_order d96/d128: the decode kernel (per-row heads and page addresses beside the
# split-P products) spills at the forward's 64 rows and 3 stages; one stage fits. It keeps
# the forward's rows and warps: at 32 rows of 4 warps its row sums (l, so the lse) were not
# the forward's bits (decode rows != prefill rows, seen on the H200 under the sm80 override).
_FIXED_ORDER["sm80"] = {d: _retuned(_SM80[d], decode=(64, 64, 8, 1)) for d in (96, 128)}
# Per-Triton-version rows: (major, minor) of the first Triton that needs them -> (family,
# kernel, head_dim) -> the row it runs from that version on (both dtypes), instead of the one
# above; a later version's row for the same entry replaces an earlier one. Only where the
# compile check fails with the rows above (what fails is said per version); each row changes
# the least that compiles cleanly, chosen by ``python -m portattn compile`` under that Triton.
# Same rule throughout: a forward that spills on CDNA gets one wave per EU (512 VGPRs), as the
# fixed_order forwards already have, and where it still spills (or on sm90) half the key tile.
# The interpreter row never differs; cdna4 shares cdna3's rows but not these (it compiles
# cleanly with the rows above).
_SINCE_TRITON = {
    # Triton 3.7's AMD backend: the cdna3 varlen d96/d128 forward spills (up to 42 VGPRs).
    (3, 7): {
        ("cdna3", "varlen", 96):       _retuned(_CDNA3[96], fwd=(128, 64, 4, 1, 1)),
        ("cdna3", "varlen", 128):      _retuned(_CDNA3[128], fwd=(128, 64, 4, 1, 1)),
    },
    # Triton 3.8's AMD backend: the cdna3 fixed_order d256 forward spills (up to 9 VGPRs).
    (3, 8): {
        ("cdna3", "fixed_order", 256): _retuned(_FIXED_ORDER["cdna3"][256], fwd=(64, 32, 4, 1)),
    },
    # Triton 3.9 assembles sm90 with CUDA 13's ptxas (3.6-3.8: ptxas 12.x) and passes it
    # --regAllocOptLevel=2 (a workaround for a ptxas 13 bug), which spills where 3.8 did not.
    # varlen d128: the warp-specialised forward and dK/dV (296 / 92 bytes; 240 registers per
    # consumer thread is already the most that their 12 warps allow) run as the Triton kernels
    # at the same tiles (the same bits, see ``KernelConfig``); the d64 dK/dV and d128 dQ
    # kernels stay warp-specialised (no spills). d256: the forwards and varlen's dQ (96, 48,
    # 24 bytes) get half the key tile, same warps and stages.
    (3, 9): {
        ("sm90", "varlen", 128):       _retuned(_SM90[128], fwd_ws=False, bwd_ws=False),
        ("sm90", "varlen", 256):       _retuned(_SM90[256], fwd=(64, 32, 8, 2), dq=(64, 16, 8, 2)),
        ("sm90", "fixed_order", 256):  _retuned(_FIXED_ORDER["sm90"][256], fwd=(128, 32, 8, 2)),
        # sm80 (the same ptxas 13): the fixed_order d256 decode kernel spills at the forward's
        # tiles (64, 64, 8, 1): 16 bytes in float16 (bf16 fits); 2 or 3 stages spill 128 bytes
        # in both dtypes. Its rows and warps must stay the forward's (other ones changed the lse
        # bits of decode rows on the H200, see d96/d128 above) and its key tile too (a row's
        # bits depend on its key tiles). So the whole entry splits the head dim instead: the
        # forward and decode kernels each run two programs of 128 output columns at the same
        # tiles (fwd_chunks, as sm90's fixed_order d256), both computing the scores and softmax
        # over the full head dim; 0 spills (forward 206 / 213 registers, decode 232 / 240, fp16
        # / bf16). The interpreter gives the same bits as unsplit (test_table_variants).
        ("sm80", "fixed_order", 256):  _retuned(_SM80[256], fwd_chunks=2),
        # sm100 (ptxas 13.4 here, 12.9 in 3.6): the varlen d96/d128 forwards spill (24 / 32
        # bytes at 255 registers) and get half the key tile, which their decode kernels follow
        # at 2 stages (3 spill 16 bytes: d96, and d112 on the d128 row); the fixed_order d256
        # decode kernel spills (12 bytes, bf16) and gets 4 warps.
        ("sm100", "varlen", 96):       _retuned(_SM100[96], fwd=(128, 64, 8, 3),
                                                decode=(64, 64, 8, 2)),
        ("sm100", "varlen", 128):      _retuned(_SM100[128], fwd=(128, 64, 8, 3),
                                                decode=(64, 64, 8, 2)),
        ("sm100", "fixed_order", 256): _retuned(_FIXED_ORDER["sm100"][256], decode=(64, 64, 4, 2)),
    },
}
# Per-Triton-version tiles of a value-head-dim pair (``VALUE_HEAD_DIM_PAIRS``) where the row
# of its wider head dim spills with it: (first Triton) -> (family, kernel, (D, Dv)) -> the
# kernels' tiles that replace the row's (``_retuned``), from that version on (``pair_config``).
# Triton 3.9: the sm90 fixed_order (192, 128) dQ spills at d256's (128, 32, 8, 2) (56 / 40
# bytes, fp16 / bf16); half the key tile, same warps and stages, as the rows above. The sm80
# fixed_order (192, 128) forward and decode kernels spill (1,228 to 1,336 bytes) at d256's 3.9
# entry, whose two programs per query tile (fwd_chunks=2) each recompute the scores for 64 of
# v's 128 columns; one program (d256's 3.6 tiles, which v's 128 columns do not need split) has
# 0 spills (183 to 239 registers).
_PAIR_SINCE_TRITON = {
    (3, 9): {("sm90", "fixed_order", (192, 128)): dict(dq=(128, 16, 8, 2)),
             ("sm80", "fixed_order", (192, 128)): dict(fwd_chunks=1)},
}
# Tiles of borrowed head dims (``BORROWED_HEAD_DIMS``) where the row they borrow spills with
# them: (family, kernel, head_dim) -> the kernels' tiles that replace the row's (``_retuned``
# fields; both dtypes), for every Triton version, applied to the row that version runs
# (``borrowed_config``); no Triton version needs tiles of its own here (3.9's compile: 930
# kernels, 0 spills; a version that does gets a table as ``_PAIR_SINCE_TRITON``). Same rule as the rows above: half the key tile or fewer stages, same warps; a
# decode kernel keeps its forward's rows, warps and key tile, and follows a forward that
# changes (its tiles are derived from the forward's unless the row has its own). Checked with
# ``python -m portattn compile --head-dim D`` (bytes of spills on the borrowed row's tiles,
# Triton 3.6 unless said; 0 spills with the tiles here):
# - sm90 varlen forward, the odd multiples of 8 above 128: 24 bytes at d256's (64, 64, 8, 2)
#   (136, 200, 248; 160, a multiple of 16, has none); half the key tile: 0 (136: 188
#   registers, its decode 192). 152, 168, 184, 216, 232 take it too, not compiled each.
# - sm90 fixed_order preprocess (bf16) above 128: 16 bytes at (64, 64, 4, 1) (160, 200, 248);
#   half the query rows (the preprocess has no key tile: its rows are its only tile); every
#   head dim from 136 to 248 takes it (the others not compiled each).
# - sm100 varlen 160 dK/dV: 16 bytes at d256's (32, 64, 8, 2); one stage.
# - sm120 fixed_order decode, the odd multiples of 8 on the d96 / d128 rows (72, 88, 104, 120):
#   72 bytes (255 registers) at the forward's (64, 64, 8, 3); one stage: 0 (88, 104: 179
#   registers), as sm80's fixed_order d96 / d128 decode (same rows, warps and key tile as the
#   forward).
# - sm80 (and sm120, its rows) fixed_order 16 forward: 8 bytes (bf16, 168 registers) at d32's
#   (128, 64, 4, 3); 2 stages spill 16; half the key tile: 0 (128 registers; decode, which
#   follows, 68 / 80 registers bf16 / fp16).
_BORROWED_TILES = {
    **{("sm90", "varlen", d):       dict(fwd=(64, 32, 8, 2)) for d in range(136, 256, 16)},
    **{("sm90", "fixed_order", d):  dict(pre=(32, 64, 4, 1)) for d in range(136, 256, 8)},
    ("sm100", "varlen", 160):       dict(dkdv=(32, 64, 8, 1)),
    **{("sm120", "fixed_order", d): dict(decode=(64, 64, 8, 1)) for d in (72, 88, 104, 120)},
    ("sm80", "fixed_order", 16):    dict(fwd=(128, 32, 4, 3)),
    ("sm120", "fixed_order", 16):   dict(fwd=(128, 32, 4, 3)),
}
# Triton 3.9 needs none (yet): compiled with the tiles above, 0 spills in 930 kernels (bf16:
# 8, 16, 24, 40, 88, 104, 200 in every family, 56, 72, 120, 136, 160, 248 in sm90, sm100 and
# the CDNA families, 16, 72, 120, 136 in sm80 / sm120, 88 / 104 sm120 fixed_order; fp16: 40,
# 200 in sm90 / sm100), against 5 kernels of 3.6's 420 (8, 16, 24, 88, 104, 136) above.
# Small tiles under the CPU interpreter: fast there, and many tile boundaries in small tests.
_INTERP = {d: _cfg((32, 16, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)) for d in HEAD_DIMS}
# fmt: on

_BY_FAMILY = {
    "sm80": _SM80,
    "sm90": _SM90,
    "sm100": _SM100,
    "sm120": _SM120,
    "cdna2": _CDNA2,
    "cdna3": _CDNA3,
    "cdna4": _CDNA3,
    INTERPRETER: _INTERP,
}


def _row(family: str, kernel: str, head_dim: int) -> KernelConfig:
    if kernel == "fixed_order" and head_dim in _FIXED_ORDER.get(family, {}):
        return _FIXED_ORDER[family][head_dim]
    return _BY_FAMILY[family][head_dim]


def _versioned_row(family: str, kernel: str, head_dim: int, triton: tuple[int, int]):
    """The row of the latest per-version override at or before ``triton``, else the base row."""
    for since in sorted(_SINCE_TRITON, reverse=True):
        if triton >= since and (family, kernel, head_dim) in _SINCE_TRITON[since]:
            return _SINCE_TRITON[since][(family, kernel, head_dim)]
    return _row(family, kernel, head_dim)


def table_for(triton: tuple[int, int]) -> dict[tuple[str, str, int, torch.dtype], KernelConfig]:
    """Every (family, kernel, head_dim, dtype) entry for Triton ``triton`` ((major, minor); no
    range check: tests and tools read any version's table). Both dtypes currently share a row,
    and both kernels unless _FIXED_ORDER has a row; they are separate keys so one can change
    alone."""
    return {
        (fam, kernel, d, dtype): _versioned_row(fam, kernel, d, triton)
        for fam in _BY_FAMILY
        for kernel in KERNELS
        for d in HEAD_DIMS
        for dtype in DTYPES
    }


def table_versions() -> tuple[tuple[int, int], ...]:
    """The Triton versions whose tables differ: the lowest supported and each override's."""
    return (SUPPORTED_TRITON[0], *sorted(_SINCE_TRITON))


@functools.cache
def config_table() -> dict[tuple[str, str, int, torch.dtype], KernelConfig]:
    """The table for the installed Triton (checked: :func:`supported_triton_version`)."""
    return table_for(supported_triton_version())


class UnsupportedTritonError(RuntimeError):
    """The installed Triton is outside :data:`SUPPORTED_TRITON`."""


def installed_triton() -> str:
    """``triton.__version__``: also on ROCm, whose Triton is the distribution
    ``pytorch-triton-rocm`` (package metadata would not find "triton" there)."""
    import triton

    return triton.__version__


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: ``"3.9.0"``, ``"3.6.0+git1234"``, ``"3.5.0rc1"``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise UnsupportedTritonError(f"cannot read Triton's version {version!r}")
    return int(match[1]), int(match[2])


def supported_triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton; raises :class:`UnsupportedTritonError`, naming
    the version and the range, when portattn is not checked with it. Called through
    :func:`config_table` (cached) at the first launch, so an unsupported Triton fails there
    with this message rather than deep inside a compile, and importing portattn never does."""
    version = installed_triton()
    parsed = parse_version(version)
    low, high = SUPPORTED_TRITON
    if not low <= parsed < high:
        supported = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise UnsupportedTritonError(
            f"portattn supports Triton {supported} (its kernels and configuration table are "
            f"checked with {low[0]}.{low[1]} through {high[0]}.{high[1] - 1}); the installed "
            f"Triton is {version}. Install a supported one: pip install 'triton{supported}' "
            "(ROCm: the pytorch-triton-rocm of a torch build that ships one)"
        )
    return parsed


def get_config(family: str, kernel: str, head_dim: int, dtype: torch.dtype) -> KernelConfig:
    return config_table()[(family, kernel, head_dim, dtype)]


def interpreter_active() -> bool:
    """True when Triton runs kernels on the CPU interpreter (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def upcast_dot(q: torch.Tensor) -> bool:
    """Operands of ``tl.dot`` go to float32 only under the interpreter for bfloat16, where the
    interpreter would otherwise multiply raw bits (triton-lang/triton#11584)."""
    return interpreter_active() and q.dtype == torch.bfloat16


def pair_config(
    cfg: KernelConfig,
    family: str,
    kernel: str,
    head_dim: int,
    head_dim_v: int,
    triton: tuple[int, int] | None = None,
) -> KernelConfig:
    """The entry a call with v's own head dim runs: ``cfg`` (the row of the wider head dim),
    with the pair's tiles of :data:`_PAIR_SINCE_TRITON` for Triton ``triton`` (default: the
    installed one) where it has them."""
    if head_dim_v == head_dim:
        return cfg
    triton = triton or supported_triton_version()
    for since in sorted(_PAIR_SINCE_TRITON, reverse=True):
        fields = _PAIR_SINCE_TRITON[since].get((family, kernel, (head_dim, head_dim_v)))
        if triton >= since and fields:
            return _retuned(cfg, **fields)
    return cfg


def borrowed_config(cfg: KernelConfig, family: str, kernel: str, head_dim: int) -> KernelConfig:
    """The entry a borrowed head dim (q/k = v) runs: ``cfg`` (the row it borrows, as the Triton
    version at hand runs it) with its tiles of :data:`_BORROWED_TILES` where it has them;
    ``cfg`` itself for a table head dim."""
    fields = None if head_dim in HEAD_DIMS else _BORROWED_TILES.get((family, kernel, head_dim))
    return _retuned(cfg, **fields) if fields else cfg


def entry_config(
    family: str,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
    triton: tuple[int, int] | None = None,
) -> KernelConfig:
    """The configuration of ``family`` for a call with head dim ``head_dim`` (v's:
    ``head_dim_v``, None: the same), for Triton ``triton`` (default: the installed one): the
    table row of the wider head dim (:func:`table_head_dim`), with a pair's tiles
    (:func:`pair_config`) or a borrowed head dim's (:func:`borrowed_config`)."""
    dims = head_dim if head_dim_v is None else max(head_dim, head_dim_v)
    row = table_head_dim(dims)
    key = (family, kernel, row, dtype)
    cfg = config_table()[key] if triton is None else table_for(triton)[key]
    if head_dim_v is not None and head_dim_v != head_dim:
        return pair_config(cfg, family, kernel, head_dim, head_dim_v, triton)
    return borrowed_config(cfg, family, kernel, head_dim)


def resolve_config(
    device: torch.device,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
):
    """The configuration for tensors on ``device``: the interpreter row for CPU tensors, else the
    device's family (or its nearest family for devices outside the table), as
    :func:`entry_config` gives it."""
    if device.type == "cpu":
        family = INTERPRETER
    else:
        from portattn.families import config_family

        family = config_family(device)
    return entry_config(family, kernel, head_dim, dtype, head_dim_v)
