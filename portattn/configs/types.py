"""The configuration table's types: launch tiles (:class:`Tiles`), the entry of one (family,
kernel, head_dim, dtype) (:class:`KernelConfig`, with its content hash), the axes of the table
(kernels, head dims, dtypes) and the compact forms the rows are written in
(:func:`compact_tiles`, :func:`retuned`). The rows themselves are in :mod:`portattn.configs.rows`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import asdict, dataclass

import torch

KERNELS = ("varlen", "fixed_order")
HEAD_DIMS = (32, 64, 96, 128, 256)  # the table's rows
# Head dims without rows of their own, run with the next row up (``table_head_dim``): every
# multiple of 8 from 8 to 256 that is no table row (flash-attn's and FA4's rule for q/k = v).
# Each runs the row's tiles with its padded power-of-two blocks (``VarlenProblem.block_d``,
# at least 16) and masked head-dim columns, except where that row spills with it: then the
# kernels that spill take tiles of their own (``rows.BORROWED_TILES``,
# ``lookup.borrowed_config``). The odd multiples of 8 (8, 24, 40, ..., 248) need token / head
# strides that are multiples of 8 (``buffers.check_row_strides``, ``addressing.row_strides``).
BORROWED_HEAD_DIMS = tuple(d for d in range(8, 257, 8) if d not in HEAD_DIMS)
SUPPORTED_HEAD_DIMS = tuple(sorted(HEAD_DIMS + BORROWED_HEAD_DIMS))
# The head dims that pair with a value head dim of another width (D != Dv): those supported
# before every multiple of 8 was (the compile check and the tests cover their pairs).
PAIR_HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128, 256)
# A value head dim of its own (v, out: [..., Dv]; q, k: [..., D]): any two of PAIR_HEAD_DIMS,
# and these (D, Dv) pairs whose D is not one of them (MLA training and prefill:
# DeepSeek V3, Kimi K2). A pair runs the row of the wider head dim, table_head_dim(max(D, Dv)),
# with per-version tiles where that row spills with it (``lookup.pair_config``), and only the Triton
# kernels (``plan.gluon_applies``); the compile check covers each pair (``python -m portattn
# compile --head-dim 192 --head-dim-v 128``: no spills in any family, Triton 3.6 and 3.9).
VALUE_HEAD_DIM_PAIRS = ((192, 128),)


def table_head_dim(head_dim: int) -> int:
    """The table row a head dim runs with: the smallest table head dim at or above it. Its
    padded width (``VarlenProblem.block_d``, the next power of two) is the row's own, so the
    row's tiles take the same registers and shared memory (the compile check checks it)."""
    row = _TABLE_ROWS.get(head_dim)
    return row if row is not None else next(d for d in HEAD_DIMS if d >= head_dim)


# table_head_dim of every head dim up to the widest row (it runs on every call's host path)
_TABLE_ROWS = {d: next(r for r in HEAD_DIMS if r >= d) for d in range(1, HEAD_DIMS[-1] + 1)}


DTYPES = (torch.float16, torch.bfloat16)
INTERPRETER = "interpreter"  # pseudo-family: CPU tensors under TRITON_INTERPRET=1
TILE_FIELDS = ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq")  # KernelConfig's Tiles, in field order
TMA_KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")  # kernels that can read through tensor descriptors
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
        """Triton's launch options of these tiles (a new dict; made once per tiles)."""
        return dict(_launch_kwargs(self))

    def amd_knobs(self) -> dict[str, int]:
        """The AMD launch knobs that are set (empty on CUDA)."""
        return {k: getattr(self, k) for k in AMD_KNOBS if getattr(self, k) is not None}


