"""Plan, then launch: the host side of every kernel call, in three records.

* :class:`VarlenProblem`: one call, described once below the custom-op boundary (sizes, flags,
  the table entry) with the call's :class:`~portattn.options.AttentionOptions`.
  ``kernel="fixed_order"`` is decoded here, into ``split_p``, and nowhere else. A new parameter
  of the op travels in the options record, not in the launchers' argument lists.
* :class:`KernelLaunch`: one planned launch (stage, kernel, grid, arguments, compile-time
  parameters and options, whether it reads through tensor descriptors). The forward and
  backward planners (``forward.plan_forward``, ``backward.plan_backward``) return them with the
  buffers they write; the compile check compiles exactly these launches.
* :func:`run_launches`: the one executor. It owns the descriptor scratch and the launch-time
  value checks (``host_checks.checks_at_launch``).

Which kernel runs a stage, Triton's or the warp-specialised Gluon one, is decided by
:func:`gluon_applies` from the table entry alone plus the facts of the call (descriptor path,
interpreter); an entry that selects a Gluon kernel its tiles do not fit is an error, never a
quiet fallback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from portattn.configs import (
    HEAD_DIMS,
    KernelConfig,
    Tiles,
    interpreter_active,
    resolve_config,
)
from portattn.families import override_setting
from portattn.kernels.buffers import descriptor_scratch
from portattn.kernels.descriptors import HostDescriptor
from portattn.kernels.host_checks import checks_at_launch
from portattn.kernels.launcher import launch_kernel
from portattn.kernels.ptx_jit import launch_through_ptx
from portattn.options import AttentionOptions

LOG2E = 1.4426950408889634  # scores travel in log2 units: exp2 replaces exp in the kernels
SPLIT_P_KERNELS = {"varlen": False, "fixed_order": True}  # kernel name -> split-P products


def ceil_div(a: int, b: int) -> int:
    """``triton.cdiv`` for the planners' host ints: Triton's is a constexpr function, whose
    call costs more host time than the division (about 1.5 µs on a CPU, several per plan)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2`` for host ints >= 1 (same reason as :func:`ceil_div`)."""
    return 1 << (n - 1).bit_length()


def tile_heads(group: int, block_m: int) -> int:
    """Query heads of a GQA group of ``group`` packed into one decode tile of ``block_m`` rows
    (both decode kernels): the group rounded up to a power of two, at most the tile's rows;
    the tile then holds ``block_m // tile_heads`` query positions."""
    return min(next_pow2(group), block_m)


