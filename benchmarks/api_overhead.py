"""How much of portattn's measured forward time is the eager API's host work (H200 notes).

The eager ``varlen_attention`` reads ``cu_seqlens`` on the host before each launch (the value
checks, design §1 in docs/design.md), so the GPU waits for that host work on every call; under
``torch.compile`` those checks are skipped (docs/api.md) and launches queue up like the peers'.
This script times, in one run and on the benchmark's own workloads and timer
(``benchmarks/bench.py``): the eager API, the same call compiled with ``fullgraph=True``,
FlexAttention and (equal packs) SDPA cuDNN, plus the forward kernel's own CUDA time from
``torch.profiler``.

Usage (GPU): python benchmarks/api_overhead.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/api_overhead.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks.bench_report import CUDNN, FLEX
from benchmarks.peers import Impl, build_impls
from benchmarks.timing import gpu_timer, profile_cuda_us, write_rows
from benchmarks.workloads import make_inputs, select_workloads

WORKLOADS = ("equal 2x8192 h16 d128", "skewed 32k h16 d128")


def kernel_ms(fn) -> float:
    """CUDA time of the forward kernel per call (median-free: mean of 5 profiled calls)."""
    per_kernel = profile_cuda_us(fn, 5)
    return sum(us for name, us in per_kernel.items() if name.startswith("attn_fwd_kernel")) / 5e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for w in select_workloads(patterns=list(WORKLOADS)):
        q, k, v, cu = make_inputs(w)[:4]
        longest = max(w.lengths)

        def eager(q=q, k=k, v=v, cu=cu, w=w, longest=longest):
            return portattn.varlen_attention(q, k, v, cu, cu, longest, longest, causal=w.causal)

        compiled = torch.compile(eager, fullgraph=True)
        impls = {"eager": eager, "compiled": compiled}
        peers = build_impls(w, cu)
        for name in (FLEX, CUDNN):
            if isinstance(peers.get(name), Impl):
                impls[name] = lambda impl=peers[name], q=q, k=k, v=v: impl.fn(q, k, v)
        row = {"workload": w.name, "flops": w.flops("fwd")}
        for name, fn in impls.items():
            fn()
            row[f"{name}_ms"] = gpu_timer(fn)[0]
        row["kernel_ms"] = kernel_ms(eager)
        for name in list(impls) + ["kernel"]:
            row[f"{name}_tf"] = row["flops"] / row[f"{name}_ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| workload | eager TF | compiled TF | kernel TF | Flex TF | cuDNN TF |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [r.get(f"{n}_tf") for n in ("eager", "compiled", "kernel", FLEX, CUDNN)]
        print(f"| {r['workload']} | " + " | ".join("—" if c is None else f"{c:.0f}" for c in cells))
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
