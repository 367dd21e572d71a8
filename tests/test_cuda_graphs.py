"""CUDA-graph capture, as rollout engines capture their decode step: ``torch.cuda.graph``
around ``varlen_attention`` (both max_seqlen given) captures without a host copy, and every
replay gives the bytes of the eager call on the data the static buffers hold at replay.
Without both max_seqlen the capture raises the clear ValueError before any launch."""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS, cu_seqlens

import portattn

pytestmark = pytest.mark.gpu

HQ, HKV, D = 8, 2, 128


def _decode_batch(lens_k: list[int], seed: int):
    """One query row per sequence against its keys (a decode step), bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    total_k = sum(lens_k)
    q = torch.randn(len(lens_k), HQ, D, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(total_k, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(total_k, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    cu_q = cu_seqlens([1] * len(lens_k), "cuda")
    cu_k = cu_seqlens(lens_k, "cuda")
    return q, k, v, cu_q, cu_k


def _capture(step):
    """``step`` warmed on a side stream (as torch.cuda.graph's docs ask), then captured:
    returns (graph, the captured outputs)."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def _assert_replays_are_eager(step, refill=None, replays: int = 1, written=()) -> None:
    """Capture ``step``, then ``replays`` times: ``refill(i)`` puts new data in the captured
    buffers, the graph replays, and what it gives (its outputs, and the tensors ``written``,
    which ``step`` writes in place) must be the bytes of ``step()`` run eagerly on the same
    data, from the same ``written`` contents."""
    graph, outputs = _capture(step)
    for i in range(replays):
        if refill is not None:
            refill(i)
        before = [t.clone() for t in written]
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in (*outputs, *written)]
        for t, saved in zip(written, before, strict=True):
            t.copy_(saved)
        eager = step()
        for n, (got, want) in enumerate(zip(replayed, (*eager, *written), strict=True)):
            assert torch.equal(got, want), (i, n)


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_step_captures_and_replays_bitwise(kernel):
    lens = [513, 1, 64, 1000, 17]  # the replays keep the total (the buffers' sizes)
    static = _decode_batch(lens, 1)
    max_k = 1024  # the engine's bound, above every length

    def step():
        return portattn.varlen_attention(
            *static, 1, max_k, causal=True, return_lse=True, kernel=kernel
        )

    graph, (out, lse) = _capture(step)
    for seed, new_lens in ((2, lens), (3, [1000, 2, 1, 528, 64])):  # new data, new lengths
        fresh = _decode_batch(new_lens, seed)
        for buf, src in zip(static, fresh):
            buf.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = portattn.varlen_attention(
            *fresh, 1, max_k, causal=True, return_lse=True, kernel=kernel
        )
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_capture_without_max_seqlen_is_a_clear_error():
    q, k, v, cu_q, cu_k = _decode_batch([5, 9], 4)
    portattn.varlen_attention(q, k, v, cu_q, cu_k, 1, 9)  # warm (compiled kernels)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(ValueError, match="max_seqlen_q must be given"),
        torch.cuda.graph(graph),
    ):
        portattn.varlen_attention(q, k, v, cu_q, cu_k)


@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_backward_captures(kernel):
    """A training step's attention, forward and backward, in one captured graph."""
    lens = [100, 37, 256]
    gen = torch.Generator().manual_seed(5)
    total = sum(lens)
    q, k, v = (
        torch.randn(total, h, D, generator=gen).to(torch.bfloat16).cuda().requires_grad_()
        for h in (HQ, HKV, HKV)
    )
    dout = torch.randn(total, HQ, D, generator=gen).to(torch.bfloat16).cuda()
    cu = cu_seqlens(lens, "cuda")

    def step():
        out = portattn.varlen_attention(q, k, v, cu, cu, 256, 256, causal=True, kernel=kernel)
        return torch.autograd.grad(out, (q, k, v), dout)

    _assert_replays_are_eager(step)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_kvcache_decode_step_captures_and_replays_bitwise(kernel, layout):
    """A rollout engine's decode step: flash_attn_with_kvcache appends one key/value per
    sequence to the cache and attends, captured once, replayed 100 times with new data in the
    captured buffers (queries, new keys, cache lengths); each replay gives eager's bytes."""
    batch, page, pages_per_seq = 6, 64, 20
    gen = torch.Generator().manual_seed(9)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).cuda()

    if layout == "paged":
        n_pages = batch * pages_per_seq
        cache_shape = (n_pages, page, HKV, D)
        order = torch.randperm(n_pages, generator=gen).to(torch.int32)
        extra = dict(block_table=order.view(batch, pages_per_seq).cuda())
    else:
        cache_shape = (batch, page * pages_per_seq, HKV, D)
        extra = {}
    k_cache, v_cache = rand(*cache_shape), rand(*cache_shape)
    q, k_new, v_new = rand(batch, 1, HQ, D), rand(batch, 1, HKV, D), rand(batch, 1, HKV, D)
    base = [0, 5, 100, 700, 1000, 1278]  # below the capacity (1280) minus the new key
    seqlens = torch.tensor(base, dtype=torch.int32).cuda()

    def step():
        return portattn.flash_attn_with_kvcache(
            q,
            k_cache,
            v_cache,
            k_new,
            v_new,
            cache_seqlens=seqlens,
            causal=True,
            return_softmax_lse=True,
            kernel=kernel,
            **extra,
        )

    def refill(replay: int) -> None:
        q.copy_(rand(batch, 1, HQ, D))
        k_new.copy_(rand(batch, 1, HKV, D))
        v_new.copy_(rand(batch, 1, HKV, D))
        seqlens.copy_(torch.tensor([(n + 37 * replay) % 1280 for n in base]))

    # The eager step re-appends the same rows to the caches as they were before the replay.
    _assert_replays_are_eager(step, refill, 100, written=(k_cache, v_cache))


@pytest.mark.parametrize("kernel", KERNELS)
def test_paged_varlen_captures(kernel):
    """varlen_attention with a block_table (both max_seqlen given) captures and replays to
    eager's bytes with new lengths and a new page order in the captured buffers."""
    batch, page = 5, 16
    gen = torch.Generator().manual_seed(3)
    n_pages = 40
    k_cache = torch.randn(n_pages, page, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    v_cache = torch.randn(n_pages, page, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    q = torch.randn(batch, HQ, D, generator=gen).to(torch.bfloat16).cuda()
    table = torch.randperm(n_pages, generator=gen)[: batch * 8].to(torch.int32).view(batch, 8)
    table = table.cuda()
    cu_q = cu_seqlens([1] * batch, "cuda")
    cu_k = cu_seqlens([1, 17, 128, 3, 64], "cuda")

    def step():
        return portattn.varlen_attention(
            q,
            k_cache,
            v_cache,
            cu_q,
            cu_k,
            1,
            128,
            causal=True,
            return_lse=True,
            kernel=kernel,
            block_table=table,
        )

    def refill(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        q.copy_(torch.randn(batch, HQ, D, generator=g).to(torch.bfloat16))
        table.copy_(torch.randperm(n_pages, generator=g)[: batch * 8].view(batch, 8))
        cu_k.copy_(cu_seqlens(torch.randint(1, 129, (batch,), generator=g).tolist(), "cuda"))

    _assert_replays_are_eager(step, refill, 5)
