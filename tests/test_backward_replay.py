"""Replayed backward launches (``portattn.backward_replay``) give the planned launches' bytes.

A training step's backward plans its launches once per signature and replays them after: each
case runs three forward+backward calls of one signature (new tensors each time) with the replay
on and off, compares the gradients' raw bits, and counts how often the replay path planned.
A signature that differs in what the launches depend on (the strides of dO, whether it must be
copied densely, a dlse, one tensor in two places) plans again.
"""

from __future__ import annotations

import pytest
import torch
from helpers import cu_seqlens, seeded_tensor

import portattn
from portattn import backward_replay
from portattn.kernels import plan

HQ, HKV, D = 4, 2, 32


def _same_bits(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        for s, t in zip(x, y, strict=True):
            assert s.dtype == t.dtype and s.shape == t.shape
            assert torch.equal(s.view(torch.int16), t.view(torch.int16))


def _runs(monkeypatch, make_call, calls: int = 3):
    """``make_call(i)()`` (the gradients of one step) for i < ``calls``, with the replay off,
    then on (problems dropped before each): both lists of gradients, and how many times the
    calls with the replay on planned a backward."""
    planned: list[int] = []
    real = backward_replay.plan_backward

    def counted(*args, **kwargs):
        planned.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(backward_replay, "plan_backward", counted)
    results = {}
    for replay in (False, True):
        monkeypatch.setattr(backward_replay, "REPLAYED_BACKWARDS", replay)
        plan.forget_problems()
        planned.clear()
        results[replay] = [make_call(i)() for i in range(calls)]
    return results[False], results[True], len(planned)


def _step(lens, lens_k=None, use_lse=False, strided_do=False, vary=None, **kw):
    """A forward+backward of varlen_attention on packs of ``lens`` (keys ``lens_k``, else one
    cu_seqlens tensor in both places); ``use_lse``: the loss reads lse too (a dlse);
    ``strided_do``: dO a column slice (copied densely before the preprocess kernel);
    ``vary(i)``: overrides for call i (a signature that changes between calls; ``copy_cu``:
    cu_seqlens_k an equal copy of cu_seqlens_q)."""

    def make(i):
        total_k = sum(lens_k or lens)
        q = seeded_tensor(sum(lens), HQ, D, seed=i).requires_grad_()
        k = seeded_tensor(total_k, HKV, D, seed=50 + i).requires_grad_()
        v = seeded_tensor(total_k, HKV, D, seed=60 + i).requires_grad_()
        cu_q = cu_seqlens(lens)
        call_kw = dict(kw, **(vary(i) if vary else {}))
        cu_k = cu_q if lens_k is None else cu_seqlens(lens_k)
        if call_kw.pop("copy_cu", False):
            cu_k = cu_q.clone()
        do = seeded_tensor(sum(lens), HQ, 3 * D, seed=70 + i)
        do = do[..., :D] if call_kw.pop("strided_do", strided_do) else do[..., :D].contiguous()

        def step():
            out, lse = portattn.varlen_attention(
                q, k, v, cu_q, cu_k, max(lens), max(lens_k or lens), return_lse=True, **call_kw
            )
            outputs, grads = [out], [do]
            if use_lse:
                outputs.append(lse)
                grads.append(seeded_tensor(*lse.shape, dtype=torch.float32, seed=80 + i))
            return torch.autograd.grad(outputs, (q, k, v), grads)

        return step

    return make


@pytest.mark.parametrize(
    "case",
    [
        dict(lens=[1, 17, 0, 63], causal=True),  # cu_q is cu_k
        dict(lens=[5, 40], lens_k=[33, 9], kernel="fixed_order"),
        dict(lens=[20, 3], causal=True, use_lse=True, window_size=(6, 0), softcap=5.0),
        dict(lens=[17, 30], strided_do=True, kernel="fixed_order", causal=True),
    ],
)
def test_backward_replays_give_the_planned_bytes(monkeypatch, case):
    planned, replayed, plans = _runs(monkeypatch, _step(**case))
    _same_bits(planned, replayed)
    assert plans == 1  # the first call planned; the other two replayed


def test_what_the_launches_depend_on_plans_again(monkeypatch):
    """A dO that must be copied in one call and not in the next, or a dlse in one call only:
    other launches or other tensors, so each such call plans (and gives the planned bytes)."""
    planned, replayed, plans = _runs(
        monkeypatch, _step([9, 31], causal=True, vary=lambda i: dict(strided_do=i == 1))
    )
    _same_bits(planned, replayed)
    assert plans == 2  # calls 0 and 2 share a signature; call 1 (a strided dO) has its own


def test_one_tensor_in_two_places_is_part_of_the_signature(monkeypatch):
    """cu_seqlens_q passed as cu_seqlens_k in calls 0 and 2, an equal copy in call 1: a
    template binds a tensor given twice to one slot, so call 1 plans its own."""
    planned, replayed, plans = _runs(
        monkeypatch, _step([9, 31], causal=True, vary=lambda i: dict(copy_cu=i == 1))
    )
    _same_bits(planned, replayed)
    assert plans == 2
