"""What the warp-specialised Gluon kernels (``forward_ws.py``, ``backward_ws.py``,
``dq_ws.py``) share: the version gate, the register split between their partitions, their
launch options and shape rules, the partitions' layout and set-up (``specialize``: two consumer
warp groups and a producer warp over the kernel's named state), the rounded product, and the
ring protocol. The kernels use it as ``ws``.

Ring protocol. Tile ``i`` of a stream goes to slot ``i % STAGES``; each slot has a "filled"
mbarrier (the producer's copies complete it) and a "free" one (every consumer group arrives
once it is done with the slot). Pass ``i // STAGES`` over the ring waits for phase parity
``(i // STAGES) & 1``; the parity tells two fills of one slot apart only while no party runs a
whole pass ahead, so every consumer group waits for every fill, also of a tile it skips."""

from __future__ import annotations

from typing import NamedTuple

import triton

if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 6):
    raise ImportError("the warp-specialised kernels are written for Gluon as of Triton 3.6")

from triton.experimental import gluon  # noqa: E402 - after the version gate
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from portattn.configs import Tiles
from portattn.kernels import descriptors
from portattn.kernels.primitives import key_range, split_p_lo

# The TMA copy of a tile into shared memory, under its name in the installed Triton: 3.6 names
# it ``tma.async_copy_global_to_shared``; 3.9 renamed it ``tma.async_load`` and left the old
# name as a stub that raises "has been removed". Both emit the same operation
# (``create_async_tma_copy_global_to_local``; 3.9's new arguments, multicast and cache policy,
# keep their defaults), so the kernels call this one name and compile to the same code on each.
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

GROUP_WARPS = gl.constexpr(4)  # warps per consumer warp group
GROUP_ROWS = gl.constexpr(64)  # rows (queries, or keys in dK/dV) per group: one wgmma M
# Registers per thread: with two consumer groups they get 240 and the producer warp group 24
# (FlashAttention-3's split); the kernel starts with MAXNREG over its 12 warps, which covers
# both. With three (the forward at 192 query rows, FlashAttention-3/4's d64 shape) 160 and 32
# over 16 warps: 3 * 128 * 160 + 128 * 32 = 65,536, the SM's register file.
CONSUMER_REGS = gl.constexpr(240)
PRODUCER_REGS = gl.constexpr(24)
MAXNREG = 168
THREE_GROUP_REGS = gl.constexpr(160)
THREE_GROUP_PRODUCER_REGS = gl.constexpr(32)
THREE_GROUP_MAXNREG = 128


def ws_launch_options(tiles: Tiles) -> dict[str, int]:
    """Launch options of a warp-specialised kernel for the table's tiles (8 warps, or 12 for
    the forward's three groups): ``num_warps`` counts the default partition, one consumer
    group; the other groups and the producer warp are added by ``gl.warp_specialize``."""
    maxnreg = THREE_GROUP_MAXNREG if tiles.num_warps == 3 * GROUP_WARPS.value else MAXNREG
    return {"num_warps": GROUP_WARPS.value, "num_stages": tiles.num_stages, "maxnreg": maxnreg}


def groups_fit(groups: int, rows: int, tiles: Tiles, head_dim: int) -> bool:
    """``two_groups_fit`` for ``groups`` consumer groups (2, or 3 for the forward)."""
    return (
        rows == groups * GROUP_ROWS.value
        and tiles.num_warps == groups * GROUP_WARPS.value
        and tiles.num_stages >= 2
        and head_dim in (64, 128)
    )


def two_groups_fit(rows: int, tiles: Tiles, head_dim: int) -> bool:
    """What every warp-specialised kernel needs of its table tiles: ``rows`` (the program's
    query or key rows) in two groups of ``GROUP_ROWS``, 8 warps in all, a ring of at least two
    slots (with one, a group would wait for the next tile before releasing the slot it needs:
    a hang), and a head dim of 64 or 128 (rows that fill 128-byte swizzled shared memory)."""
    return groups_fit(2, rows, tiles, head_dim)


