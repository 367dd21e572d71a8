"""The configuration table's rows, as data: fixed launch parameters per (family, kernel,
head_dim, dtype), every row in this one file, beside the per-Triton-version rows
(:data:`SINCE_TRITON`, :data:`PAIR_SINCE_TRITON`) and the borrowed head dims' own tiles
(:data:`BORROWED_TILES`) that replace them where they spill. The rows are one line each, so
this file alone is exempt from the line-length lint (pyproject.toml).

No autotuning, and nothing here depends on max_seqlen, batch size or SM count: a sequence's
bits depend only on the family, the kernel, its head dim and dtype. How an entry is put
together from these tables, for the installed Triton: :mod:`portattn.configs.lookup` (and
``python -m portattn config``, which prints each field's source).

Triton versions: the kernels and this table are checked with Triton 3.6 through 3.9
(``triton_gate.SUPPORTED_TRITON``). A row that a later Triton compiles into register spills
has a per-version row in :data:`SINCE_TRITON`, which replaces it from that Triton version on;
Triton 3.6 runs the base rows alone, so what 3.6 compiles never changes.
"""

from __future__ import annotations

from portattn.configs.types import (
    HEAD_DIMS,
    INTERPRETER,
    KernelConfig,
    Tiles,
    compact_tiles,
    retuned,
)


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
    repair_products=2,
    key_chunk=0,
    decode_ws=False,
) -> KernelConfig:
    """Compact row: (block_m, block_n, warps, stages) per kernel; ``amd`` = AMD knobs;
    ``dv``: the dV launch's own tiles (with ``dkdv_passes`` > 1)."""
    amd = amd or {}
    pre = Tiles(64, 64, 4, 1, **amd)
    return KernelConfig(
        compact_tiles(fwd, amd),
        pre,
        compact_tiles(dkdv, amd),
        compact_tiles(dq, amd),
        dkdv_passes,
        fwd_chunks,
        compact_tiles(dv, amd) if dv else None,
        tuple(tma),
        fwd_ws,
        bwd_ws,
        dq_ws,
        decode_ws=decode_ws,
        repair_products=repair_products,
        key_chunk=key_chunk,
    )


