"""The backward's launches, planned on the host: the gradients and scratch buffers, and which
kernel computes each stage (delta preprocess, dK/dV in one or two passes, dQ) with which tiles,
constexprs and grid; the Triton kernels themselves are ``backward.py``'s (passed in as
:class:`BackwardKernels`), the Gluon ones ``ws_kernels``'.

Host code only, kept apart from ``backward.py`` so that file holds the kernels: Triton's cache
key of a ``@triton.jit`` function includes the line it starts on, so the kernels' lines there
never move (CI's ``python -m ci.golden_dev keycheck`` compares the compile keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from portattn.kernels import descriptors
from portattn.kernels.buffers import check_row_strides, dense_specialized, new_buffer, rows_aligned
from portattn.kernels.descriptors import HostDescriptor, ragged_arguments
from portattn.kernels.plan import (
    KernelLaunch,
    VarlenProblem,
    ceil_div,
    gluon_applies,
    repair_tiles,
)
from portattn.kernels.ws_kernels import (
    attn_bwd_dkdv_ws_kernel,
    attn_bwd_dq_ws_kernel,
    dkdv_ws_supports,
    dq_ws_supports,
    ws_launch_options,
)


class BackwardKernels(NamedTuple):
    """The backward's Triton kernels (``backward.BACKWARD_KERNELS``)."""

    preprocess: object  # delta = rowsum(O * dO) - dlse, and lse in log2 units
    dkdv: object  # dK / dV per key tile
    dq: object  # dQ per query tile


def use_warp_specialized_dkdv(problem: VarlenProblem, tma: bool) -> bool:
    """Whether dK/dV run as the warp-specialised Gluon kernel (``backward_ws.py``), in one
    pass (``plan.gluon_applies``)."""
    cfg = problem.cfg  # bwd_ws implies dkdv_passes == 1 (checked when the entry is made)
    return gluon_applies(
        "bwd_ws", cfg.bwd_ws, attn_bwd_dkdv_ws_kernel, dkdv_ws_supports, cfg.bwd_dkdv, problem, tma
    )


def use_warp_specialized_dq(problem: VarlenProblem, tma: bool) -> bool:
    """Whether dQ runs as the warp-specialised Gluon kernel (``dq_ws.py``;
    ``plan.gluon_applies``)."""
    cfg = problem.cfg
    return gluon_applies(
        "dq_ws", cfg.dq_ws, attn_bwd_dq_ws_kernel, dq_ws_supports, cfg.bwd_dq, problem, tma
    )


