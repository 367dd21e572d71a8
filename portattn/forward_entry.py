"""The forward entry every checked public function ends in: :func:`run_forward`.

``varlen_attention``, ``attention`` (:mod:`portattn.api`) and ``flash_attn_with_kvcache``
(:mod:`portattn.kvcache`) check their arguments (:func:`portattn.options.check_options` and
their own shape checks), then call it with packed tensors and the options record; it decides
what only the forward needs to know (whether a float32 output is stored for a backward) and
calls the custom op.
"""

from __future__ import annotations

import torch

from portattn.kernels.plan import splits_p
from portattn.ops import FwdArgs, varlen_fwd
from portattn.options import AttentionOptions, needs_grad


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked arguments into the forward op; returns (out, lse), both differentiable.
    ``check_values``: the op runs the value checks of ``cu_seqlens`` right before its launch;
    ``block_table``: k and v are paged caches (inference only)."""
    sinks = [] if options.sinks is None else [options.sinks]
    # fixed_order's backward reads a float32 copy of out: store it only when a backward can run.
    store_o32 = splits_p(options.kernel) and needs_grad(q, k, v, *sinks)
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
    out, lse, _ = varlen_fwd(*args)
    return out, lse
