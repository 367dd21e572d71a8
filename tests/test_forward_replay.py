"""Replayed forward launches (``portattn.forward_replay``) give the planned launches' bytes.

An eager no-grad call plans its launches once per signature and replays them after: each case
runs three calls of one signature (new tensors and values each time) with the replay on and
off, compares every output's raw bits (NaN included), and counts how often the replay path
planned.
"""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, cu_seqlens, seeded_tensor

import portattn
from portattn import forward_replay
from portattn.kernels import plan

HQ, HKV, D, PAGE = 4, 2, 32, 16
_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _same_bits(a, b) -> None:
    """Equal raw bits (NaN included) through nested lists and tuples of tensors; an error's
    (type, message) pair equal."""
    if isinstance(a, (tuple, list)):
        assert isinstance(b, type(a)) and len(a) == len(b)
        if a and isinstance(a[0], type):
            assert a == b
            return
        for x, y in zip(a, b, strict=True):
            _same_bits(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(_INT_VIEW[a.dtype]), b.view(_INT_VIEW[b.dtype]))


def _runs(monkeypatch, make_call, calls: int = 3):
    """``make_call(i)()`` for i < ``calls`` with the replay off, then on (problems dropped
    before each): both lists of results (or an error's (type, message)) and how many times
    the calls with the replay on planned launches."""
    planned: list[int] = []
    real = forward_replay.plan_forward

    def counted(*args, **kwargs):
        planned.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_replay, "plan_forward", counted)
    results = {}
    for replay in (False, True):
        monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", replay)
        plan.forget_problems()
        planned.clear()  # count the replayed run's plans only
        results[replay] = []
        for i in range(calls):
            try:
                results[replay].append(make_call(i)())
            except ValueError as err:
                results[replay].append((type(err), str(err)))
    return results[False], results[True], len(planned)


def _paged_call(kernel="varlen", append=True, dense=False, **kw):
    def make(i):
        k_cache = seeded_tensor(8, PAGE, HKV, D, seed=10 + i)
        v_cache = seeded_tensor(8, PAGE, HKV, D, seed=20 + i)
        table = torch.tensor([[3, 1, 0], [2, 5, 7], [4, 6, 0]], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([16 + i, 3, 0], dtype=torch.int32, device=DEVICE)
        new = (seeded_tensor(3, 1, HKV, D, seed=30 + i), seeded_tensor(3, 1, HKV, D, seed=40 + i))
        if dense:  # [B, S_cache, Hkv, D]: one page of 3 * PAGE rows per sequence
            k_cache, v_cache = (
                k_cache[:6].reshape(3, 2 * PAGE, HKV, D),
                v_cache[:6].reshape(3, 2 * PAGE, HKV, D),
            )
            table = None

        def call():
            out = portattn.flash_attn_with_kvcache(
                seeded_tensor(3, 1, HQ, D, seed=i),
                k_cache,
                v_cache,
                *(new if append else (None, None)),
                cache_seqlens=lens,
                block_table=table,
                causal=True,
                return_softmax_lse=True,
                kernel=kernel,
                **kw,
            )
            return (*out, k_cache, v_cache)

        return call

    return make


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(kernel="fixed_order", append=False),
        dict(window_size=(5, 0), softcap=8.0),
        dict(dense=True),
    ],
)
def test_kvcache_replays_give_the_planned_bytes(monkeypatch, case):
    with torch.no_grad():
        planned, replayed, plans = _runs(monkeypatch, _paged_call(**case))
    _same_bits(planned, replayed)
    assert plans == 1  # the first call planned; the other two replayed


def _varlen_call(lens, lens_k=None, max_given=True, nan_key=False, bad_third=False, **kw):
    """varlen_attention (no grad) on packs of ``lens`` (keys: ``lens_k``, else self-attention
    with one cu_seqlens tensor in both places)."""

    def make(i):
        total_k = sum(lens_k or lens)
        q = seeded_tensor(sum(lens), HQ, D, seed=i)
        k = seeded_tensor(total_k, HKV, D, seed=50 + i)
        v = seeded_tensor(total_k, HKV, D, seed=60 + i)
        if nan_key:  # the last key of the pack: rows before it do not see it (causal)
            k[-1, 0, 0] = float("nan")
        cu_q = cu_seqlens(lens)
        if bad_third and i == 2:
            cu_q = cu_q.flip(0).contiguous()  # decreasing: the value checks raise
        cu_k = cu_q if lens_k is None else cu_seqlens(lens_k)
        max_q, max_k = (max(lens), max(lens_k or lens)) if max_given else (None, None)
        return lambda: portattn.varlen_attention(
            q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True, **kw
        )

    return make


