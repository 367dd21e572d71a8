"""Replayed forward launches (issue 37 item 3: host time per call).

A forward (a decode step's ``flash_attn_with_kvcache``, a ``varlen_attention`` call, with or
without a backward to come, eager or in the custom op's body) plans the same launches call after
call: the grids, compile-time parameters, strides and sizes depend on the problem
(``plan.plan_problem``'s signature: shapes, options, dtype, device, the configuration entry) and
on the tensors' strides, never on the tensors' addresses or values. The first call of such a
signature plans as always (``forward.plan_forward``) and keeps its launches as a
:class:`ForwardTemplate`, in the problem's memo: each launch's arguments with the call's tensors
marked by their place (:data:`CALL_TENSORS`). Later calls allocate the outputs and launch the
template with their own tensors put in (:func:`replayed_forward`), without the argument binding
and planning between (about a fifth of a decode call's host time on a CPU,
``benchmarks/host_overhead.py``; perf-notes row 87).

Same kernels, grids, parameters and arguments in the same order: the same bytes as the planned
path, and the value checks that run at launch (``check_values``) run as there
(tests/test_forward_replay.py). Calls with sinks (a tensor among the launch's parameters)
are not replayed. Where a call passes one tensor in two places (``cu_seqlens_q`` is
``cu_seqlens_k``, as self-attention does), that is part of its replay key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from portattn.kernels.buffers import descriptor_scratch, new_buffer, rows_aligned
from portattn.kernels.descriptors import HostDescriptor
from portattn.kernels.forward import plan_forward
from portattn.kernels.launcher import launch_all
from portattn.kernels.plan import KernelLaunch, VarlenProblem, plan_problem, run_launches
from portattn.options import AttentionOptions
from portattn.validation import check_paged_values, check_varlen_values

# Off only for tests and measurements: every call then plans its launches.
REPLAYED_FORWARDS = True

# The tensors of one call, in this order, as a template's slots index them: the inputs, then
# the outputs the replay allocates (``lse`` may be the caller's scratch buffer; ``partials``:
# the split decode's workspace or the Gluon forward's parked accumulators, design §3.1).
CALL_TENSORS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "block_table", "out", "lse", "out32",
                "partials")  # fmt: skip
# What a template keeps of a launch's arguments as they are (tensors are slots; another type,
# a subclass of these included, keeps no template).
_PLAIN_VALUES = frozenset((int, float, bool, str, type(None)))


@dataclass(frozen=True)
class LaunchTemplate:
    """One planned launch with the call's tensors taken out: ``args`` holds None at each
    position of ``slots`` (position in args, index in the tensors :meth:`bind` takes: a
    forward's :data:`CALL_TENSORS`)."""

    stage: str
    kernel: object
    grid: tuple[int, ...]
    args: tuple
    slots: tuple[tuple[int, int], ...]
    params: dict
    tma: bool
    # The launcher's direct launch of this template's binds, once its kernel is kept
    # (kernels/launcher.py): empty until then.
    direct: list = field(default_factory=list, compare=False, repr=False)
    descriptors: tuple[HostDescriptor, ...] = ()  # as KernelLaunch's

    def slot_tensors(self, tensors: tuple) -> tuple:
        """The tensors of ``tensors`` (as :meth:`bind` takes them) in the order of their
        positions among the launch's arguments (a direct launch's order)."""
        return tuple(tensors[index] for _, index in self.slots)

    def bind(self, tensors: tuple) -> KernelLaunch:
        args = list(self.args)
        for position, index in self.slots:
            args[position] = tensors[index]
        return KernelLaunch(self.stage, self.kernel, self.grid, tuple(args), self.params,
                            self.tma, self.direct, self.descriptors)  # fmt: skip

    @staticmethod
    def record(launch: KernelLaunch, index_of: dict[int, int]) -> LaunchTemplate | None:
        """The template of ``launch`` whose tensors are those of ``index_of`` (``id`` -> index
        in the tensors :meth:`bind` takes), or None where it holds another tensor or an object
        that may hold one."""
        for value in launch.params.values():
            if isinstance(value, torch.Tensor):
                return None
        args, slots = list(launch.args), []
        for position, value in enumerate(args):
            if type(value) in _PLAIN_VALUES:  # kept as it is
                continue
            if not isinstance(value, torch.Tensor):  # an object that may hold a tensor
                return None
            index = index_of.get(id(value))
            if index is None:
                return None
            args[position] = None
            slots.append((position, index))
        return LaunchTemplate(launch.stage, launch.kernel, launch.grid, tuple(args),
                              tuple(slots), launch.params, launch.tma,
                              descriptors=launch.descriptors)  # fmt: skip


def tensor_indexes(tensors: tuple) -> dict[int, int]:
    """``id`` -> index of each tensor of ``tensors`` (a tensor given twice: its first index)."""
    index_of: dict[int, int] = {}
    for index, t in enumerate(tensors):
        if t is not None:
            index_of.setdefault(id(t), index)
    return index_of


@dataclass(frozen=True)
class ForwardTemplate:
    """The launches of one forward signature and the outputs they write."""

    out_shape: tuple[int, ...]  # [total_q, Hq, Dv]; lse is [total_q, Hq]
    store_o32: bool
    launches: tuple[LaunchTemplate, ...]
    partials_shape: tuple[int, ...] | None = None  # a workspace (ForwardPlan.partials), float32

    @staticmethod
    def record(launches: tuple[KernelLaunch, ...], tensors: tuple) -> ForwardTemplate | None:
        """The template of a planned call's ``launches`` whose tensors are ``tensors`` (as
        :data:`CALL_TENSORS`), or None where a launch holds a tensor that is not one of them
        (a sinks parameter). A tensor passed in two places takes the first one's slot: the
        replay key holds which inputs are one tensor (:func:`replay_key`)."""
        index_of = tensor_indexes(tensors)  # out32 may be out (no float32 copy)
        kept = []
        for launch in launches:
            template = LaunchTemplate.record(launch, index_of)
            if template is None:
                return None
            kept.append(template)
        out, partials = tensors[6], tensors[9]
        shape = None if partials is None else tuple(partials.shape)
        return ForwardTemplate(tuple(out.shape), tensors[8] is not None, tuple(kept), shape)


def value_checks(
    q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q: int, max_seqlen_k: int
) -> Callable[[], object] | None:
    """The value checks of ``cu_seqlens`` (and a paged call's ``block_table``) that the forward
    runs right before its launch when asked (``check_values``): they read the values on the
    host, and raise before any launch. None where they passed for these tensors' versions and
    these sizes already (a model's layers sharing a pack): nothing to run, no launch hook."""
    total_q, total_k = q.shape[0], k.shape[0]
    if block_table is not None:
        check = check_paged_values
        args = (cu_seqlens_q, cu_seqlens_k, block_table, total_q, total_k, k.shape[1])
    else:
        check = check_varlen_values
        args = (cu_seqlens_q, cu_seqlens_k, total_q, total_k)
    args += (max_seqlen_q, max_seqlen_k)
    if check.ran(*args):
        return None
    return functools.partial(check, *args)


def input_aliases(inputs: tuple) -> tuple[int, ...]:
    """Which inputs are one tensor (cu_seqlens_q may be cu_seqlens_k): each one's first index
    among ``inputs``. A template binds a tensor given twice to one slot."""
    ids = tuple(map(id, inputs))
    return tuple(map(ids.index, ids))


def replay_key(
    problem: VarlenProblem, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, store_o32: bool, lse
) -> tuple:
    """What a forward's launches depend on beyond its problem: the tensors' strides, the
    float32 copy, whether the lse buffer is the caller's, (the forward kernel's descriptor
    path) whether q, k and v's rows are 16-byte aligned, and which inputs are one tensor."""
    aligned = None
    if not problem.page_size and "fwd" in problem.cfg.tma:
        aligned = rows_aligned(q, k, v)
    table = None if block_table is None else block_table.stride()
    aliases = input_aliases((q, k, v, cu_seqlens_q, cu_seqlens_k, block_table))
    return (
        "replay",
        store_o32,
        lse is None,
        q.stride(),
        k.stride(),
        v.stride(),
        table,
        aligned,
        aliases,
    )


def replayed_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    options: AttentionOptions,
    store_o32: bool,
    block_table: torch.Tensor | None,
    lse: torch.Tensor | None,
    check_values: bool = False,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, ForwardTemplate | None]:
    """The forward of checked arguments, planned once per signature and replayed after (the
    body of ``ops.fwd_impl``, and of an eager no-grad call): (out, lse, out32 or None, the
    template launched or kept, None with sinks or the replay off). An entry point may keep the
    template under its own call signature (``forward_entry.run_kept_forward``) and launch it
    with :func:`launch_template` from the next call on, past this module's lookups. ``lse``: a
    float32 [total_q, Hq] buffer to write the lse to (a scratch nobody reads), or None;
    ``check_values``: the value checks of ``cu_seqlens`` (and the block table) run right
    before the launch; ``sinks``: float32 [Hq] or None (a call with sinks plans every time).
    With :data:`REPLAYED_FORWARDS` off every call plans."""
    problem = plan_problem(
        q,
        k,
        cu_seqlens_q,
        max_seqlen_q,
        max_seqlen_k,
        options,
        block_table=block_table,
        head_dim_v=v.shape[-1],
    )
    before_launch = None
    if check_values:  # as ops.fwd_impl: the host reads of cu_seqlens, right before the launch
        before_launch = value_checks(
            q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k
        )
    key = None
    if REPLAYED_FORWARDS and sinks is None:  # sinks: a tensor among the launch's parameters
        key = replay_key(problem, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, store_o32, lse)
    template = None if key is None else problem.memo.get(key)
    if template is not None:
        inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table)
        return (*launch_template(template, inputs, lse, before_launch), template)
    plan = plan_forward(
        problem, q, k, v, cu_seqlens_q, cu_seqlens_k, store_o32, block_table, sinks, lse
    )
    if key is not None:
        tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, plan.out, plan.lse,
                   plan.out32, plan.partials)  # fmt: skip
        template = ForwardTemplate.record(plan.launches, tensors)
        if template is not None:
            problem.memo[key] = template
    run_launches(plan.launches, q.device, before_launch)
    return plan.out, plan.lse, plan.out32, template


