"""Eager calls without the custom op's dispatch give what the op gives.

``forward_entry.direct_call``: an eager call runs the op's implementation without the
dispatcher (with a backward to come, in ``ops.EagerAttention`` with the op's autograd formula):
the same bits, gradients and errors as through ``torch.ops.portattn.varlen_fwd``, and the op
still runs wherever something (a dispatch mode, autocast to another dtype) would act on it. The
op's placeholder out32 and the direct call's None.
"""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, assert_same_results, cu_seqlens, seeded_tensor

import portattn
from portattn import forward_entry
from portattn.kernels import plan

HQ, HKV, D, PAGE = 4, 2, 32, 16


def _both_ways(monkeypatch, call):
    """``call()`` with the direct call on and off (caches dropped before each): its results,
    or the (type, message) of what it raised."""
    results = []
    for direct in (True, False):
        monkeypatch.setattr(forward_entry, "DIRECT_CALLS", direct)
        plan.forget_problems()
        try:
            results.append(call())
        except (TypeError, ValueError, RuntimeError) as err:
            results.append((type(err), str(err)))
    return results


def _varlen(lens, max_q=None, max_k=None, bad_cu=False, **kw):
    q, k, v = (
        seeded_tensor(sum(lens), HQ, D),
        seeded_tensor(sum(lens), HKV, D, seed=1),
        seeded_tensor(sum(lens), HKV, D),
    )
    cu = cu_seqlens(lens)
    if bad_cu:
        cu = cu.flip(0).contiguous()
    return lambda: portattn.varlen_attention(q, k, v, cu, cu, max_q, max_k, return_lse=True, **kw)


@pytest.mark.parametrize(
    "case",
    [
        dict(lens=[5, 17], max_q=17, max_k=17, causal=True),
        dict(lens=[5, 17], causal=False, kernel="fixed_order"),
        dict(lens=[1, 1, 1], max_q=1, max_k=40, window_size=(3, 0), softcap=5.0),
        dict(lens=[5, 17], max_q=17, max_k=17, bad_cu=True),  # raised in the op, before launch
        dict(lens=[5, 17], max_q=3, max_k=17),  # max_seqlen_q too small: checked in the op
    ],
)
def test_direct_call_same_bits_and_errors(monkeypatch, case):
    with torch.no_grad():
        direct, op = _both_ways(monkeypatch, _varlen(**case))
    assert_same_results(direct, op)


def test_direct_call_kvcache_same_bits_and_cache(monkeypatch):
    def run():
        k_cache, v_cache = seeded_tensor(8, PAGE, HKV, D), seeded_tensor(8, PAGE, HKV, D, seed=2)
        table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([16, 3], dtype=torch.int32, device=DEVICE)
        out = portattn.flash_attn_with_kvcache(
            seeded_tensor(2, 1, HQ, D),
            k_cache,
            v_cache,
            seeded_tensor(2, 1, HKV, D, seed=3),
            seeded_tensor(2, 1, HKV, D, seed=4),
            cache_seqlens=lens,
            block_table=table,
            causal=True,
            return_softmax_lse=True,
        )
        return (*out, k_cache, v_cache)

    direct, op = _both_ways(monkeypatch, run)
    assert_same_results(direct, op)


