"""The forward entry every checked public function ends in: :func:`run_forward`.

``varlen_attention``, ``attention`` (:mod:`portattn.api`) and ``flash_attn_with_kvcache``
(:mod:`portattn.kvcache`) check their arguments (:func:`portattn.options.check_options` and
their own shape checks), then call it with packed tensors and the options record; it decides
what only the forward needs to know (whether a float32 output is stored for a backward) and
calls the custom op, or, in an eager call, the op's implementation itself, with the op's autograd
formula in a plain ``autograd.Function`` when a backward may follow (:func:`direct_call`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from portattn.configs import resolve_config
from portattn.forward_replay import (
    input_aliases,
    launch_template,
    replayed_forward,
    value_checks,
)
from portattn.kernels.buffers import lse_scratch, rows_aligned
from portattn.kernels.plan import problems_forgotten, splits_p
from portattn.ops import EagerAttention, FwdArgs, varlen_fwd
from portattn.options import PLAIN_TENSORS, AttentionOptions, capturing, needs_grad

T = TypeVar("T")

# Off only for tests and measurements: every call then goes through the custom op.
DIRECT_CALLS = True


def direct_call(tensors: tuple, compiling: bool) -> str | None:
    """How an eager call may run without the custom op's dispatch: ``"impl"``, the op's
    implementation (``ops.fwd_impl``) alone, where no autograd would act on the op (no tensor
    requires grad, or grad mode is off); ``"autograd"``, ``ops.EagerAttention`` (the same
    implementation and the op's own autograd formula in a plain ``autograd.Function``); or
    None: the op. None when anything else could act on the op: tracing (``compiling`` read in
    the entry's frame, and this frame's own), autocast to another dtype (the op's autocast
    kernel casts q/k/v, here already the autocast dtype), a Python dispatch or torch-function
    mode (FakeTensor, functionalization, ``torch.device(...)``), a functorch transform, or a
    tensor subclass to redispatch to. The same Python functions then run on the same
    arguments: the same bits and the same errors (tests/test_direct_calls.py). A CUDA graph's
    capture records the same launches either way."""
    for t in tensors:
        if t is not None and type(t) not in PLAIN_TENSORS:
            return None
    if not eager_plain(tensors[0], compiling):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return "autograd"
    return "impl"


def eager_plain(q: torch.Tensor, compiling: bool) -> bool:
    """Whether an eager call with q (and plain tensors) may skip the custom op: direct calls
    on (:data:`DIRECT_CALLS`), not traced, no autocast to another dtype, no dispatch or
    torch-function mode and no functorch transform (:func:`direct_call`)."""
    if not DIRECT_CALLS or compiling or torch.compiler.is_compiling():
        return False
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != q.dtype:
        return False
    return not (
        torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
    )


def run_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    options: AttentionOptions,
    *,
    check_values: bool = False,
    block_table: torch.Tensor | None = None,
    compiling: bool = True,
    lse_needed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked arguments into the forward op; returns (out, lse), both differentiable.
    ``check_values``: the op runs the value checks of ``cu_seqlens`` right before its launch;
    ``block_table``: k and v are paged caches (inference only). ``compiling``:
    ``torch.compiler.is_compiling()`` read in the entry's frame (True: always the op).
    ``lse_needed`` False: the caller drops the lse; a direct call outside CUDA-graph capture
    then writes it to a scratch buffer shared by such calls (its values are garbage after)."""
    sinks = [] if options.sinks is None else [options.sinks]
    # fixed_order's backward reads a float32 copy of out: store it only when a backward can run.
    store_o32 = splits_p(options.kernel) and needs_grad(q, k, v, *sinks)
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, options.sinks)
    path = direct_call(tensors, compiling)
    if path == "impl":
        # With no autograd here, nothing but the caller could read the lse.
        scratch = None
        if not lse_needed and not capturing(q):
            scratch = lse_scratch(q.shape[0], q.shape[1], q.device)
        # The op's implementation (ops.fwd_impl) without binding its arguments first.
        out, lse, _, _ = replayed_forward(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            options,
            store_o32,
            block_table,
            scratch,
            check_values,
            options.sinks,
        )
        return out, lse
    args = FwdArgs.bind(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        options,
        store_o32=store_o32,
        check_values=check_values,
        block_table=block_table,
    )
    if path is None:
        out, lse, _ = varlen_fwd(*args)
        return out, lse
    out, lse, _ = EagerAttention.apply(options, *args)  # path "autograd"
    return out, lse


