"""The one harness that runs attention forward + backward, through the kernels
(:func:`run_kernel`) or through the float64 reference (:func:`run_reference`), and measures the
result against the accuracy rule (:func:`measure`, ``portattn.accuracy``).

Shared by the test suite (``tests/helpers.py``), ``python -m portattn check``, the golden runner
(:mod:`portattn.tools.golden.run`) and the checkout's distributed demo
(``benchmarks/distributed_demo.py``); each makes its own inputs and keeps its own report.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from portattn.accuracy import error, limit
from portattn.api import varlen_attention
from portattn.kernels import buffers
from portattn.reference import reference_varlen_attention

NAMES = ("out", "lse", "dq", "dk", "dv")
SINKS_GRAD = "dsinks"  # the extra output of a call with sinks (their gradient, [Hq])


def cu_seqlens(lengths: Iterable[int], device: torch.device | str | None = None) -> torch.Tensor:
    """int32 ``[0, l0, l0 + l1, ...]`` (``B + 1`` entries) on ``device`` (default: the CPU)."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


@dataclass(frozen=True)
class PackShape:
    """A packed batch's shape: per-sequence query and key lengths, query and kv heads (GQA:
    ``heads_q % heads_kv == 0``) and the head dim."""

    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...]
    heads_q: int
    heads_kv: int
    head_dim: int


def seeded_inputs(
    lens_q: Sequence[int],
    lens_k: Sequence[int],
    n_heads_q: int,
    n_heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """q ``[total_q, Hq, D]``, k, v ``[total_k, Hkv, D]``, dout ``[total_q, Hq, D]`` in ``dtype``
    and dlse ``[total_q, Hq]`` float32, drawn in this order from
    ``torch.Generator().manual_seed(seed)`` (standard normal, float32 on the CPU, then cast and
    moved to ``device``): the same values on every device."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)

    def rand(*shape: int, to: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=to)

    return (
        rand(tq, n_heads_q, head_dim),
        rand(tk, n_heads_kv, head_dim),
        rand(tk, n_heads_kv, head_dim),
        rand(tq, n_heads_q, head_dim),
        rand(tq, n_heads_q, to=torch.float32),
    )


def zero_where_no_key(dlse: torch.Tensor | None, lse: torch.Tensor) -> torch.Tensor | None:
    """``dlse`` with 0 on the rows whose ``lse`` is infinite (rows that see no key have lse
    ``-inf``: an upstream gradient there is meaningless). ``None`` stays ``None``."""
    if dlse is None:
        return None
    return torch.where(torch.isinf(lse), torch.zeros_like(dlse), dlse)


def forward_backward(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    dout: torch.Tensor,
    dlse: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``out, lse = fn(*leaves)`` and the gradients of the leaves through autograd.

    The leaves are ``x.detach().requires_grad_()`` of ``inputs`` (q, k, v, and optionally a
    fourth, the sinks, whose gradient is returned as ``dsinks``): views that keep
    their strides. The upstream gradient of ``out`` is ``dout`` and that of ``lse`` is ``dlse``
    (cast to out's / lse's dtype), zeroed on rows whose lse is infinite
    (:func:`zero_where_no_key`); with ``dlse=None`` lse is not differentiated at all (only out
    is a root). A leaf that no gradient reaches gets zeros. Returns ``out, lse, dq, dk, dv``
    (and ``dsinks``; out and lse detached).
    """
    leaves = [x.detach().requires_grad_() for x in inputs]
    out, lse = fn(*leaves)
    roots, grads = [out], [dout.to(out.dtype)]
    if dlse is not None:
        roots.append(lse)
        grads.append(zero_where_no_key(dlse.to(lse.dtype), lse))
    found = [None] * len(leaves)
    if any(r.requires_grad for r in roots):  # not so for a reference over zero sequences
        found = torch.autograd.grad(roots, leaves, grads, allow_unused=True)
    grads_in = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, found, strict=True)]
    names = NAMES if len(leaves) == 3 else (*NAMES, SINKS_GRAD)
    return dict(zip(names, (out.detach(), lse.detach(), *grads_in), strict=True))