class _Counting(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _record_paths(monkeypatch) -> list[str]:
    used: list[str] = []
    real_op = forward_entry.varlen_fwd
    real_function = forward_entry.EagerAttention
    monkeypatch.setattr(forward_entry, "varlen_fwd", lambda *a: used.append("op") or real_op(*a))
    real_replay = forward_entry.replayed_forward  # the op's implementation, called directly
    monkeypatch.setattr(
        forward_entry,
        "replayed_forward",
        lambda *a, **kw: used.append("impl") or real_replay(*a, **kw),
    )

    class Recorded:
        @staticmethod
        def apply(*args):
            used.append("autograd")
            return real_function.apply(*args)

    monkeypatch.setattr(forward_entry, "EagerAttention", Recorded)
    return used


@pytest.mark.parametrize(
    ("context", "path"),
    [("plain", "impl"), ("grad", "autograd"), ("dispatch_mode", "op"), ("autocast_fp16", "impl")],
)
def test_direct_call_only_when_nothing_acts_on_the_op(monkeypatch, context, path):
    """The op runs wherever a dispatch mode would act on it; with a backward to come, its
    implementation and autograd formula in ``EagerAttention``; the implementation alone
    otherwise (under autocast varlen_attention casts q/k/v itself, so the op's autocast
    kernel would cast nothing)."""
    used = _record_paths(monkeypatch)
    lens = [3, 4]
    q, k, v = seeded_tensor(7, HQ, D), seeded_tensor(7, HKV, D), seeded_tensor(7, HKV, D)
    cu = cu_seqlens(lens)
    if context == "grad":
        q.requires_grad_()
    ctx = {
        "plain": torch.no_grad(),
        "grad": torch.enable_grad(),
        "dispatch_mode": _Counting(),
        "autocast_fp16": torch.autocast(DEVICE, dtype=torch.float16),
    }[context]
    with ctx:
        portattn.varlen_attention(q, k, v, cu, cu, 4, 4)
    assert used == [path]


def _varlen_grads(lens, kernel="varlen", use_lse=True, with_sinks=False, which="qkv", **kw):
    """A forward and backward through varlen_attention: (out, lse, the gradients asked for)."""
    total = sum(lens)
    q, k, v = (
        seeded_tensor(total, HQ, D),
        seeded_tensor(total, HKV, D, seed=1),
        seeded_tensor(total, HKV, D, seed=2),
    )
    dout, dlse = (
        seeded_tensor(total, HQ, D, seed=3),
        seeded_tensor(total, HQ, dtype=torch.float32, seed=4),
    )
    sinks = seeded_tensor(HQ, dtype=torch.float32, seed=5) if with_sinks else None
    inputs = {"q": q, "k": k, "v": v, "sinks": sinks}
    wanted = [inputs[name].requires_grad_() for name in which if inputs[name] is not None]
    if with_sinks:
        wanted.append(sinks.requires_grad_())
    cu = cu_seqlens(lens)
    out, lse = portattn.varlen_attention(
        q, k, v, cu, cu, return_lse=True, kernel=kernel, sinks=sinks, **kw
    )
    loss = (out.float() * dout.float()).sum() + (lse * dlse).sum() * use_lse
    return (out.detach(), lse.detach(), *torch.autograd.grad(loss, wanted))


@pytest.mark.parametrize(
    "case",
    [
        dict(lens=[5, 17, 0, 1], causal=True),
        dict(lens=[5, 17], kernel="fixed_order", use_lse=False),
        dict(lens=[5, 17], kernel="fixed_order", causal=True, with_sinks=True),
        dict(lens=[1, 9, 40], window_size=(3, 0), softcap=5.0, which="k"),
        dict(lens=[9, 40], causal=True, which="v", use_lse=False),
    ],
)
def test_eager_autograd_same_bits_as_the_op(monkeypatch, case):
    """With a backward to come, ``EagerAttention`` gives the op's out, lse and gradients, bit
    for bit (the lse and sinks gradients included), whichever inputs require grad."""
    direct, op = _both_ways(monkeypatch, lambda: _varlen_grads(**case))
    assert_same_results(direct, op)


@pytest.mark.parametrize("direct", [True, False])
def test_eager_autograd_has_no_double_backward(monkeypatch, direct):
    """The backward is not differentiable, whichever path ran the forward: a second backward
    raises, also with allow_unused (never None for a gradient that exists)."""
    monkeypatch.setattr(forward_entry, "DIRECT_CALLS", direct)
    q, k, v = (
        seeded_tensor(7, h, D, seed=s).requires_grad_() for s, h in enumerate((HQ, HKV, HKV))
    )
    cu = cu_seqlens([3, 4])
    out = portattn.varlen_attention(q, k, v, cu, cu, causal=True)
    assert (type(out.grad_fn).__name__ == "EagerAttentionBackward") == direct
    (dq,) = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        torch.autograd.grad(dq.float().sum(), (q, k, v), allow_unused=True)


def test_kvcache_under_autocast_to_another_dtype_runs_the_op(monkeypatch):
    """flash_attn_with_kvcache does not cast: under an autocast to another dtype the op's
    autocast kernel casts q and the caches, so the op runs, as before."""
    used = _record_paths(monkeypatch)
    q, cache = seeded_tensor(1, 1, HQ, D), seeded_tensor(1, PAGE, HKV, D)
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.float16):
        out = portattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=5)
    assert used == ["op"] and out.dtype == torch.float16


def test_op_returns_a_fresh_empty_out32_the_direct_call_none():
    """The op's third output, out32 when not stored, is a new empty [0, Hq, Dv] tensor per
    call; the direct call's implementation makes none."""
    from portattn.ops import FwdArgs, fwd_impl
    from portattn.options import AttentionOptions

    q, k, v = (
        seeded_tensor(7, HQ, D),
        seeded_tensor(7, HKV, D, seed=1),
        seeded_tensor(7, HKV, D, seed=2),
    )
    cu = cu_seqlens([3, 4])
    args = FwdArgs.bind(q, k, v, cu, cu, 4, 4, AttentionOptions(True, 0.125), store_o32=False)
    with torch.no_grad():
        first = torch.ops.portattn.varlen_fwd(*args)
        second = torch.ops.portattn.varlen_fwd(*args)
        out, lse, out32 = fwd_impl(*args)
    assert first[2].shape == (0, HQ, D) and first[2].dtype == torch.float32
    assert first[2] is not second[2]
    assert out32 is None and torch.equal(out, first[0]) and torch.equal(lse, first[1])