@pytest.mark.parametrize(
    "case",
    [
        dict(lens=[1, 17, 0, 63], causal=True),  # value checks at launch, cu_q is cu_k
        dict(lens=[5, 17], max_given=False, kernel="fixed_order"),
        dict(lens=[5, 17], lens_k=[9, 3], causal=True),  # two cu_seqlens tensors
        dict(lens=[17, 40], causal=True, nan_key=True),  # the repair pass replayed too
        dict(lens=[5, 17], causal=True, bad_third=True),  # a replayed call's checks raise
    ],
)
def test_varlen_replays_give_the_planned_bytes(monkeypatch, case):
    with torch.no_grad():
        planned, replayed, plans = _runs(monkeypatch, _varlen_call(**case))
    _same_bits(planned, replayed)
    assert plans == 1


def test_one_tensor_in_two_places_is_its_own_replay(monkeypatch):
    """A template kept from a call that passed one cu_seqlens tensor as both (self-attention)
    puts that tensor in both places; a later call of the same shapes with two tensors gets
    its own template, not that one (the replay key holds which inputs are one tensor)."""
    self_attention = _varlen_call([5, 17], causal=True)
    cross = _varlen_call([5, 17], lens_k=[17, 5], causal=True)

    def make(i):
        return (self_attention if i % 2 == 0 else cross)(i)

    with torch.no_grad():
        planned, replayed, plans = _runs(monkeypatch, make, calls=4)
    _same_bits(planned, replayed)
    assert plans == 2
    assert not torch.equal(replayed[0][0], replayed[1][0])  # the key lengths differ


def test_other_lengths_of_one_signature_are_their_own_replay(monkeypatch):
    """Calls with the same q, k, v layouts (one checked signature) but another longest
    sequence or another batch size launch other grids: each gets its own template (with the
    longest sequences first, a replay of the shorter ones' grid would leave rows unwritten)."""
    packs = ([11, 11], [5, 17], [22], [11, 0, 11], [11, 11])

    def make(i):
        return _varlen_call(packs[i], causal=True)(i)

    with torch.no_grad():
        planned, replayed, plans = _runs(monkeypatch, make, calls=len(packs))
    _same_bits(planned, replayed)
    assert plans == 4


def test_value_checks_that_passed_are_not_run_again():
    """The launch-time value checks of a pack that passed them (the same tensors at the same
    versions, the same sizes) have nothing to run (``value_checks`` is None: no launch hook);
    other sizes, or a write to ``cu_seqlens`` (a new version), run them again, and bad values
    raise before any launch, through the public call too."""
    q, k, v = seeded_tensor(22, HQ, D), seeded_tensor(22, HKV, D), seeded_tensor(22, HKV, D)
    cu = cu_seqlens([5, 17])
    check = forward_replay.value_checks(q, k, cu, cu, None, 17, 17)
    assert check is not None
    check()
    assert forward_replay.value_checks(q, k, cu, cu, None, 17, 17) is None
    assert forward_replay.value_checks(q, k, cu, cu, None, 18, 17) is not None
    with torch.no_grad():
        for _ in range(3):  # the third call launches its signature's kept template
            portattn.varlen_attention(q, k, v, cu, cu, 17, 17, causal=True)
        cu[1] = 23  # in place: decreasing offsets, a new version
        assert forward_replay.value_checks(q, k, cu, cu, None, 17, 17) is not None
        with pytest.raises(ValueError, match="cu_seqlens"):
            portattn.varlen_attention(q, k, v, cu, cu, 17, 17, causal=True)


def test_calls_with_sinks_are_planned(monkeypatch):
    """Sinks are a tensor among the launch's parameters: such calls plan every time."""
    sinks = seeded_tensor(HQ, dtype=torch.float32, seed=7)
    make = _varlen_call([5, 17], causal=True, sinks=sinks)
    with torch.no_grad():
        planned, replayed, plans = _runs(monkeypatch, make)
    _same_bits(planned, replayed)
    assert plans == 3  # each call planned


def _training_call(lens, kernel="varlen", **kw):
    """A forward and backward through varlen_attention with q/k/v requiring grad (the eager
    autograd path, ``ops.EagerAttention``): out, lse and the three gradients."""

    def make(i):
        total = sum(lens)
        q, k, v = (
            seeded_tensor(total, h, D, seed=70 + 3 * i + j).requires_grad_()
            for j, h in enumerate((HQ, HKV, HKV))
        )
        dout = seeded_tensor(total, HQ, D, seed=90 + i)
        cu = cu_seqlens(lens)

        def call():
            out, lse = portattn.varlen_attention(
                q, k, v, cu, cu, return_lse=True, kernel=kernel, **kw
            )
            loss = (out.float() * dout.float()).sum() + lse.sum()
            return (out.detach(), lse.detach(), *torch.autograd.grad(loss, (q, k, v)))

        return call

    return make


@pytest.mark.parametrize("kernel", ["varlen", "fixed_order"])
def test_training_forward_replays_give_the_planned_bytes(monkeypatch, kernel):
    """With a backward to come, the forward's launches are replayed too (fixed_order's float32
    output among them): the same out, lse and gradients."""
    planned, replayed, plans = _runs(
        monkeypatch, _training_call([1, 17, 40], kernel=kernel, causal=True)
    )
    _same_bits(planned, replayed)
    assert plans == 1