@functools.cache
def _launch_kwargs(tiles: Tiles) -> tuple[tuple[str, int], ...]:
    options = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    return tuple((options | tiles.amd_knobs()).items())


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
    (BLOCK_M 128 = two groups of 64 rows, 8 consumer warps, ``num_stages`` K/V ring slots; at
    d64 also 192 = three groups, 12 warps, whose Triton kernel runs ``triton_fwd_tiles``) and
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
    # Hopper: the decode runs as the Gluon kernel of ``kernels/decode_ws.py`` (forward_ws's key
    # loop on the decode tile: a producer warp, one consumer group) where it applies
    # (``decode.gluon_decode_applies``), else as ``kernels/decode.py``; the same bits.
    decode_ws: bool = False
    decode: Tiles | None = None  # the decode kernel's tiles where the derived ones do not fit
    # The products per masked tile of a repair pass (design §3.2): 2, the plain product for
    # rows that see a non-finite operand row beside the clean one for the others; 1 where two
    # do not fit (sm100's tensor memory, sm120's shared memory): NaN in those rows instead.
    repair_products: int = 2
    # The paged decode's key tiles per block-table read (``addressing.page_block``): 0, one
    # read per key tile; a power of two, that many tiles' entries read at once into registers,
    # which keeps the key loop free of other loads than K's and V's. Same bits either way; set
    # per family (``rows.PAGE_BLOCK``), and in no content hash (see ``content_hash``).
    page_block: int = 0
    # The key chunk (design §3.1): 0, a row's keys are one key loop; else a multiple of the
    # forward's and the decode's block_n, each chunk of that many keys from a sequence's first
    # its own loop, merged in order (row_state.merge_partial): the decode may then split a
    # sequence's keys over programs with the prefill's bits.
    key_chunk: int = 0

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
        if self.repair_products not in (1, 2):
            problems.append(f"repair_products must be 1 or 2, got {self.repair_products}")
        if self.page_block < 0 or self.page_block & (self.page_block - 1):
            problems.append(f"page_block must be 0 or a power of two, got {self.page_block}")
        if self.key_chunk < 0 or self.key_chunk % self.fwd.block_n:
            problems.append(f"key_chunk must be 0 or a multiple of block_n, got {self.key_chunk}")
        if self.decode is not None and self.decode.block_n != self.fwd.block_n:
            problems.append("decode tiles need the forward's block_n (a row's key tiles)")
        if problems:
            raise ValueError("bad configuration entry: " + "; ".join(problems))

    def stage_tiles(self, stage: str) -> Tiles:
        """The tiles of a kernel stage: a tile field (``fwd``, ``bwd_pre``, ``bwd_dkdv``,
        ``bwd_dq``) or a decode stage (``decode``, ``decode_split``, ``decode_combine``:
        :meth:`decode_tiles`)."""
        return self.decode_tiles() if stage.startswith("decode") else getattr(self, stage)

    def dkdv_launch_tiles(self, want_dk: bool) -> Tiles:
        """Tiles of a dK/dV launch: the dV-only launch may have its own."""
        if not want_dk and self.bwd_dv is not None:
            return self.bwd_dv
        return self.bwd_dkdv

    def triton_fwd_tiles(self) -> Tiles:
        """Tiles of the Triton forward (``attn_fwd_kernel``: where the Gluon one does not
        apply, and the repair pass): the forward's, but where those are the Gluon forward's
        three groups (192 rows, 12 warps; ``triton.language.arange`` needs a power of two) one
        group's 64 rows in 4 warps: the same key tiles and wgmma, so the same bits."""
        fwd = self.fwd
        if fwd.block_m == 192:
            return dataclasses.replace(fwd, block_m=64, num_warps=4)
        return fwd

    def decode_tiles(self) -> Tiles:
        """Tiles of the decode kernel (``kernels/decode.py``), derived from the forward's, so the
        content hash covers them: the same key tile (a row's bits depend on its key tiles), at
        most 64 query rows (a decode step fills few) and no fewer where the forward has 64 or
        more (on sm90 fewer rows leave wgmma for mma.sync, whose products give other bits:
        perf-notes row 85), the forward's warps and stages (fewer warps spill on sm90 d128)."""
        if self.decode is not None:  # an entry's own decode row
            return self.decode
        derived = self.__dict__.get("_decode_tiles")  # made once per entry (planning reads it
        if derived is None:  # several times a call); not a field: no hash or equality sees it
            fwd = self.triton_fwd_tiles()
            derived = dataclasses.replace(fwd, block_m=min(fwd.block_m, 64))
            object.__setattr__(self, "_decode_tiles", derived)
        return derived

    def content_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the canonical JSON of this entry. ``dkdv_passes``,
        ``fwd_chunks``, ``bwd_dv``, ``tma``, ``fwd_ws``, ``bwd_ws``, ``dq_ws``, ``decode_ws``,
        ``decode``, ``repair_products`` and ``key_chunk`` (added later) enter only when they are
        not their defaults, so the hashes of entries without them are the ones recorded before
        they existed.
        ``page_block`` enters never: it is the family's way of reading a paged cache's block
        table (``rows.PAGE_BLOCK``), not a tile or a kernel choice of the entry, and gives the
        same bits, so the hashes golden/ records with an entry's bits stay those of its tiles
        (the machine code it changes is in golden/'s fingerprints)."""
        fields = asdict(self)
        del fields["page_block"]
        for later, default in (
            ("repair_products", 2),
            ("dkdv_passes", 1),
            ("fwd_chunks", 1),
            ("bwd_dv", None),
            ("tma", ()),
            ("fwd_ws", False),
            ("bwd_ws", False),
            ("dq_ws", False),
            ("decode_ws", False),
            ("decode", None),
            ("key_chunk", 0),
        ):
            if fields[later] == default:
                del fields[later]
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def compact_tiles(spec: tuple[int, ...], amd: dict[str, int]) -> Tiles:
    """(block_m, block_n, warps, stages[, waves_per_eu]): a fifth number overrides the row's
    ``waves_per_eu`` for this one kernel."""
    knobs = dict(amd, waves_per_eu=spec[4]) if len(spec) == 5 else amd
    return Tiles(*spec[:4], **knobs)


def retuned(
    row: KernelConfig, fwd=None, dkdv=None, dq=None, decode=None, pre=None, **fields
) -> KernelConfig:
    """``row`` with some kernels' tiles replaced (compact tuples as in :func:`compact_tiles`;
    ``pre``: the preprocess kernel's; the AMD knobs stay those of the kernel replaced, a fifth
    number still overrides ``waves_per_eu``) and other fields (``fwd_ws=False``...) set: a
    per-version row says only what differs."""
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
            fields[stage] = compact_tiles(spec, knobs)
    return dataclasses.replace(row, **fields)
