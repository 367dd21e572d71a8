"""Hopper forward kernel in Gluon: warp-specialised, same arithmetic as ``forward.py``.

Triton 3.6 cannot overlap the forward's softmax with its matrix products on Hopper: its
automatic warp specialisation fails there (perf-notes row 26) and it waits for a ``wgmma``
right after issuing it unless the result is the next product's accumulator (rows 21, 32).
Gluon states the schedule by hand (FlashAttention-3's structure):

* one producer warp copies Q, then K and V tiles into a ring of ``STAGES`` slots (TMA, through
  the launch's ragged host descriptors, ``descriptors.py``: rows past the sequence end read
  0), each tile signalling an mbarrier;
* two consumer warp groups of 4 warps each own 64 query rows of the program's 128. Each issues
  the next key tile's ``Q K^T`` and, right after it, this tile's ``P V``, computes the next
  softmax while they run (P packed to the input dtype under the exponentials), and rescales
  acc by the next tile's alpha once ``P V`` is done (FlashAttention-4's order: the same
  products and rescales of acc in the same order as rescaling before each ``P V``; it issues
  ``P V`` without the rescale's 64 multiplies in between, perf-notes row 97). It releases a
  slot (an mbarrier both groups arrive on) once its ``P V`` is done. The groups run
  unsynchronised, so one's softmax also runs under the other's products.

Bits. Every element is computed by the same expressions as in ``attn_fwd_kernel``: the shared
``online_softmax_step``, ``visible_mask``, ``mask_scores``, ``split_p_lo`` and
``normalize_rows``, P rounded to the input dtype, the same wgmma products over the same key
tiles, in the same order. Both groups visit the key tiles of the whole 128-row tile,
as the Triton kernel does; a tile no row of a group sees leaves its (m, l, acc) unchanged. So
the two kernels give the same bits for the same table tiles (GPU tests compare them bitwise,
``tests/test_ws_variants.py``). The table selects this kernel (``KernelConfig.fwd_ws``);
the launcher falls back to ``attn_fwd_kernel`` where descriptors cannot be used, and Gluon
has no CPU interpreter.

Key chunks (``KEY_CHUNK``, design §3.1). Each chunk's tiles run the key loop above from the
empty state (``_chunk``); at its end the group merges it into the running state, whose
accumulator is parked in global memory between merges, in the group's own rows of the float32
``o32`` buffer (the launcher passes a workspace when the call keeps no float32 copy): stored
and loaded in the accumulator's layout by the thread that holds each element, so no barrier
orders them, and loaded while the chunk's last P V runs. m and l stay in registers. So the key
loop holds one accumulator, as without chunks: kept in registers the second one spilled
3,900 B at 128-key tiles (perf-notes row 94), parked in shared memory it cost the ring its
third slot (row 95). The pipeline drains at each chunk end (the next chunk's first Q K^T is
not issued under the last P V).
"""

from __future__ import annotations

from typing import NamedTuple

# portattn.kernels.ws_common raises ImportError before Triton 3.6 (the launcher then runs the
# Triton kernel).
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from portattn.configs import Tiles
from portattn.kernels import ws_common as ws
from portattn.kernels.addressing import query_tile
from portattn.kernels.primitives import (
    mask_scores,
    online_softmax_step,
    visible_mask,
)
from portattn.kernels.row_state import merge_partial, normalize_rows


def ws_supports(tiles: Tiles, head_dim: int) -> bool:
    """Tiles and head dims this kernel is written for (the table test checks every entry that
    selects it): 128 query rows in two groups (``ws.two_groups_fit``), or at d64 192 rows in
    three (FlashAttention-3/4's d64 shape, 160 registers a consumer thread), 64 or 128 keys."""
    groups = 3 if head_dim == 64 and tiles.block_m == 3 * ws.GROUP_ROWS.value else 2
    return ws.groups_fit(groups, tiles.block_m, tiles, head_dim) and tiles.block_n in (64, 128)


