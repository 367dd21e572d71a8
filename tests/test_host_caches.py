"""The eager calls' host shortcuts give what the long way gives.

* ``plan.plan_problem``'s problems and their memos: a changed shape, stride, dtype, option or
  size is never planned from a stale entry.
* ``flash_attn_with_kvcache``'s append (fewer index ops) and its checks once per tensor
  version: an in-place write to ``cache_seqlens`` moves the append and the checks with it.
* ``tensor_memo.derived`` (a step's ``cu_seqlens_k``, the append's slots, kept per version of
  ``cache_seqlens`` / ``block_table``): every write through PyTorch, another tensor or int,
  another new-key count derives anew; ``forget_host_values`` drops them.
* The lse scratch of calls that drop their lse: a returned or saved lse is never the scratch.

The direct calls (no custom-op dispatch) are tests/test_direct_calls.py's.
"""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, assert_same_results, cu_seqlens, seeded_tensor

import portattn
from benchmarks.aten_ops import top_level_aten_ops
from portattn.kernels import buffers, plan

HQ, HKV, D, PAGE = 4, 2, 32, 16


def test_plan_problem_follows_every_key_field():
    """A cached problem is handed out only for the same signature: each changed field gives a
    problem of its own, equal to one planned with no cache."""
    from portattn.options import AttentionOptions

    opts = AttentionOptions(causal=False, softmax_scale=0.125)
    base = dict(
        q=seeded_tensor(10, HQ, D), k=seeded_tensor(12, HKV, D), cu=cu_seqlens([4, 6]), mq=6, mk=7
    )
    changes = {
        "shape": dict(q=seeded_tensor(11, HQ, D)),
        "kv shape": dict(k=seeded_tensor(13, HKV, D)),
        "dtype": dict(q=seeded_tensor(10, HQ, D, dtype=torch.float16)),
        "batch": dict(cu=cu_seqlens([4, 3, 3])),
        "max_seqlen": dict(mq=7),
        "option": dict(opts=AttentionOptions(causal=True, softmax_scale=0.125)),
        "window": dict(opts=AttentionOptions(False, 0.125, window_left=3)),
        "kernel": dict(opts=AttentionOptions(False, 0.125, kernel="fixed_order")),
    }
    plan.forget_problems()

    def problem(a):
        return plan.plan_problem(a["q"], a["k"], a["cu"], a["mq"], a["mk"], a.get("opts", opts))

    first = problem(base)
    assert problem(base) is first  # the same signature: the same problem, memo included
    for name, change in changes.items():
        cached = problem({**base, **change})
        plan.forget_problems()
        fresh = problem({**base, **change})
        assert cached == fresh and cached != first, name
        assert cached.options == fresh.options, name


def test_plan_problem_with_sinks_is_not_cached():
    """Options with sinks (a tensor) are planned per call: the problem holds this call's."""
    from portattn.options import AttentionOptions

    q, k, cu = seeded_tensor(10, HQ, D), seeded_tensor(12, HKV, D), cu_seqlens([4, 6])
    sinks = [torch.zeros(HQ), torch.ones(HQ)]
    problems = [
        plan.plan_problem(q, k, cu, 6, 7, AttentionOptions(False, 0.125, sinks=s)) for s in sinks
    ]
    assert [p.options.sinks for p in problems] == sinks


def test_decode_follows_strides_and_options():
    """The same shapes with another layout (a strided cache), another option (causal,
    softcap) or dtype: each call gives the bits of the same call after the caches are
    dropped."""
    k_cache, v_cache = seeded_tensor(6, PAGE, HKV, D), seeded_tensor(6, PAGE, HKV, D, seed=2)
    wide_k = seeded_tensor(6, PAGE, HKV + 1, D)[:, :, :HKV]  # another head stride, same shape
    wide_k.copy_(k_cache)
    table = torch.tensor([[4, 0, 2]], dtype=torch.int32, device=DEVICE)
    q = seeded_tensor(1, 2, HQ, D, seed=5)
    variants = [
        dict(k_cache=k_cache, causal=True),
        dict(k_cache=wide_k, causal=True),
        dict(k_cache=k_cache, causal=False),
        dict(k_cache=k_cache, causal=True, softcap=3.0),
    ]

    def call(k_cache, **kw):
        return portattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=30, block_table=table, **kw
        )

    with torch.no_grad():
        for kw in variants:
            warm = call(**kw)
            plan.forget_problems()
            assert torch.equal(warm, call(**kw)), kw
        half = [call(**variants[0]), call(**variants[2])]
        assert not torch.equal(*half)  # the option reached the kernel