def decode_grid(rows_q: int, batch: int, n_heads_k: int, group: int, block_m: int,
                d_chunks: int = 1) -> tuple[int, int, int]:  # fmt: skip
    """The unsplit decode grid of both decode kernels: (position tiles x sequences, kv heads x
    the group's head slices, head-dim chunks); ``rows_q``: the query rows a sequence's tiles
    cover (its longest)."""
    heads = tile_heads(group, block_m)
    return (ceil_div(rows_q, block_m // heads) * batch, n_heads_k * ceil_div(group, heads),
            d_chunks)  # fmt: skip


def splits_p(kernel: str) -> bool:
    """Whether ``kernel`` is split-P (``fixed_order``): its forward can store a float32 copy of
    the output, and its backward computes the row term from it."""
    return SPLIT_P_KERNELS[kernel]


@dataclass(frozen=True)
class VarlenProblem:
    """One attention call over a packed batch, as the launchers see it.

    Shapes: q/k [total_q or total_k, Hq or Hkv, D], v [total_k, Hkv, Dv], cu_seqlens int32
    [batch + 1]. ``head_dim`` is q's and k's (D), ``head_dim_v`` v's and the output's (Dv;
    MLA: D 192, Dv 128); the table entry ``cfg`` is the row of the wider one."""

    total_q: int
    total_k: int
    n_heads_q: int
    n_heads_k: int
    head_dim: int
    batch: int
    max_seqlen_q: int
    max_seqlen_k: int
    options: AttentionOptions  # the call's options, as ``options.check_options`` made them
    dtype: torch.dtype
    device: torch.device
    cfg: KernelConfig
    interpret: bool  # the CPU interpreter runs the kernels (no Gluon, BLAS-free products)
    # Paged K/V ([num_pages, page_size, Hkv, D] with a block table): the page size, else 0.
    page_size: int = 0
    # v's head dim (and the output's, dO's, dV's), or 0: q's (``head_dim``). Set through
    # ``plan_problem``; read as ``value_dim``.
    head_dim_v: int = 0

    @functools.cached_property
    def block_d(self) -> int:
        """The head dim padded for the kernels' blocks: the next power of two, at least 16 (the
        matrix instructions' smallest K); the columns past ``head_dim`` are masked."""
        return max(16, next_pow2(self.head_dim))

    @property
    def value_dim(self) -> int:
        """v's head dim (Dv): ``head_dim_v``, or ``head_dim`` where v has q's."""
        return self.head_dim_v or self.head_dim

    @functools.cached_property
    def block_dv(self) -> int:
        """The value head dim padded as ``block_d`` pads q's: the width of the kernels' V, O,
        dO and dV blocks (``block_d`` where Dv == D)."""
        return max(16, next_pow2(self.value_dim))

    @property
    def split_dv(self) -> bool:
        """Whether v's head dim differs from q's (only the Triton kernels have it)."""
        return self.value_dim != self.head_dim

    def value_flags(self) -> dict[str, int]:
        """The compile-time value width of the Triton kernels that read V or dO, next to
        ``HEAD_DIM`` / ``BLOCK_D`` (equal to them where Dv == D)."""
        return dict(HEAD_DIM_V=self.value_dim, BLOCK_DV=self.block_dv)

    # The options' fields, read as the problem's own by the planners and launchers.
    @property
    def causal(self) -> bool:
        return self.options.causal

    @property
    def softmax_scale(self) -> float:
        return self.options.softmax_scale

    @property
    def split_p(self) -> bool:
        return splits_p(self.options.kernel)

    def feature_flags(self) -> dict[str, Any]:
        """The compile-time parameters of the optional features, for every Triton kernel that
        computes scores (``AttentionOptions.kernel_flags``)."""
        return self.options.kernel_flags()

    def chunk_flags(self) -> dict[str, int]:
        """The key chunk of the entry (design §3.1) for the forward and decode kernels, or
        nothing (the kernels' default, so their launches are those from before it) at 0 and
        where no sequence has more than one chunk of keys (``max_seqlen_k`` at most C): a row
        of one chunk has the unchunked loop's bits, so such a call runs the kernels without
        the chunk merge (the entry's machine code without a chunk: no second accumulator)."""
        chunk = self.cfg.key_chunk
        return {"KEY_CHUNK": chunk} if chunk and self.max_seqlen_k > chunk else {}

    @property
    def has_unseen_keys(self) -> bool:
        """Whether a visited key tile can hold keys that some of its rows do not see, so that
        the passes need their repair launch (design §3.2): causal with more than one query
        row in a sequence, or a sliding window."""
        return (self.causal and self.max_seqlen_q > 1) or self.options.windowed

    @property
    def grid_rows_q(self) -> int:
        """The query rows a launch grid is sized for: ``max_seqlen_q`` (flash-attn's upper
        bound, which also picks the decode kernel, ``decode.decode_fits``), but no more than q
        has (tiles past a sequence's end exit at once: the same bits; 2**31 - 1 over a few
        tokens made 2**27 programs per sequence)."""
        return min(self.max_seqlen_q, self.total_q)

    @property
    def grid_rows_k(self) -> int:
        """As ``grid_rows_q`` for keys: no more than packed k has (a paged sequence may reuse
        pages, so its bound stays ``max_seqlen_k``)."""
        return self.max_seqlen_k if self.page_size else min(self.max_seqlen_k, self.total_k)

    @property
    def group(self) -> int:
        """Query heads per kv head (GQA)."""
        return self.n_heads_q // self.n_heads_k

    @property
    def scale_log2(self) -> float:
        return self.softmax_scale * LOG2E

    @functools.cached_property
    def memo(self) -> dict[tuple, Any]:
        """What the planners derive from this problem alone (grids, compile-time parameters,
        never a tensor), by their own keys: :func:`plan_problem` hands out one problem per
        signature, so a decode loop derives them once. A problem made otherwise (a test's,
        ``dataclasses.replace``) starts with an empty memo."""
        return {}


def plan_problem(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    options: AttentionOptions,
    cfg: KernelConfig | None = None,
    block_table: torch.Tensor | None = None,
    head_dim_v: int | None = None,
) -> VarlenProblem:
    """The problem of one call with its checked ``options`` (``cfg``: the table entry, looked
    up for q's device if None). With ``block_table``, k is a paged cache [num_pages,
    page_size, Hkv, D]. ``head_dim_v``: v's head dim (None: q's). The entry is the table row of
    the wider of the two head dims (``configs.resolve_config``, ``configs.pair_config``)."""
    total_q, n_heads_q, head_dim = q.shape
    value_dim = head_dim if head_dim_v is None else head_dim_v
    paged = block_table is not None
    key = None
    if cfg is None:
        cfg = resolve_config(q.device, options.kernel, head_dim, q.dtype, head_dim_v=value_dim)
        # One problem per signature (not with sinks: a tensor, which options carry; not with
        # symbolic sizes): the same call again finds it with its memo.
        if options.sinks is None and type(max_seqlen_q) is int and type(max_seqlen_k) is int:
            key = (q.shape, k.shape, paged, cu_seqlens_q.shape, max_seqlen_q, max_seqlen_k)
            key += (options, value_dim, q.dtype, q.device, cfg, interpreter_active())
            problem = _PROBLEMS.get(key)
            if problem is not None:
                return problem
    problem = VarlenProblem(
        total_q=total_q,
        total_k=k.shape[0] * k.shape[1] if paged else k.shape[0],
        n_heads_q=n_heads_q,
        n_heads_k=k.shape[-2],
        head_dim=head_dim,
        batch=cu_seqlens_q.numel() - 1,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        options=options,
        dtype=q.dtype,
        device=q.device,
        cfg=cfg,
        interpret=interpreter_active(),
        page_size=k.shape[1] if paged else 0,
        head_dim_v=0 if value_dim == head_dim else value_dim,
    )
    if key is not None:
        if len(_PROBLEMS) >= _PROBLEMS_MAX:  # a training run's many packs: start again
            _PROBLEMS.clear()
        _PROBLEMS[key] = problem
    return problem


# plan_problem's problems by signature: the shapes, sizes, options, dtype, device, the table
# entry (looked up every call, so a changed table or family override is a new key) and the
# interpreter setting. Holds no tensor.
_PROBLEMS: dict[tuple, VarlenProblem] = {}
_PROBLEMS_MAX = 1024


_forgotten = 0  # calls of forget_problems so far


def forget_problems() -> None:
    """Drop every problem :func:`plan_problem` keeps (and so their memos): the next call of
    each signature plans from scratch (and so do the entry points that keep a problem's
    launches under their own signatures: they compare :func:`problems_forgotten`)."""
    global _forgotten
    _PROBLEMS.clear()
    _forgotten += 1


def problems_forgotten() -> int:
    """How many times :func:`forget_problems` has run."""
    return _forgotten


@functools.cache
def repair_tiles(tiles: Tiles) -> Tiles:
    """The tiles of a repair pass (design §3.2) after a pass of ``tiles``: the same, in one
    stage (no bit depends on the stages). ``mma_visible``'s second product spills registers
    at some entries (sm90 d128): accepted, as the pass computes only tiles that hold a NaN or
    an infinity."""
    return dataclasses.replace(tiles, num_stages=1)


@dataclass(frozen=True)
class KernelLaunch:
    """One planned launch: ``kernel[grid](*args, **params)``. ``params`` holds the
    compile-time parameters and the launch options; ``tma``: the kernel makes tensor
    descriptors, so it needs their scratch memory; ``descriptors``: the tensors of ``args``
    that the kernel takes as ragged host descriptors (``descriptors.HostDescriptor``: their
    positions and tiles; ``descriptors.with_descriptors``, applied at the launch)."""

    stage: str  # the KernelConfig field of its tiles: fwd, bwd_pre, bwd_dkdv, bwd_dq, decode;
    # a repair pass (design §3.2) is its pass's stage + "_repair"
    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    params: dict[str, Any] = field(default_factory=dict)
    tma: bool = False
    # Bound from a kept template (forward_replay.LaunchTemplate): the template's cell, where
    # the launcher keeps the direct launch of its binds (kernels/launcher.py); else None.
    direct: list | None = field(default=None, compare=False, repr=False)
    descriptors: tuple[HostDescriptor, ...] = ()


def run_launches(
    launches: Sequence[KernelLaunch],
    device: torch.device,
    before_launch: Callable[[], object] | None = None,
) -> None:
    """Launch in order. ``before_launch``: checks that need a host copy (they may raise), run
    right before the first launch, or at the end when nothing is launched."""
    override = _override_arch(device)
    tma = any(launch.tma for launch in launches)
    if before_launch is None and not tma and override is None:  # a decode step: no set-up
        for launch in launches:
            launch_kernel(launch)
        return
    checks = contextlib.nullcontext() if before_launch is None else checks_at_launch(before_launch)
    # One descriptor allocator for the sequence: Triton asks it only for kernels with scratch.
    with checks, descriptor_scratch(device, tma):
        for launch in launches:
            if override is None:
                launch_kernel(launch)  # kernel[grid](*args, **params), with less host work
            else:  # an older NVIDIA family's entries, as its PTX (family override)
                launch_through_ptx(launch, override)


def _override_arch(device: torch.device) -> int | None:
    """The compute capability whose PTX the launches run as (``$PORTATTN_FAMILY_OVERRIDE``),
    or None: no override, a CPU tensor, or the interpreter (where a value that names no NVIDIA
    family still raises, ``families.check_override_name``)."""
    if not override_setting():  # unset (read once a process): nothing to check or run as
        return None
    from portattn.families import FAMILIES, check_override_name, family_override

    if device.type != "cuda" or interpreter_active():
        check_override_name()
        return None

    name = family_override(device)
    return None if name is None else int(FAMILIES[name].arch)


def gluon_applies(
    name: str,
    selected: bool,
    gluon_kernel: Any,
    supports: Callable[[Tiles, int], bool] | None,
    tiles: Tiles,
    problem: VarlenProblem,
    tma: bool,
) -> bool:
    """Whether the warp-specialised Gluon kernel of a stage runs, for the table field ``name``
    (``fwd_ws``, ``bwd_ws``, ``dq_ws``): the entry selects it, the inputs take the descriptor
    path (``tma``), the interpreter is off (it has no Gluon), no optional feature is on
    (``AttentionOptions.any_feature``), v has q's head dim and the head dim is a table row's.
    Either kernel gives the same bits. An entry that selects it where Gluon is missing or its
    tiles do not fit raises."""
    if not selected or not tma or problem.interpret:
        return False
    if problem.split_dv:  # the Gluon kernels have one head dim for Q, K and V: a call with
        return False  # its own value head dim runs the Triton kernels at the entry's tiles
    if problem.options.any_feature:  # no optional feature is in the Gluon kernels;
        return False  # the Triton ones, at the same tiles, have them
    if problem.head_dim not in HEAD_DIMS:  # the Gluon kernels are written for the table's
        return False
    if gluon_kernel is None or supports is None:
        raise RuntimeError(
            f"the configuration entry sets {name}, but this Triton has no usable Gluon "
            "(the warp-specialised kernels need Triton's Gluon Hopper API)"
        )
    if not supports(tiles, problem.head_dim):
        raise ValueError(
            f"the configuration entry sets {name}, but its kernel is not written for tiles "
            f"{tiles} at head dim {problem.head_dim}"
        )
    return True