class _Program(NamedTuple):
    """The runtime state of one forward program (a 128-row query tile of one head), which
    every partition reads by name (``ws.specialize``); its constexprs are a ``ws.Config``."""

    # Shared memory: the groups' Q tiles [GROUPS, 64, HEAD_DIM], the K and V rings [STAGES,
    # BLOCK_N, HEAD_DIM]; the mbarriers of Q (one per group), of the ring's fills and frees.
    q_smem: gl.shared_memory_descriptor
    k_ring: gl.shared_memory_descriptor
    v_ring: gl.shared_memory_descriptor
    q_bars: gl.shared_memory_descriptor
    k_bars: gl.shared_memory_descriptor
    v_bars: gl.shared_memory_descriptor
    free_bars: gl.shared_memory_descriptor
    # Outputs: o [total_q, Hq, D] (its ragged descriptor), lse [total_q, Hq], o32 float32
    # [total_q, Hq, D] (with STORE_O32; with KEY_CHUNK also the running accumulators' park).
    o: tma.tensor_descriptor
    lse: gl.tensor
    o32: gl.tensor
    # The query tile: rows [m_tile, m_tile + 128) of head i_h of the sequence whose first
    # token is bos_q; key tiles from t_full on need the mask, n_tiles in all.
    bos_q: gl.tensor
    seqlen_q: gl.tensor
    seqlen_k: gl.tensor
    diag: gl.tensor
    t_full: gl.tensor
    n_tiles: gl.tensor
    m_tile: gl.tensor
    i_h: gl.tensor
    n_heads_q: gl.tensor
    stride_ot: gl.tensor
    stride_oh: gl.tensor
    stride_o32t: gl.tensor
    stride_o32h: gl.tensor
    scale_log2: gl.tensor
    # The producer's: the launch's ragged descriptors of q, k and v (``ws.ragged_load``), the
    # sequence's first key row and the kv head.
    q_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    bos_k: gl.tensor
    i_hk: gl.tensor


@gluon.jit
def _group_keys(st, m_start, BLOCK_N: gl.constexpr):
    """``st`` with the key tiles of one group's 64 rows from ``m_start`` (causal): its own
    ``t_full`` and ``n_tiles`` (``ws.query_key_tiles``) in place of the program's. The tiles
    the program's rows see beyond the group's are masked whole for its rows and would leave
    their state unchanged, and the tiles it no longer masks are seen whole by its rows, so the
    bits are the same; three groups of a 192-row tile then skip that work."""
    _, t_full, n_tiles = ws.query_key_tiles(m_start, st.seqlen_q, st.seqlen_k, ws.GROUP_ROWS,
                                            BLOCK_N, True)
    return _Program(
        q_smem=st.q_smem, k_ring=st.k_ring, v_ring=st.v_ring, q_bars=st.q_bars,
        k_bars=st.k_bars, v_bars=st.v_bars, free_bars=st.free_bars, o=st.o, lse=st.lse,
        o32=st.o32, bos_q=st.bos_q, seqlen_q=st.seqlen_q, seqlen_k=st.seqlen_k, diag=st.diag,
        t_full=t_full, n_tiles=n_tiles, m_tile=st.m_tile, i_h=st.i_h, n_heads_q=st.n_heads_q,
        stride_ot=st.stride_ot, stride_oh=st.stride_oh, stride_o32t=st.stride_o32t,
        stride_o32h=st.stride_o32h, scale_log2=st.scale_log2, q_desc=st.q_desc,
        k_desc=st.k_desc, v_desc=st.v_desc, bos_k=st.bos_k, i_hk=st.i_hk)


