"""``flash_attn_with_kvcache``'s kept launches (``forward_entry.run_kept_forward``): a decode loop
on the same caches (one call signature) launches the forward's kept template from its second call on
(the first keeps its launches), with the planned path's bytes.

Each case runs a loop of calls twice, with the replay off (``forward_replay.REPLAYED_FORWARDS``:
every call plans) and on, on fresh copies of the same caches, and compares every output and the
caches after the loop bit for bit (NaN included); it counts the calls that went through the
forward entry's kept path (``forward_entry.launch_template``) with the replay on.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import DEVICE, seeded_tensor

import portattn
from portattn import configs, forward_entry, forward_replay, kvcache
from portattn.kernels import plan

HQ, HKV, D, PAGE, PAGES = 4, 2, 32, 16, 8
_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_VIEW[t.dtype])


def _decode_loop(dense=False, append=True, int_lens=False, batch_idx=None, **kw):
    """A call maker: ``make()`` builds the caches and returns ``step(i)``, one decode call
    (new q and new rows each step, the lengths bumped in place as engines do)."""

    def make():
        k_cache = seeded_tensor(PAGES, PAGE, HKV, D, seed=1)
        v_cache = seeded_tensor(PAGES, PAGE, HKV, D, seed=2)
        table = torch.tensor([[3, 1, 0], [2, 5, 7], [4, 6, 0]], dtype=torch.int32, device=DEVICE)
        if dense:  # [B_cache, S_cache, Hkv, D]
            k_cache = k_cache[:6].reshape(3, 2 * PAGE, HKV, D)
            v_cache = v_cache[:6].reshape(3, 2 * PAGE, HKV, D)
            table = None
        lens = torch.tensor([16, 3, 0], dtype=torch.int32, device=DEVICE)

        def step(i):
            new = (None, None)
            if append:
                new = (seeded_tensor(3, 1, HKV, D, seed=30 + i),
                       seeded_tensor(3, 1, HKV, D, seed=40 + i))  # fmt: skip
            out = portattn.flash_attn_with_kvcache(
                seeded_tensor(3, 1, HQ, D, seed=50 + i),
                k_cache,
                v_cache,
                *new,
                cache_seqlens=5 + i if int_lens else lens,
                cache_batch_idx=None if batch_idx is None else batch_idx(i),
                block_table=table,
                causal=True,
                **kw,
            )
            if append:
                lens.add_(1)
            return out

        return step, (k_cache, v_cache)

    return make


def _spy_kept_launches(monkeypatch) -> list[int]:
    """A list that gets a 1 for each forward launched from a kept template
    (``forward_entry.launch_template``: the kept path's launch, past any lookup)."""
    launched: list[int] = []
    real = forward_entry.launch_template

    def counted(*args, **kwargs):
        launched.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_entry, "launch_template", counted)
    return launched


def _fresh_call_records(monkeypatch) -> None:
    """No call record of an earlier test: on a GPU the caching allocator may hand a test's
    caches the addresses (so the call signature) of an earlier test's, whose record then
    holds kept launches already (correct to launch, but not what the test counts)."""
    monkeypatch.setattr(kvcache, "_CHECKED_CALLS", {})


def _compare(monkeypatch, make, steps: int = 4) -> list[bool]:
    """Run ``steps`` calls with the replay off, then on; assert equal bits; return which calls
    with the replay on launched a kept template."""
    launched = _spy_kept_launches(monkeypatch)
    _fresh_call_records(monkeypatch)
    results, kept = {}, []
    for replay in (False, True):
        monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", replay)
        plan.forget_problems()
        kvcache._CHECKED_CALLS.clear()
        step, caches = make()
        outs = []
        with torch.no_grad():
            for i in range(steps):
                before = len(launched)
                outs.append(step(i))
                kept.append(len(launched) > before)
        results[replay] = (outs, caches)
    for a, b in zip(results[False][0], results[True][0], strict=True):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,),
                        strict=True):  # fmt: skip
            assert torch.equal(_bits(x), _bits(y))
    for x, y in zip(results[False][1], results[True][1], strict=True):
        assert torch.equal(_bits(x), _bits(y))
    assert not any(kept[:steps])  # the replay off: nothing kept
    return kept[steps:]


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(append=False, return_softmax_lse=True),
        dict(kernel="fixed_order"),
        dict(window_size=(5, 0), softcap=8.0),
        dict(dense=True),
        dict(int_lens=True, append=False),
    ],
    ids=["paged", "lse", "fixed_order", "window_softcap", "dense", "int_lens"],
)
def test_decode_loop_replays_the_planned_bytes(monkeypatch, case):
    kept = _compare(monkeypatch, _decode_loop(**case))
    assert kept[1:] and all(kept[1:])  # from the second call (the first keeps its launches)


