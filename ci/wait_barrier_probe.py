"""Bits and times of portattn ``varlen`` (and FlashAttention-4 deterministic, where it imports)
on the bench workloads, for ``ci/wait_barriers.py``'s A/B: run once under the hook and once
without (``WAIT_BARRIERS=keep``), each with its own ``TRITON_CACHE_DIR``; the hashes must be
equal between the runs (the hook changes no arithmetic), the times say what the barriers cost.

Usage: python ci/wait_barriers.py ci/wait_barrier_probe.py [--workloads W ...] [--fa4]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

if not __package__:  # the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton

from benchmarks import bench
from benchmarks.bench_report import FA4_DET, FIXED, VARLEN
from benchmarks.peers import build_impls
from benchmarks.workloads import Workload, make_inputs, named_workloads

DEFAULT = ("equal 2x8192 h16 d128 causal", "equal 2x8192 h16 d128 full",
           "skewed 32k h16 d128 causal", "equal 2x8192 gqa32/8 d128 causal",
           "skewed 16k h16 d64 causal")  # fmt: skip


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:12]


def probe_inputs(w: Workload) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad), cu_seqlens and dO of workload ``w``, the same in every run."""
    q, k, v, cu = make_inputs(w)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    gen = torch.Generator(device=q.device).manual_seed(1)  # the same dO in every run
    do = torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=gen)
    return q, k, v, cu, do


def probe_impls(workloads: list[str], only: list[str], tag: str = "") -> Iterator[tuple]:
    """(workload, implementation name, impl, q, k, v, dO) for each of ``only`` on each named
    workload (``probe_inputs``); an implementation that cannot run prints its reason (after
    ``tag``) and is skipped."""
    for w in named_workloads(workloads):
        q, k, v, cu, do = probe_inputs(w)
        for name, impl in build_impls(w, cu, only=only).items():
            if isinstance(impl, str):
                print(f"{tag}{w.name} | {name} | {impl[:200]}")
                continue
            yield w, name, impl, q, k, v, do


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", action="append")
    parser.add_argument("--fa4", action="store_true")
    parser.add_argument("--fwd-only", action="store_true", help="out's bits, forward times")
    parser.add_argument("--fixed-order", action="store_true", help="portattn fixed_order too")
    args = parser.parse_args()
    only = [VARLEN, FA4_DET] if args.fa4 else [VARLEN]
    if args.fixed_order:
        only.append(FIXED)
    for w, name, impl, q, k, v, do in probe_impls(args.workloads or list(DEFAULT), only):
        out = impl.fn(q, k, v)
        modes = ("fwd",) if args.fwd_only else ("fwd", "fwd+bwd")
        grads = () if args.fwd_only else torch.autograd.grad(out, (q, k, v), do)
        bits = digest(out, *grads)
        times = {"fwd+bwd": float("nan")}
        for mode in modes:
            step = bench.make_step(impl, mode, q, k, v, do if mode != "fwd" else None)
            best = min(
                triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median")
                for _ in range(2)
            )
            times[mode] = best
        tf = {m: w.flops(m) / times[m] / 1e9 for m in times}
        print(
            f"| {w.name} | {name} | {bits} | {times['fwd']:.4f} | {tf['fwd']:.0f} | "
            f"{times['fwd+bwd']:.3f} | {tf['fwd+bwd']:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
