"""The index tensors of a ``flash_attn_with_kvcache`` call captured in a CUDA graph: their
values, and how many kernels make them. A captured call makes its ``cu_seqlens`` anew
(``kvcache._step_indices``: nothing is kept while a graph is captured), and a graph of a decode
step replays those kernels in every layer's call, where each costs about as much GPU time as
the next tiny kernel: the eager calls keep them per tensor version instead (test_host_caches)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.aten_ops import top_level_aten_ops
from portattn.kvcache_append import cache_cu_seqlens
from portattn.tensor_memo import ramp

# aten ops that launch no kernel: an allocation, and views
HOST_ONLY = {"aten::empty", "aten::slice", "aten::view", "aten::as_strided"}


def device_ops(call) -> list[str]:
    """The top-level aten ops of ``call()`` that run a kernel on a GPU."""
    return sorted(op for op in top_level_aten_ops(call) if op not in HOST_ONLY)


def wrapped_cu(counts: list[int]) -> list[int]:
    """0, then the running sums of ``counts``, wrapped to int32 as the kernels read them."""
    sums = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0)
    return sums.to(torch.int32).tolist()


@pytest.mark.parametrize("new", [0, 1, 3])
def test_captured_cu_seqlens_k_from_a_tensor(new):
    """[B + 1]: 0, then the running sum of cache + new keys, int32 (wrapping past 2**31 as the
    int64 sums stored to int32 do), made by a fill and a cumsum (and the add of ``new``)."""
    seqlens = torch.tensor([5, 0, 7, 2**31 - 10, 64], dtype=torch.int32)
    got = cache_cu_seqlens(seqlens, new, 5, "cpu", True)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert got.tolist() == wrapped_cu([n + new for n in seqlens.tolist()])
    want = ["aten::cumsum", "aten::zero_"] + (["aten::add"] if new else [])
    assert device_ops(lambda: cache_cu_seqlens(seqlens, new, 5, "cpu", True)) == sorted(want)
    assert seqlens.tolist() == [5, 0, 7, 2**31 - 10, 64]  # read, never written


@pytest.mark.parametrize("seqlens, new", [(0, 0), (300, 1), (2**29, 2)])
def test_captured_cu_seqlens_k_from_an_int(seqlens, new):
    """An int ``cache_seqlens`` (every sequence alike): one ramp, one kernel where it fits int32
    (the third wraps: its ramp then takes two, as before)."""
    got = cache_cu_seqlens(seqlens, new, 7, "cpu", True)
    assert got.dtype == torch.int32
    assert got.tolist() == wrapped_cu([seqlens + new] * 7)
    fits = 8 * (seqlens + new) < 2**31
    want = ["aten::zeros"] if seqlens + new == 0 else ["aten::arange"]
    if not fits:
        want = ["aten::arange", "aten::mul"]
    assert device_ops(lambda: cache_cu_seqlens(seqlens, new, 7, "cpu", True)) == want


RAMPS = [(1, 0), (9, 0), (9, 1), (257, 16), (2, 2**30), (3, 2**30)]  # (length, step)


@pytest.mark.parametrize("length, step", RAMPS)
def test_captured_ramp_values_and_kernels(length, step):
    """``ramp`` while capturing: ``arange(length) * step`` in int32 (wrapping where the values
    pass 2**31), never kept, by one kernel where the values fit."""
    want = (torch.arange(length, dtype=torch.int64) * step).to(torch.int32)
    first, second = (ramp(length, step, torch.device("cpu"), True) for _ in range(2))
    assert first is not second  # made anew each time while capturing
    assert torch.equal(first, want) and first.dtype == torch.int32
    ops = device_ops(lambda: ramp(length, step, torch.device("cpu"), True))
    if step == 0:
        assert ops == ["aten::zeros"]
    elif length * step < 2**31:
        assert ops == ["aten::arange"]
    else:
        assert ops == ["aten::arange", "aten::mul"]