def launch_template(
    template: ForwardTemplate,
    inputs: tuple,
    lse: torch.Tensor | None,
    before_launch: Callable[[], object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch ``template`` on ``inputs`` (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, as
    :data:`CALL_TENSORS`) with new outputs: (out, lse, out32 or None); ``lse``: the caller's
    buffer or None (a new one), as when the template was recorded."""
    q = inputs[0]
    out = new_buffer(template.out_shape, q.dtype, q.device)
    if lse is None:
        lse = new_buffer(template.out_shape[:2], torch.float32, q.device)
    out32 = None
    if template.store_o32:
        out32 = new_buffer(template.out_shape, torch.float32, q.device)
    partials = None
    if template.partials_shape is not None:
        partials = new_buffer(template.partials_shape, torch.float32, q.device)
    tensors = (*inputs, out, lse, out32, partials)
    if before_launch is None and launch_directly(template.launches, tensors):
        return out, lse, out32
    run_launches([launch.bind(tensors) for launch in template.launches], q.device, before_launch)
    return out, lse, out32


def launch_directly(launches: tuple[LaunchTemplate, ...], tensors: tuple) -> bool:
    """Launch the templates' direct launches (``kernels/launcher.py``: the kept compiled
    kernels, with the tensors' addresses) past the binds, the launch signatures and
    ``run_launches``' path choice, when each has one; else launch nothing and return False.
    A direct launch exists only where ``launch_kernel`` made it: never under the interpreter
    or a family override (its launches go as PTX)."""
    directs = []
    for launch in launches:
        if not launch.direct:
            return False
        directs.append((launch.direct[0], launch.slot_tensors(tensors)))
    if not any(launch.tma for launch in launches):
        return launch_all(directs)
    with descriptor_scratch(tensors[0].device, True):  # as run_launches sets it up
        return launch_all(directs)