def test_cache_batch_idx_layouts_are_told_apart(monkeypatch):
    """A dense cache's block table is a view of ``cache_batch_idx``, whose strides the call
    signature does not hold: a strided index tensor after a contiguous one is a new template
    (launched with the old one's strides, it would read other cache rows)."""

    def batch_idx(i):
        rows = torch.tensor([[2, 0, 1], [1, 2, 0]][i % 2], dtype=torch.int32, device=DEVICE)
        if i % 2:
            wide = torch.zeros(6, dtype=torch.int32, device=DEVICE)
            wide[::2] = rows
            rows = wide[::2]  # stride 2
        return rows

    kept = _compare(monkeypatch, _decode_loop(dense=True, append=False, batch_idx=batch_idx))
    assert kept == [False, False, True, True]  # each layout keeps its own, from its first call


def test_forgotten_problems_and_a_changed_entry_plan_again(monkeypatch):
    """``plan.forget_problems()`` and a configuration entry that changed (a patched table, a
    family override) make the next call plan: its template is not launched."""
    monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", True)
    launched = _spy_kept_launches(monkeypatch)
    _fresh_call_records(monkeypatch)
    step, _ = _decode_loop(append=False)()

    def kept(i) -> bool:
        before = len(launched)
        step(i)
        return len(launched) > before

    with torch.no_grad():
        assert [kept(i) for i in range(3)] == [False, True, True]
        plan.forget_problems()
        assert [kept(i) for i in range(3, 5)] == [False, True]
        table = configs.config_table()
        for key, cfg in list(table.items()):  # another entry, whatever the device's family
            other = 1 if cfg.repair_products == 2 else 2
            monkeypatch.setitem(table, key, dataclasses.replace(cfg, repair_products=other))
        assert [kept(i) for i in range(5, 7)] == [False, True]


def test_int_cache_seqlens_append_is_kept_and_writes_as_a_tensor(monkeypatch):
    """A paged append with an int ``cache_seqlens`` keeps its launch in the call's record as
    a tensor's does (the int as a kept int32 [B] tensor, ``kvcache_append.int_lengths``), and
    writes and attends as the same lengths given as a tensor."""
    table = torch.tensor([[3, 1, 0], [2, 5, 7], [4, 6, 0]], dtype=torch.int32, device=DEVICE)
    results = {}
    for as_int in (False, True):
        _fresh_call_records(monkeypatch)
        k_cache = seeded_tensor(PAGES, PAGE, HKV, D, seed=1)
        v_cache = seeded_tensor(PAGES, PAGE, HKV, D, seed=2)
        outs = []
        with torch.no_grad():
            for i in range(4):
                lens = 5 + i
                seqlens = lens if as_int else torch.full((3,), lens, dtype=torch.int32,
                                                         device=DEVICE)  # fmt: skip
                outs.append(portattn.flash_attn_with_kvcache(
                    seeded_tensor(3, 1, HQ, D, seed=50 + i), k_cache, v_cache,
                    seeded_tensor(3, 1, HKV, D, seed=30 + i),
                    seeded_tensor(3, 1, HKV, D, seed=40 + i),
                    cache_seqlens=seqlens, block_table=table, causal=True,
                ))  # fmt: skip
        results[as_int] = (*outs, k_cache, v_cache)
        slots = [slot for record in kvcache._CHECKED_CALLS.values() for slot in record.templates]
        assert ("append", False, (1,)) in slots
    for x, y in zip(results[False], results[True], strict=True):
        assert torch.equal(_bits(x), _bits(y))