@gluon.constexpr_function
def acc_layout(cols):
    """The wgmma accumulator layout of a consumer group's [GROUP_ROWS, cols] tile."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[GROUP_WARPS.value, 1],
                                     instr_shape=[16, cols, 16])


@gluon.constexpr_function
def operand_layout(acc):
    """The layout of a register A operand (P, dS, their transposes) of a product into ``acc``."""
    return gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)


class Config(NamedTuple):
    """The compile-time parameters of a warp-specialised program, which every partition gets
    beside its state (``specialize``); a kernel leaves the flags it has not at False. Build it
    in the call to ``specialize``: Triton turns the constexprs of a tuple assigned to a local
    into tensors."""

    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr  # query rows of a program (forward, dQ) or of a ring tile (dK/dV)
    BLOCK_N: gl.constexpr  # key rows of a ring tile (forward, dQ) or of a program (dK/dV)
    CAUSAL: gl.constexpr
    SPLIT_P: gl.constexpr
    STAGES: gl.constexpr  # ring slots
    STORE_O32: gl.constexpr = False  # forward: also the float32 copy of out
    PADDED: gl.constexpr = False  # dQ: lse2 and delta in the padded head-major layout
    KEY_CHUNK: gl.constexpr = 0  # forward: the key chunk (design §3.1), its state parked
    HEADS: gl.constexpr = 1  # decode: query heads a tile row's position packs (row t: t // HEADS)
    PAGE_SIZE: gl.constexpr = 0  # decode: the paged cache's page rows (0: packed K/V)


@gluon.jit
def _consumer_group(consume: gl.constexpr, GROUP: gl.constexpr, program, cfg):
    consume(GROUP, program, cfg)


@gluon.jit
def _producer_warp(produce: gl.constexpr, program, cfg):
    produce(program, cfg)


@gluon.jit
def specialize(program, cfg, consume: gl.constexpr, produce: gl.constexpr,
               GROUPS: gl.constexpr = 2):
    """Run one program as ``GROUPS`` (2 or 3) consumer warp groups, ``consume(0, program,
    cfg)`` (the default partition), ``consume(1, program, cfg)``, ..., and a producer warp,
    ``produce(program, cfg)``; ``cfg`` is its ``Config``.

    ``program`` is the kernel's runtime state by name: a ``NamedTuple`` (``_Program``) of
    shared memory, barriers, descriptors, pointers and scalars, which every partition gets
    whole. A named tuple flattens as a plain one, in field order, so the partitions capture
    the values that positional tuples gave them, in the same order (the same machine code).
    The kernel assigns it to a local first, as it did the positional tuples: Triton then
    turns an integer argument that the launch specialised to a constexpr (a 1: ``batch``,
    ``group``, ``stride_hm``) into a tensor, as before."""
    if GROUPS == 3:
        gl.warp_specialize([
            (_consumer_group, (consume, 0, program, cfg)),
            (_consumer_group, (consume, 1, program, cfg)),
            (_consumer_group, (consume, 2, program, cfg)),
            (_producer_warp, (produce, program, cfg)),
        ], [GROUP_WARPS, GROUP_WARPS, 1],
            [THREE_GROUP_REGS, THREE_GROUP_REGS, THREE_GROUP_PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_group, (consume, 0, program, cfg)),
            (_consumer_group, (consume, 1, program, cfg)),
            (_producer_warp, (produce, program, cfg)),
        ], [GROUP_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit
def issue_rounded_mma(b_x, b_smem, b_acc, SPLIT_P: gl.constexpr, x_layout: gl.constexpr):
    """``acc + round(x) @ B`` (then ``+ round(x - hi) @ B`` with ``SPLIT_P``), issued
    asynchronously: ``mma_rounded`` of ``primitives.py`` with wgmma by hand; ``b_x`` float32
    in registers (P or dS), ``b_smem`` in shared memory."""
    b_hi = b_x.to(b_smem.dtype)
    b_acc = warpgroup_mma(gl.convert_layout(b_hi, x_layout), b_smem, b_acc, is_async=True)
    if SPLIT_P:
        b_lo = split_p_lo(b_x, b_hi)
        b_acc = warpgroup_mma(gl.convert_layout(b_lo, x_layout), b_smem, b_acc, is_async=True)
    return b_acc


@gluon.jit
def issue_scores_dp(a_s, b_s_smem, a_dp, b_dp_smem, b_zero):
    """The backward's two products of a tile, issued together from ``b_zero``: ``a_s @
    b_s_smem^T`` (the scores, or their transpose) and ``a_dp @ b_dp_smem^T`` (dP). Waits for
    the first only (the second runs on under the recomputed P) and returns both."""
    b_s = warpgroup_mma(a_s, b_s_smem.permute((1, 0)), b_zero, use_acc=False, is_async=True)
    b_dp = warpgroup_mma(a_dp, b_dp_smem.permute((1, 0)), b_zero, use_acc=False, is_async=True)
    b_s = warpgroup_mma_wait(1, deps=(b_s,))
    return b_s, b_dp


# The ragged descriptors' row coordinate bound (``descriptors.py``: one descriptor of a whole
# [tokens, heads, HEAD_DIM] tensor per launch, passed as a kernel parameter, whose copies name
# one sequence's rows; rows past its end read 0, as with a per-sequence descriptor).
RAGGED_ROWS = gl.constexpr(descriptors.RAGGED_ROWS)
# The shared memory of TMA tiles whose rows fill 128 bytes (a head dim of 64 or 128, 16-bit).
SWIZZLED_128B = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                  rank=2))


# A shared-memory tile seen as another shape and layout of the same bytes, under its name in
# the installed Triton (3.6: ``_reinterpret``; 3.9: ``reinterpret``).
if hasattr(gl.shared_memory_descriptor, "reinterpret"):

    @gluon.jit
    def _as_block(tile, desc):
        """``tile`` [R, HEAD_DIM] (or [R, 1, HEAD_DIM]) as the [1, 1, R, 1, HEAD_DIM] block of
        a ragged ``desc``."""
        return tile.reinterpret(tile.dtype, desc.block_type.shape, desc.layout)

    @gluon.jit
    def as_shape(tile, shape: gl.constexpr, layout: gl.constexpr):
        """``tile``'s bytes as a ``shape`` tile of ``layout``."""
        return tile.reinterpret(tile.dtype, shape, layout)