@pytest.mark.parametrize("seqlens_kind", ["tensor", "int"])
@pytest.mark.parametrize("layout", ["paged", "dense", "dense_idx"])
def test_append_follows_cache_seqlens(seqlens_kind, layout):
    """Decode steps that advance ``cache_seqlens`` (in place, as engines do, or as an int):
    each step appends at its new position and attends to it, as a fresh cache built with the
    same keys does; the checks move with the tensor's version (a step past the cache raises)."""
    steps, start, batch = 3, 14, 2  # crosses a page boundary at 16
    if layout == "paged":
        k_cache, v_cache = seeded_tensor(6, PAGE, HKV, D), seeded_tensor(6, PAGE, HKV, D, seed=2)
        extra = dict(block_table=torch.tensor([[0, 2], [1, 4]], dtype=torch.int32, device=DEVICE))
        capacity = 2 * PAGE
    else:
        k_cache, v_cache = (
            seeded_tensor(3, 2 * PAGE, HKV, D),
            seeded_tensor(3, 2 * PAGE, HKV, D, seed=2),
        )
        idx = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
        extra = dict(cache_batch_idx=idx) if layout == "dense_idx" else {}
        capacity = 2 * PAGE
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    lens = torch.full((batch,), start, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        for step in range(steps):
            new_k, new_v = (
                seeded_tensor(batch, 1, HKV, D, seed=10 + step),
                seeded_tensor(batch, 1, HKV, D),
            )
            q = seeded_tensor(batch, 1, HQ, D, seed=20 + step)
            seqlens = lens if seqlens_kind == "tensor" else start + step
            out = portattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens, causal=True, **extra
            )
            pos = start + step
            for b in range(batch):
                if layout == "paged":
                    row, slot = extra["block_table"][b, pos // PAGE], pos % PAGE
                else:
                    row, slot = (idx[b] if layout == "dense_idx" else b), pos
                expect_k[row, slot], expect_v[row, slot] = new_k[b, 0], new_v[b, 0]
            assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v), step
            plan.forget_problems()
            fresh = portattn.flash_attn_with_kvcache(
                q, expect_k.clone(), expect_v.clone(), cache_seqlens=pos + 1, causal=True, **extra
            )
            assert torch.equal(out, fresh), step
            lens += 1  # in place: a new version of cache_seqlens
        lens.fill_(capacity)
        if seqlens_kind == "tensor":
            with pytest.raises(ValueError, match="more than its cache holds"):
                portattn.flash_attn_with_kvcache(
                    q, k_cache, v_cache, new_k, new_v, cache_seqlens=lens, **extra
                )


def test_lse_scratch_never_reaches_a_caller():
    """Calls that drop the lse write it to a shared scratch buffer; an lse that is returned,
    or saved for a backward, is a buffer of its own: a later call that drops its lse leaves
    it (and the gradient computed from it) as it was."""
    from portattn.kernels import buffers

    lens = [5, 9]
    q, k, v = (
        seeded_tensor(14, HQ, D),
        seeded_tensor(14, HKV, D, seed=1),
        seeded_tensor(14, HKV, D, seed=2),
    )
    q2 = seeded_tensor(14, HQ, D, seed=3)
    cu = cu_seqlens(lens)

    def call(query, **kw):
        return portattn.varlen_attention(query, k, v, cu, cu, 9, 9, causal=True, **kw)

    with torch.no_grad():
        out_only = call(q)
        out, lse = call(q, return_lse=True)
        kept = lse.clone()
        assert torch.equal(out_only, out)
        assert (q.device, 14, HQ) in buffers._LSE_SCRATCH  # cuda:0, not torch.device("cuda")
        scratch = buffers._LSE_SCRATCH[(q.device, 14, HQ)]
        assert lse.data_ptr() != scratch.data_ptr()
        call(q2)  # writes the scratch
        assert torch.equal(lse, kept)
        dense_q = q.view(1, 14, HQ, D)
        dense_kv = k.view(1, 14, HKV, D), v.view(1, 14, HKV, D)
        dense_out = portattn.attention(dense_q, *dense_kv, causal=True)
        dense_out2, _ = portattn.attention(dense_q, *dense_kv, causal=True, return_lse=True)
        assert torch.equal(dense_out, dense_out2)
    qg = q.clone().requires_grad_()
    out_g = call(qg)
    expected = torch.autograd.grad(out_g.float().sum(), qg)[0]
    out_g = call(qg)
    with torch.no_grad():
        call(q2)  # same shape, lse dropped: must not write the lse saved for the backward
    assert torch.equal(torch.autograd.grad(out_g.float().sum(), qg)[0], expected)


