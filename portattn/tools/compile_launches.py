"""The launches the compile check compiles: the configuration-table entries, and per entry the
kernel launches the real planners make for a representative call on CPU tensors (nothing is
launched), for the compiling and checking of :mod:`portattn.tools.compilecheck`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from portattn.configs import (
    DTYPES,
    HEAD_DIMS,
    KERNELS,
    KernelConfig,
    config_table,
    entry_config,
    table_head_dim,
)
from portattn.families import FAMILIES
from portattn.kernels.descriptors import HostDescriptor, with_descriptors
from portattn.validation import check_head_dims

# KernelConfig fields, one kernel each; "decode" is the paged decode kernel (its tiles:
# KernelConfig.decode_tiles).
STAGES = ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "decode")
# The repair passes of the representative (causal) call (design §3.2): compile-checked, not in
# golden/ (they write only tiles that hold a NaN or an infinity, which no golden case has; and
# Triton 3.9's AMD backend orders a few integer instructions of cdna2's varlen/d32 fwd_repair
# differently in about one fresh process of six, so its fingerprint is not a fixed value).
REPAIR_STAGES = ("fwd_repair", "bwd_dkdv_repair", "bwd_dq_repair")
# The chunk merge of an entry with a key chunk C (design §3.1), for sequences of 2 C keys: the
# forward's and the (unsplit, large-grid) decode's chunk loops, and the split decode's two
# launches (the chunks' partials, then their combine). Recorded in golden/ and checked where
# the entry has a chunk (``entry_stages``); an entry without one launches none of them.
SPLIT_STAGES = ("decode_split", "decode_combine")
CHUNK_STAGES = ("fwd_chunked", "decode_chunked", *SPLIT_STAGES)
GUARDED_STAGES = STAGES + CHUNK_STAGES  # what golden/ records, of the stages an entry launches
CHECKED_STAGES = GUARDED_STAGES + REPAIR_STAGES
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPE_ALIASES = {"fp16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
# The warp-specialised Gluon kernels: launched with ``ws_launch_options``, not the tiles' own.
WS_KERNELS = ("attn_fwd_ws_kernel", "attn_bwd_dkdv_ws_kernel", "attn_bwd_dq_ws_kernel")

# The representative launch whose specialisation is compiled: contiguous packed tensors, GQA
# (a query-head group of 4 is a runtime loop bound; MHA's group of 1 would be a constexpr).
REPRESENTATIVE = {"batch": 2, "seqlen": 256, "heads_q": 16, "heads_k": 4, "causal": True}
# The decode stage's launch: one query row per sequence of the representative batch against a
# paged cache of this page size (a constexpr of the decode kernel).
DECODE_PAGE_SIZE = 64


def entry_stages(cfg: KernelConfig, stages: Iterable[str]) -> tuple[str, ...]:
    """The stages of ``stages`` that an entry of configuration ``cfg`` launches: the chunk
    merge's (:data:`CHUNK_STAGES`) only with a key chunk."""
    return tuple(s for s in stages if cfg.key_chunk or s not in CHUNK_STAGES)


@dataclass(frozen=True)
class Entry:
    """One configuration-table entry (family, kernel, head_dim, dtype name); ``head_dim_v``:
    v's own head dim (0: q's), for a call with one (the entry of the wider head dim)."""

    family: str
    kernel: str
    head_dim: int
    dtype: str
    head_dim_v: int = 0

    @property
    def value_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def label(self) -> str:
        dims = f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v else "")
        return f"{self.kernel}/{dims}/{self.dtype}"

    def torch_dtype(self) -> torch.dtype:
        return {v: k for k, v in DTYPE_NAMES.items()}[self.dtype]

    def table_key(self) -> tuple[str, str, int, torch.dtype]:
        """Its key in the table: a borrowed head dim runs the next row up."""
        row = table_head_dim(max(self.head_dim, self.value_dim))
        return (self.family, self.kernel, row, self.torch_dtype())

    def config(self) -> KernelConfig:
        """The entry it runs: its row, with a pair's or a borrowed head dim's own tiles
        (``configs.entry_config``)."""
        dim_v = None if self.value_dim == self.head_dim else self.value_dim
        return entry_config(self.family, self.kernel, self.head_dim, self.torch_dtype(), dim_v)


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the jit function, its bound arguments and launch options."""

    stage: str
    fn: Any
    args: dict[str, Any]
    options: dict[str, Any]


@contextlib.contextmanager
def unset_env(names: Iterable[str]) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def compiler_env() -> dict[str, str]:
    """The environment of a child process that needs Triton's compiler when this one runs the
    interpreter: without ``TRITON_INTERPRET``, this checkout first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    package_root = str(Path(__file__).resolve().parents[2])  # the checkout (portattn/tools/..)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def bind_launch(
    stage: str, fn: Any, args: tuple, params: dict, descriptors: tuple[HostDescriptor, ...] = ()
) -> Launch:
    """Split a planned launch's parameters into bound kernel arguments and launch options;
    ``descriptors``: the tensors of ``args`` the kernel takes as ragged descriptors, as
    launched (``KernelLaunch.descriptors``)."""
    kernel_params = {k: v for k, v in params.items() if k in fn.arg_names}
    options = {k: v for k, v in params.items() if k not in fn.arg_names}
    args = with_descriptors(args, descriptors)
    bound = inspect.signature(fn.fn).bind(*args, **kernel_params)  # jit and interpreted fns
    bound.apply_defaults()
    return Launch(stage, fn, dict(bound.arguments), options)


