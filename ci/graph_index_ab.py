"""A decode step captured in a CUDA graph, as rollout engines replay it: ``--layers`` paged
``flash_attn_with_kvcache`` calls (``ci/tune_decode_sm90.call``: GQA 32/8, d128, bf16, pages of
64, one ``cache_seqlens`` tensor for all, out and lse returned), timed as graph replays with the
captured calls' index tensors made the way they were before session 53 (``old``: cu_seqlens_k
by cumsum, arange, mul and cat; ramps by arange and mul, six kernels a call) and as on main
(``new``: three), alternating, best of rounds. Each variant's outputs must equal the other's
bit for bit (the same index values).

Usage (GPU): python ci/graph_index_ab.py [--layers 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

if not __package__:  # run as `python ci/graph_index_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import decode_workloads as dw
from benchmarks.timing import cuda_graph, gpu_timer
from ci.tune_decode_sm90 import call as paged_call
from portattn import kvcache, tensor_memo

WORKLOADS = ("decode B1 gqa32/8 d128", "decode B8 gqa32/8 d128", "decode B64 gqa32/8 d128")


def old_cu_seqlens(seqlens, new, batch, device, capturing):
    """``kvcache_append.cache_cu_seqlens`` as it was (four kernels from a tensor)."""
    if isinstance(seqlens, int):
        return tensor_memo.ramp(batch + 1, 1, device, capturing) * (seqlens + new)
    counts = seqlens + new if new else seqlens
    total = torch.cumsum(counts, 0, dtype=torch.int32)
    return torch.cat((tensor_memo.ramp(1, 0, device, capturing), total))


def old_ramp(length, step, device):
    """``tensor_memo._make_ramp`` as it was (two kernels)."""
    return torch.arange(length, dtype=torch.int32, device=device) * step


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Within it, captured calls make their index tensors the ``name`` way (``old``: the two
    functions as they were, patched where they are called from)."""
    if name == "new":
        yield
        return
    saved = kvcache.cache_cu_seqlens, tensor_memo._make_ramp
    kvcache.cache_cu_seqlens, tensor_memo._make_ramp = old_cu_seqlens, old_ramp
    try:
        yield
    finally:
        kvcache.cache_cu_seqlens, tensor_memo._make_ramp = saved


def step_graph(inp: dw.DecodeInputs, layers: int, name: str):
    """The graph of one decode step (``layers`` calls) and its outputs."""

    def step():
        return [paged_call(inp, "varlen") for _ in range(layers)]  # (out, lse) each

    with variant(name):
        graph, outs = cuda_graph(step)
    return graph, outs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print("| workload | layers | old µs / step | new µs / step | new / old | bits |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for w in (x for x in dw.default_workloads() if x.name in WORKLOADS):
        inp = dw.make_inputs(w)
        graphs = {name: step_graph(inp, args.layers, name) for name in ("old", "new")}
        best = {name: float("inf") for name in graphs}
        for r in range(args.rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                graph = graphs[name][0]
                best[name] = min(best[name], gpu_timer(graph.replay)[0] * 1e3)
        torch.cuda.synchronize()
        pairs = zip(graphs["old"][1], graphs["new"][1])
        same = all(torch.equal(a, b) for old, new in pairs for a, b in zip(old, new))
        ratio = best["new"] / best["old"]
        print(f"| {w.name} | {args.layers} | {best['old']:.1f} | {best['new']:.1f} | "
              f"{ratio:.3f} | {'equal' if same else 'DIFFER'} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