def _paged_call(lens, table, new_kv=True, seed=0):
    """A paged decode call on fresh caches (the same for the same seed); returns the output,
    the lse and both caches."""
    k_cache, v_cache = (
        seeded_tensor(8, PAGE, HKV, D, seed=seed),
        seeded_tensor(8, PAGE, HKV, D, seed=seed + 1),
    )
    new = (seeded_tensor(2, 1, HKV, D, seed=seed + 2), seeded_tensor(2, 1, HKV, D, seed=seed + 3))
    out, lse = portattn.flash_attn_with_kvcache(
        seeded_tensor(2, 1, HQ, D, seed=seed + 4),
        k_cache,
        v_cache,
        *(new if new_kv else (None, None)),
        cache_seqlens=lens,
        block_table=table,
        causal=True,
        return_softmax_lse=True,
    )
    return out, lse, k_cache, v_cache


def _fresh(lens, table, **kw):
    """The same call with index tensors no call has seen, after every memo is dropped."""
    from portattn import validation

    validation.forget_host_values()
    plan.forget_problems()
    fresh_lens = lens if isinstance(lens, int) else lens.clone()
    return _paged_call(fresh_lens, table.clone(), **kw)


@pytest.mark.parametrize("new_kv", [True, False])
@pytest.mark.parametrize(
    "change", ["lens_in_place", "table_in_place", "new_lens_tensor", "int_value", "view_write"]
)
def test_derived_index_tensors_follow_their_sources(change, new_kv):
    """cu_seqlens_k and the append's slots, kept per version of cache_seqlens / block_table
    (or per int value): every write to them through PyTorch, and every other tensor, gives the
    bits of a call that derives everything anew."""
    from portattn import tensor_memo

    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=DEVICE)
    lens = 14 if change == "int_value" else torch.tensor([15, 3], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        first = _paged_call(lens, table, new_kv)
        # the step's index tensors, cu_seqlens_k among them, kept (kvcache._step_indices)
        assert any(key[0] == "kvcache_step" for key in tensor_memo._DERIVED)
        again = _paged_call(lens, table, new_kv)  # the kept tensors: the same bits
        assert_same_results(first, again)
        if change == "lens_in_place":
            lens += 2  # crosses a page for sequence 0
        elif change == "table_in_place":
            table[0, 1] = 6  # sequence 0's page of position 16
            lens += 1
        elif change == "new_lens_tensor":
            lens = torch.tensor([16, 4], dtype=torch.int32, device=DEVICE)
        elif change == "int_value":
            lens = 17
        else:  # a write through a view bumps the shared version counter
            lens[1:].add_(5)
        got = _paged_call(lens, table, new_kv)
        want = _fresh(lens, table, new_kv=new_kv)
    assert_same_results(got, want)
    assert not torch.equal(got[0], first[0])  # the change reached the kernel


def test_derived_index_tensors_other_new_counts_and_inference_tensors():
    """One cache_seqlens version with another number of new keys derives anew; an inference
    tensor (no version counter) is derived from every call, so its in-place writes count."""
    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=DEVICE)
    with torch.inference_mode():
        lens = torch.tensor([15, 3], dtype=torch.int32, device=DEVICE)
        _paged_call(lens, table)
        lens += 1
        got = _paged_call(lens, table)
        want = _fresh(lens, table)
    assert_same_results(got, want)
    lens = torch.tensor([15, 3], dtype=torch.int32, device=DEVICE)
    k_cache, v_cache = seeded_tensor(8, PAGE, HKV, D), seeded_tensor(8, PAGE, HKV, D, seed=1)
    with torch.no_grad():
        for new in (1, 3, 1):
            kv = (
                seeded_tensor(2, new, HKV, D, seed=new),
                seeded_tensor(2, new, HKV, D, seed=new + 1),
            )
            expect_k, expect_v = k_cache.clone(), v_cache.clone()
            q = seeded_tensor(2, 1, HQ, D)
            out = portattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, *kv, cache_seqlens=lens, block_table=table
            )
            plan.forget_problems()
            from portattn import validation

            validation.forget_host_values()
            fresh = portattn.flash_attn_with_kvcache(
                q, expect_k, expect_v, *kv, cache_seqlens=lens.clone(), block_table=table.clone()
            )
            assert torch.equal(out, fresh) and torch.equal(k_cache, expect_k), new
            assert torch.equal(v_cache, expect_v), new