def record_launches(entry: Entry, cfg: KernelConfig | None = None) -> dict[str, tuple[Launch, ...]]:
    """The kernel launches the real planners (``plan_forward`` / ``plan_backward``) make for
    ``entry``'s configuration (or ``cfg``) on CPU tensors of the representative launch, per
    stage in launch order: one each, except dK/dV with ``dkdv_passes`` > 1 (a dV launch, then
    a dK launch). With a key chunk C the representative call has at most C keys a sequence
    (the kernels without the chunk merge, ``VarlenProblem.chunk_flags``), and calls of 2 C
    keys add the chunk merge's launches (:data:`CHUNK_STAGES`). Nothing is launched."""
    cfg = cfg or entry.config()
    chunk, seq = cfg.key_chunk, REPRESENTATIVE["seqlen"]
    if chunk:
        seq = min(seq, chunk)
    # The launches a GPU run makes: the planners choose some kernels by whether the CPU
    # interpreter is on (the pytest harness sets it), so it is off while planning.
    with unset_env(["TRITON_INTERPRET"]):
        planned = [*_plan_pack(entry, cfg, seq, True), *_plan_paged_decode(entry, cfg, seq, 1)]
        if chunk:  # sequences of two chunks: the forward's and the decode's chunk merges
            fwd = [x for x in _plan_pack(entry, cfg, 2 * chunk, False) if x.stage == "fwd"]
            merged = _plan_paged_decode(entry, cfg, 2 * chunk, _unsplit_rows(cfg))
            unsplit = [x for x in merged if x.stage == "decode"]
            split = _plan_paged_decode(entry, cfg, 2 * chunk, 1)
            planned += [dataclasses.replace(x, stage=f"{x.stage}_chunked") for x in fwd + unsplit]
            planned += [x for x in split if x.stage in SPLIT_STAGES]
    launches: dict[str, tuple[Launch, ...]] = {}
    for one in planned:
        launch = bind_launch(one.stage, one.kernel, one.args, one.params, one.descriptors)
        launches[launch.stage] = (*launches.get(launch.stage, ()), launch)
    missing = set(entry_stages(cfg, GUARDED_STAGES)) - set(launches)
    if missing:
        raise RuntimeError(f"planners did not launch {sorted(missing)}")
    return launches


def _plan_pack(entry: Entry, cfg: KernelConfig, seqlen: int, backward: bool) -> list:
    """The planned launches of a causal forward (and ``backward``) of the representative batch,
    ``seqlen`` tokens a sequence, packed."""
    from portattn.kernels.backward import plan_backward
    from portattn.kernels.forward import plan_forward
    from portattn.kernels.plan import plan_problem, splits_p
    from portattn.options import AttentionOptions

    rep, dim, dim_v, dtype = REPRESENTATIVE, entry.head_dim, entry.value_dim, entry.torch_dtype()
    n_tok = rep["batch"] * seqlen
    q, do = (torch.zeros(n_tok, rep["heads_q"], d, dtype=dtype) for d in (dim, dim_v))
    k, v = (torch.zeros(n_tok, rep["heads_k"], d, dtype=dtype) for d in (dim, dim_v))
    cu = torch.arange(rep["batch"] + 1, dtype=torch.int32) * seqlen
    split_p = splits_p(entry.kernel)
    options = AttentionOptions(causal=rep["causal"], softmax_scale=dim**-0.5, kernel=entry.kernel)
    problem = plan_problem(q, k, cu, seqlen, seqlen, options, cfg, head_dim_v=dim_v)
    fwd = plan_forward(problem, q, k, v, cu, cu, store_o32=split_p)
    if not backward:
        return list(fwd.launches)
    o_for_delta = fwd.out32 if split_p else fwd.out
    dlse = torch.zeros_like(fwd.lse)
    bwd = plan_backward(problem, do, q, k, v, o_for_delta, fwd.lse, dlse, cu, cu)
    return [*fwd.launches, *bwd.launches]


def _unsplit_rows(cfg: KernelConfig) -> int:
    """Query rows a sequence of the representative batch needs for a decode grid that fills
    the GPU (at least ``decode.SPLIT_BELOW_PROGRAMS`` programs), so it runs unsplit."""
    from portattn.kernels.decode import SPLIT_BELOW_PROGRAMS, group_heads
    from portattn.kernels.plan import ceil_div

    rep = REPRESENTATIVE
    positions = cfg.decode_tiles().block_m // group_heads(cfg, rep["heads_q"] // rep["heads_k"])
    return positions * ceil_div(SPLIT_BELOW_PROGRAMS, rep["batch"] * rep["heads_k"])


