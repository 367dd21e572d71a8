"""The forward entry every checked public function ends in: :func:`run_forward`.

``varlen_attention``, ``attention`` (:mod:`portattn.api`) and ``flash_attn_with_kvcache``
(:mod:`portattn.kvcache`) check their arguments (:func:`portattn.options.check_options` and
their own shape checks), then call it with packed tensors and the options record; it decides
what only the forward needs to know (whether a float32 output is stored for a backward) and
calls the custom op, or, in an eager call, the op's implementation itself, with the op's autograd
formula in a plain ``autograd.Function`` when a backward may follow (:func:`direct_call`).
"""

from __future__ import annotations

import torch

from portattn.forward_replay import replayed_forward
from portattn.kernels.buffers import lse_scratch
from portattn.kernels.plan import splits_p
from portattn.ops import EagerAttention, FwdArgs, varlen_fwd
from portattn.options import PLAIN_TENSORS, AttentionOptions, capturing, needs_grad

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
    if not DIRECT_CALLS or compiling or torch.compiler.is_compiling():
        return None
    q = tensors[0]
    for t in tensors:
        if t is not None and type(t) not in PLAIN_TENSORS:
            return None
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != q.dtype:
        return None
    if (
        torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
    ):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return "autograd"
    return "impl"


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
        out, lse, _ = replayed_forward(
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