def test_forget_host_values_drops_derived_index_tensors():
    """A write behind PyTorch's back (``.data``) leaves the version counter as it was: the
    kept tensors are stale until ``validation.forget_host_values()``, which drops them."""
    from portattn import tensor_memo, validation

    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([15, 3], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        _paged_call(lens, table, new_kv=False)
        version = lens._version
        lens.data.add_(1)
        assert lens._version == version  # unseen by the version counter
        validation.forget_host_values()
        assert not tensor_memo._DERIVED
        got = _paged_call(lens, table, new_kv=False)
        want = _fresh(lens, table, new_kv=False)
    assert_same_results(got, want)


@pytest.mark.parametrize("change", ["page_outside", "too_many_keys", "negative_length"])
def test_kept_value_checks_follow_in_place_writes(change):
    """flash_attn_with_kvcache checks the index tensors' values once per version (a decode
    step's layers share them): a call after an in-place write to a bad value raises as the
    first call would, and writes nothing."""
    from portattn.validation import CacheIndexError

    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([15, 3], dtype=torch.int32, device=DEVICE)
    k_cache, v_cache = seeded_tensor(8, PAGE, HKV, D), seeded_tensor(8, PAGE, HKV, D, seed=1)
    q, new = seeded_tensor(2, 1, HQ, D), seeded_tensor(2, 1, HKV, D, seed=2)
    with torch.no_grad():
        for _ in range(2):  # checked, then kept
            portattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, new, new, cache_seqlens=lens, block_table=table
            )
        before = k_cache.clone()
        if change == "page_outside":
            table[0, 0] = 8
        elif change == "too_many_keys":
            lens[1] = 3 * PAGE
        else:
            lens[0] = -1
        error = ValueError if change == "negative_length" else CacheIndexError
        with pytest.raises(error):
            portattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, new, new, cache_seqlens=lens, block_table=table
            )
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize("paged", [False, True])
def test_kept_varlen_value_checks_follow_in_place_writes(paged):
    """varlen_attention checks cu_seqlens' values once per version and sizes: a decreasing
    cu_seqlens written in place after two good calls raises."""
    cu = cu_seqlens([5, 11])
    q = seeded_tensor(16, HQ, D)
    if paged:
        k = seeded_tensor(4, PAGE, HKV, D)
        table = torch.tensor([[0], [1]], dtype=torch.int32, device=DEVICE)
        kv = dict(block_table=table)
        cu_k = cu_seqlens([5, 11])
    else:
        k, kv, cu_k = seeded_tensor(16, HKV, D), {}, cu
    with torch.no_grad():
        for _ in range(2):
            portattn.varlen_attention(q, k, k, cu, cu_k, 11, 11, **kv)
        cu[1] = 12  # sequences of 12 and 4: longer than max_seqlen_q
        with pytest.raises(ValueError, match="max_seqlen_q"):
            portattn.varlen_attention(q, k, k, cu, cu_k, 11, 11, **kv)
        cu[1] = 17  # 0, 17, 16
        with pytest.raises(ValueError, match="non-decreasing"):
            portattn.varlen_attention(q, k, k, cu, cu_k, 11, 11, **kv)