@dataclass
class Pack:
    """The tensors of one packed call: q ``[total_q, Hq, D]``, k and v ``[total_k, Hkv, D]``,
    their int32 ``cu_seqlens``, and the upstream gradients ``do`` (of out) and ``dlse`` (of
    lse; None: lse is not differentiated)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    do: torch.Tensor
    dlse: torch.Tensor | None = None


def _varlen_forward_backward(
    attention: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    leaves: Sequence[torch.Tensor],
    p: Pack,
    **options,
) -> dict[str, torch.Tensor]:
    """:func:`forward_backward` of ``attention(q, k, v, p.cu_q, p.cu_k, sinks=..., **options)``
    (the kernels' or the reference's varlen function) over ``leaves``: q, k, v and, when there
    are attention sinks, the sinks as a fourth leaf (else ``sinks=None``)."""

    def call(q_, k_, v_, *sinks_):
        sinks = sinks_[0] if sinks_ else None
        return attention(q_, k_, v_, p.cu_q, p.cu_k, sinks=sinks, **options)

    return forward_backward(call, leaves, p.do, p.dlse)


def run_kernel(
    p: Pack, *, causal: bool, kernel: str = "varlen", poison: bool = False, **kwargs
) -> dict[str, torch.Tensor]:
    """:func:`forward_backward` of ``portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k,
    causal=causal, return_lse=True, kernel=kernel, **kwargs)`` (upstream gradients ``p.do`` and
    ``p.dlse``). With ``poison`` the kernels' output buffers start filled with NaN
    (``portattn.kernels.buffers.POISON``), so an element they never write shows up. ``sinks``
    in ``kwargs`` (not None) is a leaf too: the result then has ``dsinks``."""
    sinks = kwargs.pop("sinks", None)
    leaves = (p.q, p.k, p.v) if sinks is None else (p.q, p.k, p.v, sinks)
    saved = buffers.POISON
    buffers.POISON = saved or poison
    try:
        options = dict(causal=causal, return_lse=True, kernel=kernel, **kwargs)
        return _varlen_forward_backward(varlen_attention, leaves, p, **options)
    finally:
        buffers.POISON = saved


def run_reference(
    p: Pack, *, causal: bool, compute_dtype: torch.dtype = torch.float64, **kwargs
) -> dict[str, torch.Tensor]:
    """The same computation as :func:`run_kernel` through
    ``portattn.reference.reference_varlen_attention`` in ``compute_dtype`` (q, k, v, do and
    dlse cast to it): float64, or the input dtype for the eager yardstick of the accuracy rule.
    ``kwargs``: ``softmax_scale``, ``window_size``, ``softcap`` and ``sinks`` (not None: cast to
    ``compute_dtype`` and a leaf, as in :func:`run_kernel`)."""
    sinks = kwargs.pop("sinks", None)
    leaves = [x.detach().to(compute_dtype) for x in (p.q, p.k, p.v)]
    if sinks is not None:
        leaves.append(sinks.detach().to(compute_dtype))
    options = dict(causal=causal, compute_dtype=compute_dtype, **kwargs)
    return _varlen_forward_backward(reference_varlen_attention, leaves, p, **options)


def measure(
    name: str, got: torch.Tensor, ref: torch.Tensor, eager: torch.Tensor
) -> tuple[float, float, float]:
    """``(error, eager error, limit)`` of output ``name`` (one of :data:`NAMES`): the error of
    ``got`` against the float64 ``ref``, that of ``eager`` (the input-dtype computation, cast to
    got's dtype) and the largest error the accuracy rule accepts (``portattn.accuracy``)."""
    err, base = error(name, got, ref), error(name, eager.to(got.dtype), ref)
    return err, base, limit(name, base)