def run_kept_forward(
    inputs: tuple,
    max_seqlen_q: int,
    max_seqlen_k: int,
    options: AttentionOptions,
    lse_needed: bool,
    kept: dict,
    check_values: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_forward` of an eager call (not traced, not captured, no sinks, nothing that
    requires grad) of ``inputs`` (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table) whose entry
    point keeps a record per call signature, and ``kept`` a dict of that record: the forward's
    launches (``forward_replay``'s template) are kept there by the signature's first call and
    launched from the next one on, past the lookups of ``run_forward`` (issue 37: host time per
    call). The signature must hold q's, k's and v's shapes, strides, dtypes and devices and
    the options; :func:`kept_slot` and :func:`kept_stamp` hold the rest. ``check_values``: as
    :func:`run_forward`'s (the value checks of ``cu_seqlens`` right before the launch)."""
    q, k, v, cu_seqlens_q, cu_seqlens_k, block_table = inputs
    # A signature's first call keeps its launches too: a transformers cache that grows by a
    # token a step is a new signature each step, called by each of the step's layers (the
    # first layer keeping them spares the second a plan; session 50, perf-notes row 126).
    if needs_grad(q, k, v) or options.sinks is not None or not eager_plain(q, False):
        return run_forward(
            *inputs[:5],
            max_seqlen_q,
            max_seqlen_k,
            options,
            check_values=check_values,
            block_table=block_table,
            compiling=False,
            lse_needed=lse_needed,
        )
    scratch = None
    if not lse_needed:  # as run_forward: an lse nobody reads goes to the shared scratch
        scratch = lse_scratch(q.shape[0], q.shape[1], q.device)
    slot = kept_slot(inputs, max_seqlen_q, max_seqlen_k)
    stamp = kept_stamp(q, v, options.kernel)
    hit = kept.get(slot)
    if hit is not None and hit[0] == stamp:
        before_launch = None
        if check_values:
            before_launch = value_checks(
                q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k
            )
        out, lse, _ = launch_template(hit[1], inputs, scratch, before_launch)
        return out, lse
    # run_forward's direct path ("impl": plain eager, nothing requires grad), keeping its launches
    out, lse, _, template = replayed_forward(
        *inputs[:5],
        max_seqlen_q,
        max_seqlen_k,
        options,
        False,
        block_table,
        scratch,
        check_values,
    )
    if template is not None:
        if len(kept) >= KEPT_SLOTS:  # a signature called with ever new lengths
            kept.clear()
        kept[slot] = (stamp, template)
    return out, lse


KEPT_SLOTS = 64  # kept templates per call signature


def kept_value(kept: dict, name: str, make: Callable[[], T]) -> T:
    """A value that is a function of a kept call signature alone (an entry point's own: the
    dense call's fold), made by ``make()`` on the signature's first call and kept in its dict
    under ``name`` (the launches' slots are tuples: no name is one)."""
    value = kept.get(name)
    if value is None:
        value = kept[name] = make()
    return value


def kept_slot(inputs: tuple, max_seqlen_q: int, max_seqlen_k: int) -> tuple:
    """What the launches of a kept signature depend on beyond it: the longest sequences, the
    cu_seqlens' and the block table's layouts (a dense cache's table is a view of
    ``cache_batch_idx``), which inputs are one tensor (cu_seqlens_q and cu_seqlens_k may be)
    and, without a block table, whether q's, k's and v's rows are 16-byte aligned (the
    descriptor path: their addresses change from call to call)."""
    aliases = input_aliases(inputs)
    cu_q, cu_k, table = inputs[3:]
    cu = (cu_q.shape, cu_q.stride(), cu_k.shape, cu_k.stride())
    if table is None:
        return (max_seqlen_q, max_seqlen_k, cu, aliases, None, rows_aligned(*inputs[:3]))
    return (max_seqlen_q, max_seqlen_k, cu, aliases, table.stride(), None)


def kept_stamp(q: torch.Tensor, v: torch.Tensor, kernel: str) -> tuple:
    """What a kept template must have been made under: the configuration entry (a changed
    table or family override is another) and the planner's problems not forgotten since."""
    cfg = resolve_config(q.device, kernel, q.shape[-1], q.dtype, v.shape[-1])
    return (cfg, problems_forgotten())  # a tuple's == compares an identical cfg by identity
