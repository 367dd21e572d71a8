"""Replayed backward launches (host time per training step).

A backward plans the same launches call after call, as a forward does
(``portattn.forward_replay``): the grids, compile-time parameters, strides and sizes depend on
the problem (``plan.plan_problem``'s signature) and on the tensors' strides, alignment and
aliasing, never on their addresses or values. The first call of such a signature plans
(``backward.plan_backward``) and keeps its launches as a :class:`BackwardTemplate` in the
problem's memo, the call's tensors marked by their place (:data:`BACKWARD_TENSORS`); later
calls allocate the gradients and the preprocess kernel's scratch and launch the template with
their own tensors put in, past the planner, the argument tuples and (once each kernel is kept,
``kernels/launcher.py``) Triton's binding. A training step's backward planned about twice the
host time of its forward before (``benchmarks/host_overhead.py``, case ``varlen_train``).

Same kernels, grids, parameters and arguments in the same order: the same bytes as the planned
path (tests/test_backward_replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portattn.forward_replay import LaunchTemplate, input_aliases, launch_directly, tensor_indexes
from portattn.kernels.backward import plan_backward
from portattn.kernels.buffers import dense_specialized, new_buffer, rows_aligned
from portattn.kernels.plan import VarlenProblem, run_launches

# Off only for tests and measurements: every backward then plans its launches.
REPLAYED_BACKWARDS = True

# The tensors of one backward, in this order, as a template's slots index them: the inputs
# (``do`` and ``o_for_delta`` after ``dense_specialized``; ``dlse`` is ``lse`` where the call
# has none, as the preprocess kernel reads it), then what the replay allocates.
BACKWARD_TENSORS = ("do", "q", "k", "v", "o_for_delta", "lse", "dlse", "cu_seqlens_q",
                    "cu_seqlens_k", "dq", "dk", "dv", "lse2", "delta")  # fmt: skip


@dataclass(frozen=True)
class BackwardTemplate:
    """The launches of one backward signature; ``scratch_shape``: lse2's and delta's
    (float32 [Hq, stride_hm])."""

    scratch_shape: tuple[int, ...]
    launches: tuple[LaunchTemplate, ...]


def backward_key(inputs: tuple, dense_do: torch.Tensor, copied: tuple[bool, bool]) -> tuple:
    """What a backward's launches depend on beyond its problem: the ``inputs``' strides (do, q,
    k, v, o_for_delta, lse, dlse or None, cu_seqlens_q, cu_seqlens_k, as the caller gave them),
    whether dO and O were copied densely (``copied``), whether the rows of q, k, v and the dO
    the kernels read are 16-byte aligned (the descriptor paths), whether there is a dlse, and
    which inputs are one tensor."""
    _, q, k, v = inputs[:4]
    return (
        "backward replay",
        tuple(None if t is None else t.stride() for t in inputs),
        copied,
        rows_aligned(q, k, v, dense_do),
        input_aliases(inputs),
    )


def replayed_backward(
    problem: VarlenProblem,
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o_for_delta: torch.Tensor,
    lse: torch.Tensor,
    dlse: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the backward (the arguments as ``backward.plan_backward``'s), planned
    once per signature and replayed after; with :data:`REPLAYED_BACKWARDS` off every call
    plans."""
    # As plan_backward_launches does first (it returns these tensors themselves when dense)
    dense_do, dense_o = dense_specialized(do), dense_specialized(o_for_delta)
    key = None
    if REPLAYED_BACKWARDS:
        copied = (dense_do is not do, dense_o is not o_for_delta)
        given = (do, q, k, v, o_for_delta, lse, dlse, cu_seqlens_q, cu_seqlens_k)
        key = backward_key(given, dense_do, copied)
    template = None if key is None else problem.memo.get(key)
    dlse_read = lse if dlse is None else dlse  # what the preprocess kernel reads
    inputs = (dense_do, q, k, v, dense_o, lse, dlse_read, cu_seqlens_q, cu_seqlens_k)
    if template is not None:
        dq = new_buffer(q.shape, q.dtype, q.device)
        dk = new_buffer(k.shape, k.dtype, k.device)
        dv = new_buffer(v.shape, v.dtype, v.device)
        lse2 = new_buffer(template.scratch_shape, torch.float32, q.device)
        delta = new_buffer(template.scratch_shape, torch.float32, q.device)
        tensors = (*inputs, dq, dk, dv, lse2, delta)
        if not launch_directly(template.launches, tensors):
            run_launches([launch.bind(tensors) for launch in template.launches], q.device)
        return dq, dk, dv
    plan = plan_backward(problem, dense_do, q, k, v, dense_o, lse, dlse, cu_seqlens_q,
                         cu_seqlens_k)  # fmt: skip
    if key is not None and plan.lse2 is not None:
        tensors = (*inputs, plan.dq, plan.dk, plan.dv, plan.lse2, plan.delta)
        index_of = tensor_indexes(tensors)
        kept = [LaunchTemplate.record(launch, index_of) for launch in plan.launches]
        if all(launch is not None for launch in kept):
            problem.memo[key] = BackwardTemplate(tuple(plan.lse2.shape), tuple(kept))
    run_launches(plan.launches, q.device)
    return plan.dq, plan.dk, plan.dv