@gluon.jit
def _softmax_p(b_s, b_m, b_l, i_tile, st, cfg, m_start, s_layout: gl.constexpr):
    """Mask key tile ``i_tile``'s raw scores where it needs it, then one online-softmax step;
    P comes rounded to the input dtype as P V rounds it (in float32 with ``SPLIT_P``, whose
    second product takes what the rounding left)."""
    if i_tile >= st.t_full:
        o_t = gl.arange(0, ws.GROUP_ROWS, layout=gl.SliceLayout(1, s_layout))
        if cfg.HEADS > 1:  # a decode tile (decode_ws): row t is query position t // HEADS
            o_t = o_t // cfg.HEADS
        o_q = m_start + o_t
        o_k = i_tile * cfg.BLOCK_N + gl.arange(0, cfg.BLOCK_N,
                                               layout=gl.SliceLayout(0, s_layout))
        m_vis = visible_mask(o_q[:, None], o_k[None, :], st.seqlen_k, st.diag, cfg.CAUSAL)
        b_s = mask_scores(b_s, m_vis)
    b_p, b_alpha, b_m, b_l = online_softmax_step(b_s, b_m, b_l, st.scale_log2)
    if not cfg.SPLIT_P:  # P as P V rounds it, packed here under the exponentials
        b_p = b_p.to(st.v_ring.dtype)
    return b_p, b_alpha, b_m, b_l


@gluon.jit
def first_scores(q_tile, i_tile, st, cfg, m_start, b_m, b_l, s_layout: gl.constexpr):
    """Q K^T of key tile ``i_tile`` and its softmax step, nothing else in flight. (Its alpha
    rescales nothing: it is the first tile of the loop, acc is empty.)"""
    b_zero = gl.zeros([ws.GROUP_ROWS, cfg.BLOCK_N], gl.float32, layout=s_layout)
    ws.wait_filled(st.k_bars, i_tile, cfg.STAGES)
    b_s = warpgroup_mma(q_tile, st.k_ring.index(i_tile % cfg.STAGES).permute((1, 0)), b_zero,
                        use_acc=False, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=(b_s,))
    return _softmax_p(b_s, b_m, b_l, i_tile, st, cfg, m_start, s_layout)