else:

    @gluon.jit
    def _as_block(tile, desc):
        """``tile`` [R, HEAD_DIM] (or [R, 1, HEAD_DIM]) as the [1, 1, R, 1, HEAD_DIM] block of
        a ragged ``desc``."""
        return tile._reinterpret(tile.dtype, desc.block_type.shape, desc.layout)

    @gluon.jit
    def as_shape(tile, shape: gl.constexpr, layout: gl.constexpr):
        """``tile``'s bytes as a ``shape`` tile of ``layout``."""
        return tile._reinterpret(tile.dtype, shape, layout)


@gluon.jit
def _ragged_coords(bos, seqlen, row, head):
    """The int32 coordinates of a ragged copy but the constant ones (``descriptors.py``:
    ``ragged_coordinates``): bos + seqlen, 2**30 - seqlen + row, head. cu_seqlens are int32,
    so every row index fits."""
    end = (bos + seqlen).to(gl.int32)
    start = (RAGGED_ROWS - seqlen + row).to(gl.int32)
    return end, start, head.to(gl.int32)


@gluon.jit
def ragged_load(desc, bos, seqlen, row, head, bar, tile, col=0):
    """Copy rows [row, row + R) of head ``head`` of the sequence whose rows are [bos, bos +
    seqlen) into ``tile`` ([R, C] of ``SWIZZLED_128B``: C the descriptor's columns, from
    ``col``), completing ``bar``; rows past the sequence's end read 0 (the row coordinate
    passes 2**30 there)."""
    end, start, head = _ragged_coords(bos, seqlen, row, head)
    tma_load(desc, [RAGGED_ROWS, end, start, head, col], bar, _as_block(tile, desc))


