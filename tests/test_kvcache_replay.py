"""``flash_attn_with_kvcache``'s kept launches (``forward_entry.run_kept_forward``): a decode loop
on the same caches (one call signature) launches the forward's kept template from its second
call on, with the planned path's bytes.

Each case runs a loop of calls twice, with the replay off (``forward_replay.REPLAYED_FORWARDS``:
every call plans) and on, on fresh copies of the same caches, and compares every output and the
caches after the loop bit for bit (NaN included); it counts the calls that went through the
forward entry without a kept template (``forward_entry.templated_forward``) with the replay on.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import DEVICE, seeded_tensor

import portattn
from portattn import configs, forward_entry, forward_replay
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


def _compare(monkeypatch, make, steps: int = 4) -> int:
    """Run ``steps`` calls with the replay off, then on; assert equal bits; return how many
    calls with the replay on went through ``forward_entry.templated_forward``."""
    entered: list[int] = []
    real = forward_entry.templated_forward

    def counted(*args, **kwargs):
        entered.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_entry, "templated_forward", counted)
    results = {}
    for replay in (False, True):
        monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", replay)
        plan.forget_problems()
        entered.clear()
        step, caches = make()
        with torch.no_grad():
            outs = [step(i) for i in range(steps)]
        results[replay] = (outs, caches)
    for a, b in zip(results[False][0], results[True][0], strict=True):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,),
                        strict=True):  # fmt: skip
            assert torch.equal(_bits(x), _bits(y))
    for x, y in zip(results[False][1], results[True][1], strict=True):
        assert torch.equal(_bits(x), _bits(y))
    return len(entered)


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
    assert _compare(monkeypatch, _decode_loop(**case)) == 1  # the first call only


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

    entered = _compare(monkeypatch, _decode_loop(dense=True, append=False, batch_idx=batch_idx))
    assert entered == 2  # one per layout of cache_batch_idx


def test_forgotten_problems_and_a_changed_entry_plan_again(monkeypatch):
    """``plan.forget_problems()`` and a configuration entry that changed (a patched table, a
    family override) make the next call plan: its template is not launched."""
    monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", True)
    entered: list[int] = []
    real = forward_entry.templated_forward
    monkeypatch.setattr(
        forward_entry, "templated_forward", lambda *a, **k: entered.append(1) or real(*a, **k)
    )
    step, _ = _decode_loop(append=False)()
    with torch.no_grad():
        step(0)
        step(1)
        assert len(entered) == 1
        plan.forget_problems()
        step(2)
        assert len(entered) == 2
        step(3)
        assert len(entered) == 2
        table = configs.config_table()
        for key, cfg in list(table.items()):  # another entry (as test_unseen_keys patches it)
            if key[0] == configs.INTERPRETER:
                monkeypatch.setitem(table, key, dataclasses.replace(cfg, repair_products=1))
        step(4)
        assert len(entered) == 3
        step(5)
        assert len(entered) == 3
