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


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_step_captures_and_replays_bitwise(kernel):
    lens = [513, 1, 64, 1000, 17]  # the replays keep the total (the buffers' sizes)
    static = _decode_batch(lens, 1)
    max_k = 1024  # the engine's bound, above every length

    def step():
        return portattn.varlen_attention(
            *static, 1, max_k, causal=True, return_lse=True, kernel=kernel
        )

    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
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

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(grads, step()):
        assert torch.equal(got, want)