@gluon.jit
def ragged_store(desc, bos, seqlen, row, head, tile):
    """Copy ``tile`` ([R, HEAD_DIM] of ``SWIZZLED_128B``) to rows [row, row + R) of head
    ``head`` of the sequence whose rows are [bos, bos + seqlen), as ``ragged_load``: rows past
    the sequence's end are not written."""
    end, start, head = _ragged_coords(bos, seqlen, row, head)
    tma_store(desc, [RAGGED_ROWS, end, start, head, 0], _as_block(tile, desc))


# The TMA copy of a shared-memory tile to global memory, under its name in the installed
# Triton (3.6: ``async_copy_shared_to_global``; later ``async_store``), as ``tma_load``.
tma_store = (tma.async_store if hasattr(tma, "async_store")
             else tma.async_copy_shared_to_global)


@gluon.jit
def query_key_tiles(m_tile, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr):
    """The key tiles of the query tile at ``m_tile`` (``key_range``, counted in tiles): (diag,
    t_full, n_tiles); tiles from t_full on need the mask, n_tiles in all."""
    diag = seqlen_k - seqlen_q
    n_full, n_hi = key_range(m_tile, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    return diag, n_full // BLOCK_N, (n_hi + BLOCK_N - 1) // BLOCK_N


@gluon.jit
def tile_rows(start, bos, seqlen, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
              layout: gl.constexpr):
    """Where a group's [ROWS, HEAD_DIM] tile of ``layout`` (an accumulator) stores: rows
    [start, start + ROWS) of the sequence whose first token is ``bos``. Returns (o_r [ROWS]
    positions in the sequence, o_d [HEAD_DIM] columns, o_rows [ROWS, 1] token indices (int64),
    the [ROWS, HEAD_DIM] mask of the rows before ``seqlen``)."""
    o_r = start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    m_rd = (o_r < seqlen)[:, None] & (o_d < HEAD_DIM)[None, :]
    o_rows = (bos + o_r.to(gl.int64))[:, None]
    return o_r, o_d, o_rows, m_rd


@gluon.jit
def barriers(SLOTS: gl.constexpr, COUNT: gl.constexpr):
    """``SLOTS`` mbarriers, each completing a phase after ``COUNT`` arrivals."""
    bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(bars.index(i), count=COUNT)
    return bars


@gluon.jit
def wait_filled(bars, i, STAGES: gl.constexpr):
    """Consumer side: wait until tile ``i`` has landed in its ring slot."""
    mbarrier.wait(bars.index(i % STAGES), (i // STAGES) & 1)


@gluon.jit
def wait_free(free_bars, i, STAGES: gl.constexpr):
    """Producer side: wait until every consumer group released the slot of tile ``i`` from
    its previous tile. An mbarrier starts as if the phase before its first had completed, so
    the first pass over the ring does not wait."""
    mbarrier.wait(free_bars.index(i % STAGES), ((i // STAGES) & 1) ^ 1)


@gluon.jit
def skip_ring(filled_bars, free_bars, n_tiles, STAGES: gl.constexpr, first=0):
    """A consumer group with nothing to compute on tiles [first, n_tiles) (all its rows, or
    keys, past the sequence end; or, causal, past its rows' last key) still takes part in the
    ring: it waits for each tile's fill and releases its slot, so that the other groups' waits
    keep telling the passes apart (module docstring)."""
    for i in range(first, n_tiles):
        wait_filled(filled_bars, i, STAGES)
        mbarrier.arrive(free_bars.index(i % STAGES), count=1)