@gluon.jit
def next_tile(q_tile, i_tile, st, cfg, m_start, b_acc, b_p, b_m, b_l,
               s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """One step of the key loop: P of tile ``i_tile`` is ready and acc holds the tiles before
    it, rescaled for tile i. Q K^T of tile i + 1 and P V of tile i are issued back to back and
    run under the softmax of tile i + 1; once P V is done, the slot of tile i is released and
    acc rescaled for tile i + 1."""
    STAGES: gl.constexpr = cfg.STAGES
    PV_GROUPS: gl.constexpr = 2 if cfg.SPLIT_P else 1  # wgmma groups of one P V
    i_next = i_tile + 1
    b_zero = gl.zeros([ws.GROUP_ROWS, cfg.BLOCK_N], gl.float32, layout=s_layout)
    ws.wait_filled(st.k_bars, i_next, STAGES)
    b_s = warpgroup_mma(q_tile, st.k_ring.index(i_next % STAGES).permute((1, 0)), b_zero,
                        use_acc=False, is_async=True)
    ws.wait_filled(st.v_bars, i_tile, STAGES)
    b_acc = ws.issue_rounded_mma(b_p, st.v_ring.index(i_tile % STAGES), b_acc, cfg.SPLIT_P,
                                 p_layout)
    b_s = warpgroup_mma_wait(PV_GROUPS, deps=(b_s,))  # Q K^T done, P V may run on
    b_p, b_alpha, b_m, b_l = _softmax_p(b_s, b_m, b_l, i_next, st, cfg, m_start, s_layout)
    b_acc = warpgroup_mma_wait(0, deps=(b_acc,))
    mbarrier.arrive(st.free_bars.index(i_tile % STAGES), count=1)  # done with tile i
    b_acc = b_acc * gl.convert_layout(b_alpha, gl.SliceLayout(1, o_layout))[:, None]
    return b_acc, b_p, b_m, b_l


@gluon.jit
def issue_last_pv(i_tile, st, cfg, b_acc, b_p, o_layout: gl.constexpr,
                   p_layout: gl.constexpr):
    """P V of the loop's last tile ``i_tile``, issued (its wgmma in flight)."""
    ws.wait_filled(st.v_bars, i_tile, cfg.STAGES)
    return ws.issue_rounded_mma(b_p, st.v_ring.index(i_tile % cfg.STAGES), b_acc, cfg.SPLIT_P,
                                p_layout)


@gluon.jit
def last_pv(i_tile, st, cfg, b_acc, b_p, o_layout: gl.constexpr,
             p_layout: gl.constexpr):
    """P V of the loop's last tile ``i_tile``, nothing else in flight."""
    b_acc = issue_last_pv(i_tile, st, cfg, b_acc, b_p, o_layout, p_layout)
    return warpgroup_mma_wait(0, deps=(b_acc,))


@gluon.jit
def all_keys(q_tile, st, cfg, m_start, s_layout: gl.constexpr, o_layout: gl.constexpr,
             p_layout: gl.constexpr):
    """The key loop without ``KEY_CHUNK`` (also the Gluon decode's): the program's
    ``st.n_tiles`` key tiles from the empty state, each tile's P V issued with the next one's
    Q K^T. Returns (acc, m, l) in the accumulator's layouts; a program with no tile keeps the
    empty state (normalised to out 0, lse -inf)."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    b_acc = gl.zeros([ws.GROUP_ROWS, cfg.HEAD_DIM], gl.float32, layout=o_layout)
    b_m = gl.full([ws.GROUP_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_l = gl.zeros([ws.GROUP_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_p = gl.zeros([ws.GROUP_ROWS, cfg.BLOCK_N], gl.float32, layout=s_layout)
    if not cfg.SPLIT_P:
        b_p = b_p.to(st.v_ring.dtype)
    if st.n_tiles > 0:
        b_p, _, b_m, b_l = first_scores(q_tile, 0, st, cfg, m_start, b_m, b_l, s_layout)
    for i_tile in range(0, st.n_tiles - 1):
        b_acc, b_p, b_m, b_l = next_tile(q_tile, i_tile, st, cfg, m_start, b_acc, b_p, b_m, b_l,
                                          s_layout, o_layout, p_layout)
    if st.n_tiles > 0:
        b_acc = last_pv(st.n_tiles - 1, st, cfg, b_acc, b_p, o_layout, p_layout)
    b_l = gl.convert_layout(b_l, row_layout)
    b_m = gl.convert_layout(b_m, row_layout)
    return b_acc, b_m, b_l


@gluon.jit
def _chunk(q_tile, t_lo, t_hi, st, cfg, m_start, s_layout: gl.constexpr,
           o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Key tiles [t_lo, t_hi) (t_hi > t_lo) from the empty state, the last one's P V in
    flight: one chunk's (acc, m, l) in the accumulator's layouts; the caller waits for acc
    (``_chunk_done``)."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    b_acc = gl.zeros([ws.GROUP_ROWS, cfg.HEAD_DIM], gl.float32, layout=o_layout)
    b_m = gl.full([ws.GROUP_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_l = gl.zeros([ws.GROUP_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    b_p, _, b_m, b_l = first_scores(q_tile, t_lo, st, cfg, m_start, b_m, b_l, s_layout)
    for i_tile in range(t_lo, t_hi - 1):
        b_acc, b_p, b_m, b_l = next_tile(q_tile, i_tile, st, cfg, m_start, b_acc, b_p, b_m, b_l,
                                          s_layout, o_layout, p_layout)
    b_acc = issue_last_pv(t_hi - 1, st, cfg, b_acc, b_p, o_layout, p_layout)
    return b_acc, gl.convert_layout(b_m, row_layout), gl.convert_layout(b_l, row_layout)


@gluon.jit
def _chunk_done(t_hi, st, cfg, b_acc):
    """The chunk's acc once its last P V is done, the slot of its last tile released."""
    b_acc = warpgroup_mma_wait(0, deps=(b_acc,))
    mbarrier.arrive(st.free_bars.index((t_hi - 1) % cfg.STAGES), count=1)
    return b_acc


@gluon.jit
def _park(st, m_start, HEAD_DIM: gl.constexpr, layout: gl.constexpr):
    """Where a group's running accumulator is parked between chunk merges (``KEY_CHUNK``): its
    own rows of ``o32``, [64, HEAD_DIM] pointers of ``layout`` and the rows' mask."""
    o_q, o_d, o_rows, m_o = ws.tile_rows(m_start, st.bos_q, st.seqlen_q, ws.GROUP_ROWS, HEAD_DIM,
                                         layout)
    # An opaque copy of the rows, so that LLVM does not hoist the 64 pointers out of the chunk
    # loop (live through the key loop, they spilled).
    o_rows = gl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l", [o_rows], dtype=gl.int64,
                                       is_pure=False, pack=1)
    p_park = st.o32 + o_rows * st.stride_o32t + st.i_h.to(gl.int64) * st.stride_o32h
    return p_park + o_d[None, :], m_o