def _plan_paged_decode(entry: Entry, cfg: KernelConfig, seqlen: int, rows: int) -> tuple:
    """The planned decode launches of the representative batch: ``rows`` query rows a sequence
    (1: a decode step) against ``seqlen`` paged keys each."""
    from portattn.kernels.forward import plan_forward
    from portattn.kernels.plan import ceil_div, plan_problem
    from portattn.options import AttentionOptions

    rep, page, dtype = REPRESENTATIVE, DECODE_PAGE_SIZE, entry.torch_dtype()
    batch, pages_per_seq = rep["batch"], ceil_div(seqlen, page)
    q = torch.zeros(batch * rows, rep["heads_q"], entry.head_dim, dtype=dtype)
    k_cache, v_cache = (torch.zeros(batch * pages_per_seq, page, rep["heads_k"], d, dtype=dtype)
                        for d in (entry.head_dim, entry.value_dim))  # fmt: skip
    table = torch.arange(batch * pages_per_seq, dtype=torch.int32).view(batch, -1)
    cu_q = torch.arange(batch + 1, dtype=torch.int32) * rows
    cu_k = torch.arange(batch + 1, dtype=torch.int32) * seqlen
    scale = entry.head_dim**-0.5
    options = AttentionOptions(causal=rep["causal"], softmax_scale=scale, kernel=entry.kernel)
    problem = plan_problem(
        q, k_cache, cu_q, rows, seqlen, options, cfg, block_table=table,
        head_dim_v=entry.value_dim,
    )  # fmt: skip
    plan = plan_forward(problem, q, k_cache, v_cache, cu_q, cu_k, store_o32=False,
                        block_table=table)  # fmt: skip
    return plan.launches


def table_mismatches(launch: Launch, cfg: KernelConfig) -> list[str]:
    """Where a recorded launch differs from the table's tiles (empty when it reads the table;
    a repair pass reads its pass's tiles through ``plan.repair_tiles``)."""
    from portattn.kernels.plan import repair_tiles

    stage = launch.stage.removesuffix("_repair").removesuffix("_chunked")
    if launch.stage == "bwd_dkdv_repair":  # each gradient apart, with its pass's tiles
        tiles = cfg.dkdv_launch_tiles(cfg.dkdv_passes == 1 or bool(launch.args["WANT_DK"]))
    elif stage == "bwd_dkdv":
        tiles = cfg.dkdv_launch_tiles(bool(launch.args.get("WANT_DK", True)))
    else:
        tiles = cfg.stage_tiles(stage)
    if launch.stage.endswith("_repair"):
        tiles = repair_tiles(tiles)
    problems = []
    expected = tiles.launch_kwargs()
    if getattr(launch.fn, "__name__", None) in WS_KERNELS:
        from portattn.kernels.ws_common import ws_launch_options

        expected = ws_launch_options(tiles)
    elif getattr(launch.fn, "__name__", None) == "attn_decode_ws_kernel":
        from portattn.kernels.decode_ws import decode_ws_launch_options

        expected = decode_ws_launch_options()
    if launch.options != expected:
        problems.append(f"launch options {launch.options} != table {expected}")
    for param, value in (("BLOCK_M", tiles.block_m), ("BLOCK_N", tiles.block_n)):
        if param in launch.args and launch.args[param] != value:
            problems.append(f"{param}={launch.args[param]} != table {value}")
    return problems


def select_entries(
    families: Iterable[str] | None = None,
    kernels: Iterable[str] | None = None,
    head_dims: Iterable[int] | None = None,
    dtypes: Iterable[str] | None = None,
    head_dim_v: int | None = None,
) -> list[Entry]:
    """Table entries of the real families (never the interpreter row), filtered; ``head_dims``
    may name borrowed head dims (``configs.BORROWED_HEAD_DIMS``: the next row up, with their
    own tiles where they have them).
    ``head_dim_v``: compile calls whose v has this head dim of its own (each head dim with
    it must make a valid pair, ``validation.check_head_dims``; ValueError otherwise)."""
    fams = list(families) if families else list(FAMILIES)
    for name in fams:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    kerns = list(kernels) if kernels else list(KERNELS)
    dims = list(head_dims) if head_dims else list(HEAD_DIMS)
    names = [DTYPE_ALIASES[d] for d in dtypes] if dtypes else [DTYPE_NAMES[d] for d in DTYPES]
    table = config_table()
    for d in dims if head_dim_v else ():
        check_head_dims(d, d, head_dim_v)
    dv = 0 if head_dim_v is None else head_dim_v
    entries = [
        Entry(f, k, d, n, 0 if dv == d else dv)
        for f in fams
        for k in kerns
        for d in dims
        for n in names
    ]
    missing = [e for e in entries if e.table_key() not in table]
    if missing:
        raise ValueError(f"no table entry for {missing[0]}")
    return entries
