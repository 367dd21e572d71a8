"""Merging partial attention results over disjoint key sets (context parallel, ring attention).

If the keys of a query are split into disjoint parts and each part gives ``(out_i, lse_i)``,
the attention over all keys is::

    lse = log(sum_i exp(lse_i))
    out = sum_i exp(lse_i - lse) * out_i

:func:`merge_attention_states` computes this with plain elementwise PyTorch operations in a
fixed order (parts in list order), in float32, so it is bitwise reproducible run to run and
differentiable through ordinary autograd.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from portattn.validation import DTypeError

__all__ = ["merge_attention_states"]

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_parts(outs, lses) -> None:
    for name, parts in (("outs", outs), ("lses", lses)):
        if not isinstance(parts, (list, tuple)):
            raise TypeError(
                f"{name} must be a list or tuple of tensors, got {type(parts).__name__}"
            )
        for i, x in enumerate(parts):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(x).__name__}")
    if len(outs) == 0:
        raise ValueError("outs must hold at least one partial result, got an empty list")
    if len(lses) != len(outs):
        raise ValueError(
            f"outs and lses must have the same length, got {len(outs)} and {len(lses)}"
        )
    first = outs[0]
    if first.dim() < 2:
        raise ValueError(f"outs[0] must be [..., D] with at least 2 dims, got {tuple(first.shape)}")
    if first.dtype not in _OUT_DTYPES:
        raise DTypeError(f"outs[0] must be float16, bfloat16 or float32, got {first.dtype}")
    for i, (out, lse) in enumerate(zip(outs, lses)):
        if out.shape != first.shape:
            raise ValueError(
                f"outs[{i}] must have the shape of outs[0] {tuple(first.shape)}, got "
                f"{tuple(out.shape)}"
            )
        if out.dtype != first.dtype:
            raise DTypeError(
                f"outs[{i}] must have the dtype of outs[0] ({first.dtype}), got {out.dtype}"
            )
        if lse.dtype != torch.float32:
            raise DTypeError(f"lses[{i}] must have dtype torch.float32, got {lse.dtype}")
        if lse.shape != first.shape[:-1]:
            raise ValueError(
                f"lses[{i}] must have shape {tuple(first.shape[:-1])} (outs[0].shape[:-1]), got "
                f"{tuple(lse.shape)}"
            )
        for name, x in ((f"outs[{i}]", out), (f"lses[{i}]", lse)):
            if x.device != first.device:
                raise ValueError(
                    f"{name} must be on the device of outs[0] ({first.device}), got {x.device}"
                )


def merge_attention_states(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial attention results of the same queries over disjoint key sets.

    Args:
        outs: P >= 1 partial outputs, each [total_q, Hq, D] (more generally [..., D]), all the
            same shape and dtype (float16, bfloat16 or float32), e.g. ``out`` of
            ``varlen_attention(..., return_lse=True)`` over one part of the keys.
        lses: the P matching log-sum-exps, float32 [total_q, Hq] (``outs[i].shape[:-1]``),
            natural log; ``-inf`` where a row saw no key in that part (its out row gets weight 0
            and must be finite: portattn writes 0 there).

    Returns:
        ``(out, lse)``: out in the dtype and shape of ``outs[0]`` (contiguous), lse float32
        ``[total_q, Hq]``. Computed in float32, parts in list order::

            m   = max_i lse_i                       (a shift, treated as a constant)
            lse = m + log(sum_i exp(lse_i - m))
            out = sum_i exp(lse_i - lse) * out_i

        Rows where every part has lse ``-inf`` get lse ``-inf`` and out 0, with no NaN in
        forward or backward. Gradients flow to every ``outs[i]`` and ``lses[i]``; rows of a
        part with lse ``-inf`` get zero gradient.

    Only elementwise operations in a fixed order: the result is bitwise reproducible run to
    run. The merged result is not bitwise equal to a
    single call over all keys (a different summation order), but as accurate: see
    ``docs/api.md``. lse values must not be ``+inf`` or NaN (not checked: that would need a
    host sync).

    Raises:
        TypeError: outs / lses not a list or tuple of tensors; DTypeError (a TypeError and
            ValueError): wrong dtypes; ValueError: empty list, mismatched lengths, shapes or
            devices.
    """
    _check_parts(outs, lses)
    # The shift m cancels mathematically; detaching it keeps the gradient exactly the softmax
    # weights (no max/tie gradient through it).
    m = lses[0].detach()
    for lse_i in lses[1:]:
        m = torch.maximum(m, lse_i.detach())
    empty = torch.isneginf(m)  # rows that saw no key in any part
    m = torch.where(empty, 0.0, m)
    total = torch.exp(lses[0] - m)
    for lse_i in lses[1:]:
        total = total + torch.exp(lse_i - m)
    # Guard log(0) for the empty rows: the log branch sees 1 there and is masked out, so no
    # inf or NaN can reach the backward.
    lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, total)))
    lse_shift = torch.where(empty, 0.0, lse)
    out = None
    for out_i, lse_i in zip(outs, lses):
        term = torch.exp(lse_i - lse_shift).unsqueeze(-1) * out_i.float()
        out = term if out is None else out + term
    return out.to(outs[0].dtype), lse