# Rows are chosen so that every kernel compiles without register spills, within the family's
# shared memory / LDS, using its matrix instructions (``python -m portattn compile`` checks it).
# fixed_order keeps two rounded copies of P and dS (split-P), so where it needs smaller tiles
# than varlen it has its own row in FIXED_ORDER. ``dkdv_passes`` (default 1) splits the dK/dV
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
# The key chunk of the sm90 d64 / d128 entries (design §3.1, ``key_chunk``): a sequence's keys
# in chunks of C from its first, merged in order, so a decode splits a long sequence over
# programs with the prefill's bits. perf-notes rows 116-117 (H100) chose C = 16,384: the
# training forward pays nothing measurable (1x32768 d128 causal 0.998 / 0.995 of its time
# without; a pack whose sequences are no longer than C runs the code without the merge), a
# 32k-key decode reads 0.47 TB/s at B1 (0.21 unsplit), 2.76 at B8 (1.67); C 8192 cost a 32k
# sequence 2.5-3.7%. Set in session 45 with golden/sm90.json re-recorded on an H100 (row 118:
# the 30 old cases kept their bits, the two split-decode cases added). Changing it changes
# those entries' configuration hashes: refresh sm90's golden outputs in the same change.
SM90_KEY_CHUNK = 16384
SM90 = {
    32:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2), tma=(_DKDV,)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ),
              bwd_ws=True, key_chunk=SM90_KEY_CHUNK),
    96:  _cfg((128, 128, 8, 3),  (32, 64, 4, 3),   (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ)),
    128: _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 3), tma=(_FWD, _DKDV, _DQ),
              fwd_ws=True, bwd_ws=True, dq_ws=True, key_chunk=SM90_KEY_CHUNK, decode_ws=True),
    256: _cfg((64, 64, 8, 2),    (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=2),
}
SM80 = {
    32:  _cfg((128, 64, 4, 3),   (16, 64, 4, 2),   (64, 32, 4, 2)),
    64:  _cfg((128, 64, 8, 3),   (32, 32, 4, 2),   (64, 32, 4, 2)),
    96:  _cfg((64, 64, 8, 3),    (16, 64, 8, 2),   (64, 32, 4, 2)),
    128: _cfg((64, 64, 8, 3),    (16, 64, 8, 2),   (64, 32, 4, 2)),
    256: _cfg((64, 64, 8, 1),    (32, 32, 8, 1),   (32, 32, 4, 1)),
}
# sm100 (B200, GB200): sm90's tiles without its Hopper-only fields (descriptors, Gluon
# kernels); Triton's Blackwell path turns the products into tcgen05 (accumulators in tensor
# memory). dQ at d96/d128 keeps two stages, not three (three spill: 32 / 8 bytes).
# ``repair_products=1`` (varlen d256, fixed_order d96/d128/d256 below): with the second
# accumulator of a repair pass's masked tiles Triton 3.6 compiled their repair kernels to a
# trap (design §3.2).
SM100 = {
    32:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3)),
    96:  _cfg((128, 128, 8, 3),  (32, 64, 4, 3),   (128, 64, 8, 2)),
    128: _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    256: _cfg((64, 64, 8, 2),    (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=2,
              repair_products=1),
}
# sm120 (RTX 50xx, RTX PRO 6000 Blackwell; 99 KiB of shared memory per block, mma.sync like
# sm80): sm80's rows, whose largest kernel takes 88 KiB. A retune of sm80 moves them too
# (golden/sm120.json's fingerprints say so); copy the rows here first to keep them. d256:
# one repair product (the forward's repair with two took 106-114 KiB of shared memory).
SM120 = {**SM80, 256: retuned(SM80[256], repair_products=1)}
# CDNA: d32 to d128 run one row (written once; each head dim still gets its own entry).
_CDNA_UP_TO_128 = (32, 64, 96, 128)
CDNA3 = {
    **{d: _cfg((128, 64, 4, 1),  (32, 64, 4, 1),   (64, 32, 4, 1), _AMD) for d in _CDNA_UP_TO_128},
    256: _cfg((64, 64, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), _AMD1),
}
CDNA2 = {
    **{d: _cfg((64, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), _AMD) for d in _CDNA_UP_TO_128},
    256: _cfg((64, 32, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), _AMD1),
}
# fixed_order rows that differ from the family's row (a fifth number is waves_per_eu). sm90
# d96 forward (and d64's, whose fixed_order runs the family's row, its warp-specialised dK/dV
# included: perf-notes row 109): one warp group per CTA at (64, 64), so two CTAs share an SM
# and one's softmax runs under the other's products (rows 34-35). d128: the forward
# warp-specialised at 64-key tiles (two consumer groups of 64 rows, the bits of the Triton
# kernel's 64-row tiles; row 109), the decode kept at the old forward's (64, 64, 4, 3).
FIXED_ORDER = {
    "sm90": {
        96:  _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 2), tma=(_FWD, _DKDV)),
        128: retuned(_cfg((128, 64, 8, 3), (32, 64, 4, 3), (128, 64, 8, 3),
                          tma=(_FWD, _DKDV, _DQ), fwd_ws=True, dq_ws=True, key_chunk=SM90_KEY_CHUNK,
                          decode_ws=True),
                     decode=(64, 64, 4, 3)),
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
FIXED_ORDER["cdna4"] = FIXED_ORDER["cdna3"]
# sm100: sm90's fixed_order rows (without descriptors and Gluon); d32: the decode kernel
# spills at 8 warps (24 bytes, bf16) and fits at 4; d256: dQ at 64 query rows (Triton 3.6
# compiles 128-row dQ tiles to a kernel that is only a trap, no tcgen05).
FIXED_ORDER["sm100"] = {
    32:  retuned(SM100[32], decode=(64, 128, 4, 3)),
    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3)),
    96:  _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 2), repair_products=1),
    128: _cfg((64, 64, 4, 3),    (32, 64, 4, 3),   (128, 64, 8, 3), repair_products=1),
    256: _cfg((128, 64, 8, 2),   (32, 64, 8, 2),   (64, 32, 8, 2), dkdv_passes=4, fwd_chunks=2,
              repair_products=1),
}
# sm80 fixed_order d96/d128: the decode kernel (per-row heads and page addresses beside the
# split-P products) spills at the forward's 64 rows and 3 stages; one stage fits. It keeps
# the forward's rows and warps: at 32 rows of 4 warps its row sums (l, so the lse) were not
# the forward's bits (decode rows != prefill rows, seen on the H200 under the sm80 override).
FIXED_ORDER["sm80"] = {d: retuned(SM80[d], decode=(64, 64, 8, 1)) for d in (96, 128)}
# Spills the compile check reports instead of failing: (family, table head dim) -> stage ->
# bytes of spill stores and loads at most. Only the key split's stages of the entries with a
# key chunk (design §3.1), which run only for rows past C keys, and only where every launch
# tried is slower or spills too (Triton 3.6 / 3.9, bf16, varlen / fixed_order; perf-notes
# rows 115-117):
# - decode_split, the chunks' partials: 40 / 32 B (3.9: 56 / 8) at the decode's 3 stages; the
#   spill-free launches (8 warps 1 stage; fixed_order 8 warps 2 stages) read a 32k-key B1
#   decode at 0.27 / 0.25 TB/s against 3 stages' 0.47 / 0.38;
# - decode_chunked, the unsplit decode past C (a grid that fills the GPU, or a split
#   workspace over ``decode.SPLIT_MAX_BYTES``), its two accumulators in registers: 744 / 392 B
#   (3.9: 836 / 948), every 64-row launch of 1-2 stages and 4-8 warps spills 136-2,036 B;
#   B64 x 32k keys 2.93 TB/s against 3.00 without C;
# - fwd_chunked, Triton 3.9 only (the varlen d128 entry runs the Triton forward there, its
#   Gluon forward spills; under 3.6 the Gluon forward parks its accumulator, 0 B): the
#   in-register merge spills 544 B (fixed_order 64 B).
# d64 compiles spill-free under 3.6; under 3.9 its fixed_order decode_chunked spills 8 B.
CHUNK_SPILLS = {
    ("sm90", 128): {"decode_split": 64, "decode_chunked": 1024, "fwd_chunked": 640},
    ("sm90", 64): {"decode_chunked": 16},
}
# Per-Triton-version rows: (major, minor) of the first Triton that needs them -> (family,
# kernel, head_dim) -> the row it runs from that version on (both dtypes), instead of the one
# above; a later version's row for the same entry replaces an earlier one. Only where the
# compile check fails with the rows above (what fails is said per version); each row changes
# the least that compiles cleanly, chosen by ``python -m portattn compile`` under that Triton.
# Same rule throughout: a forward that spills on CDNA gets one wave per EU (512 VGPRs), as the
# fixed_order forwards already have, and where it still spills (or on sm90) half the key tile.
# The interpreter row never differs; cdna4 shares cdna3's rows but not these (it compiles
# cleanly with the rows above).
SINCE_TRITON = {
    # Triton 3.7's AMD backend: the cdna3 varlen d96/d128 forward spills (up to 42 VGPRs).
    (3, 7): {
        ("cdna3", "varlen", 96):       retuned(CDNA3[96], fwd=(128, 64, 4, 1, 1)),
        ("cdna3", "varlen", 128):      retuned(CDNA3[128], fwd=(128, 64, 4, 1, 1)),
    },
    # Triton 3.8's AMD backend: the cdna3 fixed_order d256 forward spills (up to 9 VGPRs).
    (3, 8): {
        ("cdna3", "fixed_order", 256): retuned(FIXED_ORDER["cdna3"][256], fwd=(64, 32, 4, 1)),
    },
    # Triton 3.9 assembles sm90 with CUDA 13's ptxas (3.6-3.8: ptxas 12.x) and passes it
    # --regAllocOptLevel=2 (a workaround for a ptxas 13 bug), which spills where 3.8 did not.
    # varlen d128: the warp-specialised forward and dK/dV (296 / 92 bytes; 240 registers per
    # consumer thread is already the most that their 12 warps allow) run as the Triton kernels
    # at the same tiles (the same bits, see ``KernelConfig``); the d64 dK/dV and d128 dQ
    # kernels stay warp-specialised (no spills). d256: the forwards and varlen's dQ (96, 48,
    # 24 bytes) get half the key tile, same warps and stages.
    (3, 9): {
        ("sm90", "varlen", 128):       retuned(SM90[128], fwd_ws=False, bwd_ws=False),
        ("sm90", "varlen", 256):       retuned(SM90[256], fwd=(64, 32, 8, 2), dq=(64, 16, 8, 2)),
        ("sm90", "fixed_order", 256):  retuned(FIXED_ORDER["sm90"][256], fwd=(128, 32, 8, 2)),
        # sm80 (the same ptxas 13): the fixed_order d256 decode kernel spills at the forward's
        # tiles (64, 64, 8, 1): 16 bytes in float16 (bf16 fits); 2 or 3 stages spill 128 bytes
        # in both dtypes. Its rows and warps must stay the forward's (other ones changed the lse
        # bits of decode rows on the H200, see d96/d128 above) and its key tile too (a row's
        # bits depend on its key tiles). So the whole entry splits the head dim instead: the
        # forward and decode kernels each run two programs of 128 output columns at the same
        # tiles (fwd_chunks, as sm90's fixed_order d256), both computing the scores and softmax
        # over the full head dim; 0 spills (forward 206 / 213 registers, decode 232 / 240, fp16
        # / bf16). The interpreter gives the same bits as unsplit (test_table_variants).
        ("sm80", "fixed_order", 256):  retuned(SM80[256], fwd_chunks=2),
        # sm100 (ptxas 13.4 here, 12.9 in 3.6): the varlen d96/d128 forwards spill (24 / 32
        # bytes at 255 registers) and get half the key tile, which their decode kernels follow
        # at 2 stages (3 spill 16 bytes: d96, and d112 on the d128 row); the fixed_order d256
        # decode kernel spills (12 bytes, bf16) and gets 4 warps.
        ("sm100", "varlen", 96):       retuned(SM100[96], fwd=(128, 64, 8, 3),
                                               decode=(64, 64, 8, 2)),
        ("sm100", "varlen", 128):      retuned(SM100[128], fwd=(128, 64, 8, 3),
                                               decode=(64, 64, 8, 2)),
        ("sm100", "fixed_order", 256): retuned(FIXED_ORDER["sm100"][256], decode=(64, 64, 4, 2)),
    },
}
# Per-Triton-version tiles of a value-head-dim pair (``VALUE_HEAD_DIM_PAIRS``) where the row
# of its wider head dim spills with it: (first Triton) -> (family, kernel, (D, Dv)) -> the
# kernels' tiles that replace the row's (``retuned``), from that version on (``pair_config``).
# Triton 3.9: the sm90 fixed_order (192, 128) dQ spills at d256's (128, 32, 8, 2) (56 / 40
# bytes, fp16 / bf16); half the key tile, same warps and stages, as the rows above. The sm80
# fixed_order (192, 128) forward and decode kernels spill (1,228 to 1,336 bytes) at d256's 3.9
# entry, whose two programs per query tile (fwd_chunks=2) each recompute the scores for 64 of
# v's 128 columns; one program (d256's 3.6 tiles, which v's 128 columns do not need split) has
# 0 spills (183 to 239 registers).
PAIR_SINCE_TRITON = {
    (3, 9): {("sm90", "fixed_order", (192, 128)): dict(dq=(128, 16, 8, 2)),
             ("sm80", "fixed_order", (192, 128)): dict(fwd_chunks=1)},
}
# Tiles of borrowed head dims (``BORROWED_HEAD_DIMS``) where the row they borrow spills with
# them: (family, kernel, head_dim) -> the kernels' tiles that replace the row's (``retuned``
# fields; both dtypes), for every Triton version, applied to the row that version runs
# (``borrowed_config``); no Triton version needs tiles of its own here (3.9's compile: 930
# kernels, 0 spills; a version that does gets a table as ``PAIR_SINCE_TRITON``). Same rule as the rows above: half the key tile or fewer stages, same warps; a
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
BORROWED_TILES = {
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
INTERP = {d: _cfg((32, 16, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)) for d in HEAD_DIMS}
# fmt: on

# The paged decode's key tiles per block-table read (``KernelConfig.page_block``), per family:
# every entry of a family named here gets it (``lookup.versioned_row``), the others read the
# table once per key tile (0). sm90: 16, so the key loop issues no load but K's and V's and its
# copies pipeline (perf-notes row 88: the per-tile read made each iteration wait for all copies,
# DEPBAR.LE 0 against the packed loop's 2). Not where the decode kernel spilled with it (16
# tiles; row 88 and row 89: sm80 varlen d64, sm100 varlen d32 and fixed_order d64, sm120 varlen
# d32), nor elsewhere untested on a GPU. The interpreter: 16, so the CPU tests run that loop.
PAGE_BLOCK = {"sm90": 16, INTERPRETER: 16}

# Each family's base rows (cdna4 runs cdna3's); the kernel, head dim and Triton version pick
# among these, FIXED_ORDER and SINCE_TRITON (``lookup.base_row``, ``lookup.versioned_row``).
BY_FAMILY = {
    "sm80": SM80,
    "sm90": SM90,
    "sm100": SM100,
    "sm120": SM120,
    "cdna2": CDNA2,
    "cdna3": CDNA3,
    "cdna4": CDNA3,
    INTERPRETER: INTERP,
}