@dataclass(frozen=True)
class BackwardPlan:
    """The gradients (dq [total_q, Hq, D], dk [total_k, Hkv, D], dv [total_k, Hkv, Dv], input
    dtype) and the launches that write them, in order: preprocess, dK/dV (one or two
    launches), dQ."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    launches: tuple[KernelLaunch, ...]
    # The preprocess kernel's lse2 and delta (float32 [Hq, stride_hm]), None where nothing
    # launches: scratch the launches share, which a replay allocates again (backward_replay)
    lse2: torch.Tensor | None = None
    delta: torch.Tensor | None = None


class _Stage(NamedTuple):
    """One launch of the backward without its arguments: what depends on the problem alone
    (kept in its memo); ``reads``: which argument tuple it takes (``pre``, ``dkdv``, ``dq``)."""

    stage: str
    kernel: object
    grid: tuple
    params: dict
    tma: bool
    reads: str
    descriptors: tuple[HostDescriptor, ...] = ()  # as KernelLaunch's


def plan_backward_launches(kernels: BackwardKernels, problem: VarlenProblem, do, q, k, v,
                           o_for_delta, lse, dlse, cu_seqlens_q, cu_seqlens_k) -> BackwardPlan:
    """Allocate the gradients and the scratch (lse2, delta) and plan the backward's launches
    of ``kernels`` (and the Gluon ones where they apply).

    do, o_for_delta: [total_q, Hq, Dv] (any strides with stride(-1) == 1; o_for_delta is the
    forward output, or its float32 copy for split-P); lse: float32 [total_q, Hq];
    dlse: float32 [total_q, Hq] or None.
    """
    p, cfg = problem, problem.cfg
    dq = new_buffer(q.shape, q.dtype, q.device)
    dk = new_buffer(k.shape, k.dtype, k.device)
    dv = new_buffer(v.shape, v.dtype, v.device)
    if p.batch == 0 or (p.total_q == 0 and p.total_k == 0):
        return BackwardPlan(dq, dk, dv, ())
    # The preprocess kernel sums delta = rowsum(O * dO) in the register layout that the
    # compiler derives from the loads' vector width, that is from how it specialized the O and
    # dO arguments: a misaligned dO (or one with strides not divisible by 16) was summed in
    # another order, with other bits (fixed_order on the H200; its O is float32). Such tensors
    # are copied densely first, so the bits never depend on the inputs' memory layout.
    do, o_for_delta = dense_specialized(do), dense_specialized(o_for_delta)
    check_row_strides(q, k, v)  # the kernels' row_strides (do and o: dense_specialized)
    aligned = bool(cfg.tma) and rows_aligned(q, k, v, do)
    # The dK/dV kernel also stores dK and dV through descriptors (dense buffers: always aligned
    # for the supported head dims, checked so that the condition stays explicit).
    tma_dkdv = aligned and "bwd_dkdv" in cfg.tma and rows_aligned(dk, dv)
    tma_dq = aligned and "bwd_dq" in cfg.tma
    # Written by the preprocess kernel, head-major: [Hq, stride_hm]. For dK/dV's descriptors
    # every sequence starts 16-byte aligned (``head_major_start``); the padding is never read.
    padded = tma_dkdv
    stride_hm = ceil_div(p.total_q, 4) * 4 + 4 * p.batch if padded else p.total_q
    lse2 = new_buffer((p.n_heads_q, stride_hm), torch.float32, q.device)
    delta = new_buffer((p.n_heads_q, stride_hm), torch.float32, q.device)
    key = ("bwd", kernels, tma_dkdv, tma_dq, dlse is not None)  # padded is tma_dkdv
    stages = p.memo.get(key)
    if stages is None:  # grids, kernels and compile-time parameters: the problem's alone
        stages = p.memo[key] = _backward_stages(kernels, p, tma_dkdv, tma_dq, dlse is not None)
    args = {}
    if p.total_q > 0:
        dlse_arg = dlse if dlse is not None else lse
        args["pre"] = (
            o_for_delta, do, lse, dlse_arg, lse2, delta, cu_seqlens_q,
            o_for_delta.stride(0), o_for_delta.stride(1), do.stride(0), do.stride(1),
            dlse_arg.stride(0), dlse_arg.stride(1),
            p.batch, p.n_heads_q, stride_hm,
        )
        args["dq"] = (
            q, k, v, do, lse2, delta, dq, cu_seqlens_q, cu_seqlens_k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
            p.batch, stride_hm, p.group, p.softmax_scale, p.scale_log2,
        )
    if p.total_k > 0:
        args["dkdv"] = (
            q, k, v, do, lse2, delta, dk, dv, cu_seqlens_q, cu_seqlens_k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            p.batch, stride_hm, p.group, p.softmax_scale, p.scale_log2,
        )
    launches = tuple(
        KernelLaunch(st.stage, st.kernel, st.grid, args[st.reads], dict(st.params), st.tma,
                     descriptors=st.descriptors)
        for st in stages
    )
    return BackwardPlan(dq, dk, dv, launches, lse2, delta)


def _backward_stages(kernels: BackwardKernels, p: VarlenProblem, tma_dkdv: bool, tma_dq: bool,
                     has_dlse: bool) -> tuple[_Stage, ...]:
    """The backward's launches in order, without their arguments: preprocess, dK/dV (and
    their repairs), dQ (and its repair); none on a side with no rows (no query rows: no
    preprocess and no dQ; no keys: no dK/dV)."""
    cfg, padded = p.cfg, tma_dkdv
    common = dict(HEAD_DIM=p.head_dim, BLOCK_D=p.block_d, **p.value_flags())
    kernel_flags = dict(CAUSAL=p.causal, SPLIT_P=p.split_p, INTERPRET=p.interpret,
                        **p.feature_flags())
    stages = _plan_dkdv(kernels, p, common, kernel_flags, tma_dkdv) if p.total_k > 0 else []
    if p.total_q == 0:
        return tuple(stages)
    pre = cfg.bwd_pre
    # delta = rowsum(O * dO) over v's head dim (O and dO have it)
    params = dict(BLOCK_M=pre.block_m, HAS_DLSE=has_dlse, PADDED=padded,
                  HEAD_DIM=p.value_dim, BLOCK_D=p.block_dv, **pre.launch_kwargs())
    grid = (ceil_div(p.grid_rows_q, pre.block_m) * p.batch, p.n_heads_q)
    stages.insert(0, _Stage("bwd_pre", kernels.preprocess, grid, params, False, "pre"))
    t = cfg.bwd_dq
    grid = (ceil_div(p.grid_rows_q, t.block_m) * p.batch, p.n_heads_q)
    if use_warp_specialized_dq(p, tma_dq):
        params = dict(HEAD_DIM=p.head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                      CAUSAL=p.causal, SPLIT_P=p.split_p, PADDED=padded,
                      STAGES=t.num_stages, **ws_launch_options(t))
        # q, k, v and do go as ragged descriptors, q and do by the groups' tiles: the kernel
        # makes none
        rows = t.block_m // 2
        reads = ragged_arguments(attn_bwd_dq_ws_kernel, q=rows, k=t.block_n, v=t.block_n,
                                 do=rows)  # fmt: skip
        stages.append(_Stage("bwd_dq", attn_bwd_dq_ws_kernel, grid, params, False, "dq", reads))
    else:
        params = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, TMA=tma_dq, PADDED=padded,
                      **common, **kernel_flags, **t.launch_kwargs())
        stages.append(_Stage("bwd_dq", kernels.dq, grid, params, tma_dq, "dq"))
    if p.has_unseen_keys:  # design §3.2: the Triton kernel of the same key tiles
        t = repair_tiles(t)
        grid = (ceil_div(p.grid_rows_q, t.block_m) * p.batch, 1)  # a program: every head
        params = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, TMA=tma_dq, PADDED=padded,
                      REPAIR=cfg.repair_products, N_HEADS_Q=p.n_heads_q, **common,
                      **kernel_flags, **t.launch_kwargs())
        stages.append(_Stage("bwd_dq_repair", kernels.dq, grid, params, tma_dq, "dq"))
    return tuple(stages)


def _plan_dkdv(kernels: BackwardKernels, p: VarlenProblem, common: dict,
               kernel_flags: dict, tma: bool) -> list[_Stage]:
    """The dK/dV launches. dkdv_passes 1: one launch for dK and dV; 2: dV, then dK; 4: as 2,
    each launch with two programs per key tile (half of the head dim each)."""
    cfg = p.cfg
    if cfg.dkdv_passes == 1:
        passes = [(True, True, 1)]
    else:
        chunks = cfg.dkdv_passes // 2
        passes = [(False, True, chunks), (True, False, chunks)]
    launches = []
    for want_dk, want_dv, chunks in passes:
        t = cfg.dkdv_launch_tiles(want_dk)
        grid = (ceil_div(p.grid_rows_k, t.block_n) * p.batch, p.n_heads_k, chunks)
        repair = []
        # Design §3.2: after this pass, its repair, one gradient per launch (mma_visible keeps
        # two accumulators per gradient: four did not fit sm100's tensor memory, the kernel
        # compiled to a trap)
        for repair_dk, repair_dv in ((False, want_dv), (want_dk, False)):
            if not p.has_unseen_keys or not (repair_dk or repair_dv):
                continue
            r = repair_tiles(t)  # the pass's tiles: dV's bits depend on its BLOCK_M
            r_grid = (ceil_div(p.grid_rows_k, r.block_n) * p.batch, p.n_heads_k, chunks)
            params = dict(BLOCK_M=r.block_m, BLOCK_N=r.block_n, WANT_DK=repair_dk,
                          WANT_DV=repair_dv, D_CHUNKS=chunks, TMA=tma,
                          REPAIR=cfg.repair_products, **common, **kernel_flags,
                          **r.launch_kwargs())
            repair.append(_Stage("bwd_dkdv_repair", kernels.dkdv, r_grid, params, tma, "dkdv"))
        if use_warp_specialized_dkdv(p, tma):
            params = dict(HEAD_DIM=p.head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                          CAUSAL=p.causal, SPLIT_P=p.split_p, STAGES=t.num_stages,
                          **ws_launch_options(t))
            # q, k, v, do as ragged descriptors, K and V by the groups' tiles; the kernel
            # makes those of lse2 and delta
            m, g = t.block_m, t.block_n // 2
            reads = ragged_arguments(attn_bwd_dkdv_ws_kernel, q=m, k=g, v=g, do=m)
            launches.append(_Stage("bwd_dkdv", attn_bwd_dkdv_ws_kernel, grid[:2], params, tma,
                                   "dkdv", reads))
            launches += repair
            continue
        # q, k, v, do, dk and dv as the launch's ragged descriptors where one program has all
        # columns (TMA_HOST); lse2 and delta through the program's own (so scratch, tma)
        host = tma and chunks == 1
        reads = ragged_arguments(
            kernels.dkdv, q=(t.block_m, p.block_d), k=(t.block_n, p.block_d),
            v=(t.block_n, p.block_dv), do=(t.block_m, p.block_dv), dk=(t.block_n, p.block_d),
            dv=(t.block_n, p.block_dv),
        ) if host else ()  # fmt: skip
        params = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, WANT_DK=want_dk, WANT_DV=want_dv,
                      D_CHUNKS=chunks, TMA=descriptors.TMA_HOST if host else tma, **common,
                      **kernel_flags, **t.launch_kwargs())
        launches.append(_Stage("bwd_dkdv", kernels.dkdv, grid, params, tma, "dkdv", reads))
        launches += repair
    return launches