@gluon.jit
def _merge_chunk(t_lo, t_hi, c_acc, c_m, c_l, r_m, r_l, st, cfg, m_start,
                 o_layout: gl.constexpr):
    """Merge chunk [t_lo, t_hi) (its last P V in flight, ``_chunk``) into the running state:
    the parked acc loaded under that P V (none before the first chunk), then the merge.
    Returns the running (acc, m, l) and where its acc is parked."""
    p_park, m_park = _park(st, m_start, cfg.HEAD_DIM, o_layout)
    r_acc = gl.load(p_park, mask=m_park & (t_lo > 0), other=0.0)
    c_acc = _chunk_done(t_hi, st, cfg, c_acc)
    r_acc, r_m, r_l = merge_partial(r_acc, r_m, r_l, c_acc, c_m, c_l)
    return r_acc, r_m, r_l, p_park, m_park


@gluon.jit
def _chunked_keys(q_tile, st, cfg, m_start, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  p_layout: gl.constexpr):
    """The key loop with ``KEY_CHUNK`` (design §3.1): each chunk of tiles from the empty state
    (``_chunk``), merged in order into the running state, whose acc is parked in o32 between
    merges (a chunk's loop holds one accumulator). The slots' pipeline drains at each chunk
    end, where the merge runs with nothing else live. Returns the merged (acc, m, l)."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    CHUNK_TILES: gl.constexpr = cfg.KEY_CHUNK // cfg.BLOCK_N
    r_m = gl.full([ws.GROUP_ROWS], float("-inf"), gl.float32, layout=row_layout)
    r_l = gl.zeros([ws.GROUP_ROWS], gl.float32, layout=row_layout)
    for t_lo in range(0, st.n_tiles - CHUNK_TILES, CHUNK_TILES):  # all chunks but the last
        t_hi = t_lo + CHUNK_TILES
        c_acc, c_m, c_l = _chunk(q_tile, t_lo, t_hi, st, cfg, m_start, s_layout, o_layout,
                                 p_layout)
        r_acc, r_m, r_l, p_park, m_park = _merge_chunk(t_lo, t_hi, c_acc, c_m, c_l, r_m, r_l,
                                                       st, cfg, m_start, o_layout)
        gl.store(p_park, r_acc, mask=m_park)
    r_acc = gl.zeros([ws.GROUP_ROWS, cfg.HEAD_DIM], gl.float32, layout=o_layout)
    if st.n_tiles > 0:  # the last chunk, merged in registers (a tile-less program: none)
        t_lo = ((st.n_tiles - 1) // CHUNK_TILES) * CHUNK_TILES
        c_acc, c_m, c_l = _chunk(q_tile, t_lo, st.n_tiles, st, cfg, m_start, s_layout, o_layout,
                                 p_layout)
        r_acc, r_m, r_l, _, _ = _merge_chunk(t_lo, st.n_tiles, c_acc, c_m, c_l, r_m, r_l, st,
                                             cfg, m_start, o_layout)
    return r_acc, r_m, r_l


@gluon.jit
def _consume(GROUP: gl.constexpr, st, cfg):
    """Consumer warp group ``GROUP``: query rows [m_tile + 64 GROUP, + 64) of the program."""
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    BLOCK_N: gl.constexpr = cfg.BLOCK_N
    STAGES: gl.constexpr = cfg.STAGES
    # Scores [64, BLOCK_N] and output [64, HEAD_DIM] in wgmma accumulator layouts; P is the
    # register A operand of P V.
    s_layout: gl.constexpr = ws.acc_layout(BLOCK_N)
    o_layout: gl.constexpr = ws.acc_layout(HEAD_DIM)
    p_layout: gl.constexpr = ws.operand_layout(o_layout)
    m_start = st.m_tile + GROUP * ws.GROUP_ROWS
    if m_start >= st.seqlen_q:
        # Every row of this group lies past the sequence end (the last tile of a sequence of
        # 1-64 rows mod 128): nothing to compute or store. It still waits for the copy of its
        # Q tile, so that no copy into the CTA's shared memory is in flight when it exits,
        # and takes part in the ring. (V lands after K in each fill.)
        mbarrier.wait(st.q_bars.index(GROUP), 0)
        ws.skip_ring(st.v_bars, st.free_bars, st.n_tiles, STAGES)
        return
    q_tile = st.q_smem.index(GROUP)
    # In three groups (a 192-row tile) a causal group runs its own rows' key tiles
    # (``_group_keys``), then takes part in the ring for the program's rest (``ws.skip_ring``).
    OWN_KEYS: gl.constexpr = cfg.CAUSAL and cfg.BLOCK_M > 2 * ws.GROUP_ROWS
    keys = st
    if OWN_KEYS:
        keys = _group_keys(st, m_start, BLOCK_N)

    mbarrier.wait(st.q_bars.index(GROUP), 0)
    if cfg.KEY_CHUNK > 0:
        b_acc, b_m, b_l = _chunked_keys(q_tile, keys, cfg, m_start, s_layout, o_layout,
                                        p_layout)
    else:
        b_acc, b_m, b_l = all_keys(q_tile, keys, cfg, m_start, s_layout, o_layout, p_layout)
    if OWN_KEYS:
        ws.skip_ring(st.v_bars, st.free_bars, st.n_tiles, STAGES, keys.n_tiles)

    # Rows that saw no key: out 0, lse -inf (as attn_fwd_kernel).
    b_out, b_lse = normalize_rows(b_acc, b_m, b_l)  # [64, HEAD_DIM], [64]

    # out through the group's Q tile (free: its last Q K^T is done) and one TMA store, which
    # writes no row past the sequence's end (8 shared stores and a copy in place of 32
    # uncoalesced global stores a thread, perf-notes row 102).
    q_tile.store(b_out.to(st.o.dtype))
    fence_async_shared()
    ws.ragged_store(st.o, st.bos_q, st.seqlen_q, m_start, st.i_h, q_tile)
    o_q, o_d, o_rows, m_o = ws.tile_rows(m_start, st.bos_q, st.seqlen_q, ws.GROUP_ROWS, HEAD_DIM,
                                         o_layout)
    p_lse = st.lse + (st.bos_q + o_q.to(gl.int64)) * st.n_heads_q + st.i_h
    gl.store(p_lse, b_lse, mask=o_q < st.seqlen_q)
    if cfg.STORE_O32:
        p_o32 = (st.o32 + o_rows * st.stride_o32t + st.i_h.to(gl.int64) * st.stride_o32h
                 + o_d[None, :])
        gl.store(p_o32, b_out, mask=m_o)
    tma.store_wait(0)  # the copy has read the tile before the program ends


@gluon.jit
def _producer(st, cfg):
    """One warp: the groups' Q tiles, then K and V tiles into the ring as slots free up."""
    STAGES: gl.constexpr = cfg.STAGES
    for group in gl.static_range(cfg.BLOCK_M // ws.GROUP_ROWS):
        mbarrier.expect(st.q_bars.index(group), st.q_desc.block_type.nbytes)
        ws.ragged_load(st.q_desc, st.bos_q, st.seqlen_q, st.m_tile + group * ws.GROUP_ROWS,
                       st.i_h, st.q_bars.index(group), st.q_smem.index(group))
    for i_tile in range(st.n_tiles):
        slot = i_tile % STAGES
        ws.wait_free(st.free_bars, i_tile, STAGES)
        mbarrier.expect(st.k_bars.index(slot), st.k_desc.block_type.nbytes)
        ws.ragged_load(st.k_desc, st.bos_k, st.seqlen_k, i_tile * cfg.BLOCK_N, st.i_hk,
                       st.k_bars.index(slot), st.k_ring.index(slot))
        mbarrier.expect(st.v_bars.index(slot), st.v_desc.block_type.nbytes)
        ws.ragged_load(st.v_desc, st.bos_k, st.seqlen_k, i_tile * cfg.BLOCK_N, st.i_hk,
                       st.v_bars.index(slot), st.v_ring.index(slot))


@gluon.jit
def attn_fwd_ws_kernel(
    q, k, v, o, lse, o32,
    cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_o32t, stride_o32h,
    batch, n_heads_q, group, scale_log2,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SPLIT_P: gl.constexpr,
    STORE_O32: gl.constexpr,
    STAGES: gl.constexpr,
    KEY_CHUNK: gl.constexpr = 0,
):
    """One program per (query tile of one sequence, query head), as ``attn_fwd_kernel``;
    ``BLOCK_M`` = 128 or 192 (two or three consumer groups of 64 rows), ``STAGES`` K/V ring
    slots;
    ``KEY_CHUNK``: the key chunk (design §3.1), each chunk's tiles from the empty state merged
    into a running state in order, as ``primitives.forward_tile``'s (its accumulator parked in
    ``o32``'s rows between merges)."""
    GROUPS: gl.constexpr = BLOCK_M // ws.GROUP_ROWS
    gl.static_assert((GROUPS == 2 or GROUPS == 3) and BLOCK_M == GROUPS * ws.GROUP_ROWS)
    i_b, i_h, i_hk, bos_q, seqlen_q, bos_k, seqlen_k, m_tile = query_tile(
        cu_seqlens_q, cu_seqlens_k, batch, group, BLOCK_M, CAUSAL)
    if m_tile >= seqlen_q:
        return
    diag, t_full, n_tiles = ws.query_key_tiles(m_tile, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                               CAUSAL)

    # q, k, v: ragged host descriptors (``descriptors.py``); a Q tile per group.
    dtype: gl.constexpr = q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [GROUPS, ws.GROUP_ROWS, HEAD_DIM],
                                       ws.SWIZZLED_128B)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], ws.SWIZZLED_128B)
    q_bars = ws.barriers(GROUPS, 1)
    k_bars = ws.barriers(STAGES, 1)
    v_bars = ws.barriers(STAGES, 1)
    free_bars = ws.barriers(STAGES, GROUPS)  # one arrival per consumer group
    fence_async_shared()

    # The runtime state, assigned as the positional tuples were (``ws.specialize``).
    program = _Program(
        q_smem=q_smem, k_ring=k_ring, v_ring=v_ring, q_bars=q_bars, k_bars=k_bars,
        v_bars=v_bars, free_bars=free_bars, o=o, lse=lse, o32=o32,
        bos_q=bos_q, seqlen_q=seqlen_q, seqlen_k=seqlen_k, diag=diag, t_full=t_full,
        n_tiles=n_tiles, m_tile=m_tile, i_h=i_h, n_heads_q=n_heads_q, stride_ot=stride_ot,
        stride_oh=stride_oh, stride_o32t=stride_o32t, stride_o32h=stride_o32h,
        scale_log2=scale_log2, q_desc=q, k_desc=k, v_desc=v, bos_k=bos_k, i_hk=i_hk)
    ws.specialize(program, ws.Config(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, SPLIT_P, STAGES,
                                     STORE_O32=STORE_O32, KEY_CHUNK=KEY_CHUNK), _consume,
                  _producer, GROUPS)