def test_kvcache_checks_kept_per_call_signature(monkeypatch):
    """``flash_attn_with_kvcache`` checks a call's layouts and options once per signature
    (kvcache._CHECKED_CALLS): new rows at new addresses, as each decode step brings, are not
    checked again but for their memory; a change the checks read is checked, and still
    raises before anything is written; the kept records hold no tensor."""
    import gc
    import weakref

    from portattn import kvcache

    checked = []
    real = kvcache._check_call
    monkeypatch.setattr(kvcache, "_check_call", lambda *a: checked.append(1) or real(*a))
    kvcache._CHECKED_CALLS.clear()
    n_pages = 4
    # The caches are views of one buffer, whose tail is not cache: rows placed there, or on
    # a cache, have the layout of rows of their own.
    cache_elems = n_pages * PAGE * HKV * D
    buffer = seeded_tensor(2 * cache_elems + 2 * HKV * D, seed=5)
    k_cache = buffer[:cache_elems].view(n_pages, PAGE, HKV, D)
    v_cache = buffer[cache_elems : 2 * cache_elems].view(n_pages, PAGE, HKV, D)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    q = seeded_tensor(2, 1, HQ, D, seed=1)

    caches = [k_cache, v_cache]

    def call(new_k, new_v, q=q):
        return portattn.flash_attn_with_kvcache(
            q, *caches, new_k, new_v, cache_seqlens=lens, block_table=table
        )

    with torch.no_grad():
        for step in range(3):  # fresh rows each step: one check of the signature
            call(seeded_tensor(2, 1, HKV, D, seed=step), seeded_tensor(2, 1, HKV, D, seed=9))
        assert len(checked) == 1
        tail = buffer[2 * cache_elems :].view(2, 1, HKV, D)  # apart from the caches
        call(tail, seeded_tensor(2, 1, HKV, D))
        assert len(checked) == 1
        before = buffer.clone()
        for where in (0, cache_elems + HKV * D):  # rows of one layout, on k_cache / v_cache
            on_cache = buffer[where : where + 2 * HKV * D].view(2, 1, HKV, D)
            with pytest.raises(ValueError, match="share memory"):
                call(on_cache, seeded_tensor(2, 1, HKV, D))
            assert torch.equal(buffer, before)  # nothing written
        assert len(checked) == 1  # the layout was kept; its memory was checked
    q_grad = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="inference-only"):
        call(seeded_tensor(2, 1, HKV, D), seeded_tensor(2, 1, HKV, D), q=q_grad)
    assert len(checked) == 2 and torch.equal(buffer, before)
    alive = weakref.ref(buffer)
    caches.clear()
    del buffer, k_cache, v_cache, tail, on_cache, before
    gc.collect()
    assert alive() is None  # the kept records hold no tensor


@pytest.mark.parametrize("append", [True, False])
def test_a_repeated_decode_call_issues_three_aten_ops(monkeypatch, append):
    """A decode call like the last one (the layers of a step) issues q's reshape, out's
    allocation and its view, and nothing else: the append is a kernel launch, the index
    tensors and checks are kept (each aten op costs a GPU host 12-50 µs, perf-notes row 66).
    Under the interpreter the launches are stubbed (it runs a kernel with aten ops)."""
    if DEVICE == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        monkeypatch.setattr(InterpretedFunction, "run", lambda *args, **kwargs: None)
    k_cache, v_cache = seeded_tensor(4, PAGE, HKV, D), seeded_tensor(4, PAGE, HKV, D, seed=2)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    q = seeded_tensor(2, 1, HQ, D, seed=1)
    new = (seeded_tensor(2, 1, HKV, D, seed=3), seeded_tensor(2, 1, HKV, D, seed=4))

    def call():
        with torch.no_grad():
            portattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, *(new if append else (None, None)),
                cache_seqlens=lens, block_table=table,
            )  # fmt: skip

    call()
    ops = top_level_aten_ops(call)
    alloc = "aten::full" if buffers.POISON else "aten::empty"  # NaN-filled under the tests
    assert sorted(ops) == sorted([alloc, "aten::reshape", "aten::view"]), ops


def test_ramps_keep_the_newest_once_full(monkeypatch):
    """``tensor_memo.ramp`` keeps its newest ramps once full (a cache growing by a token a step
    asks for a new ``cu_seqlens_k`` each step, and each layer of the step reads it again): the
    oldest goes, a new one is kept, every ramp holds ``arange(length) * step``."""
    from portattn import tensor_memo

    monkeypatch.setattr(tensor_memo, "_RAMPS", {})
    monkeypatch.setattr(tensor_memo, "_RAMPS_MAX", 4)
    device = torch.device(DEVICE)
    made = [tensor_memo.ramp(2, step, device, False) for step in range(1, 7)]
    assert len(tensor_memo._RAMPS) == 4
    assert tensor_memo.ramp(2, 6, device, False) is made[-1]  # the newest: kept
    assert tensor_memo.ramp(2, 1, device, False) is not made[0]  # the oldest: made again
    for step, r in enumerate(made, start=1):
        assert r.dtype == torch.int32 and r.tolist() == [0, step]
    assert tensor_memo.ramp(2, 6, device, True) is not made[-1]  # capturing: never kept
