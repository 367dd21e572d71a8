"""Untimed calls of portattn ``varlen`` and FlashAttention-4 deterministic for Nsight Compute
(issue 36: where FA4's SM90 lead is, inside the key loop or around it; perf-notes "FlashAttention-4
on SM90", before its item 3). Each implementation runs one warm-up call per mode outside any NVTX
range, then one call inside the range ``<impl>.<mode>`` (``portattn.fwd``, ``fa4.train``: a
slash would end the name in ncu's filter syntax), so ``ncu --nvtx --nvtx-include portattn.fwd/``
profiles only that call's kernels. The backward runs on autograd's own thread, outside the
range: only the forward kernels of a ``train`` call are profiled.

Usage (GPU, FA4 from ``source .fa4/install.sh``), for example::

    ncu --nvtx --nvtx-include portattn.fwd/ --nvtx-include fa4.fwd/ --clock-control none \\
        --metrics gpu__time_duration.sum,... python ci/ncu_peers.py --modes fwd \\
        --workloads "equal 2x8192 h16 d128 causal"

(``ci/gpu_ncu.sh`` runs it so.)

Without ncu it prints each call's CUDA µs per kernel (torch.profiler), as a check of what ncu
will see.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/ncu_peers.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import bench
from benchmarks.bench_report import FA4_DET, VARLEN
from benchmarks.peers import build_impls
from benchmarks.timing import profile_cuda_us
from benchmarks.workloads import make_inputs, named_workloads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", action="append", required=True)
    parser.add_argument("--modes", default="fwd,fwd+bwd")
    parser.add_argument("--profile", action="store_true", help="torch.profiler µs per kernel")
    parser.add_argument("--only", choices=("portattn", "fa4"), help="one implementation")
    args = parser.parse_args()
    for w in named_workloads(args.workloads):
        q, k, v, cu = make_inputs(w)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        do = torch.randn_like(q)
        only = {"portattn": [VARLEN], "fa4": [FA4_DET]}.get(args.only, [VARLEN, FA4_DET])
        impls = build_impls(w, cu, only=only)
        for name, impl in impls.items():
            if isinstance(impl, str):
                print(f"{w.name} {name}: {impl}")
                continue
            tag = "portattn" if name == VARLEN else "fa4"
            for mode in args.modes.split(","):
                step = bench.make_step(impl, mode, q, k, v, do if mode != "fwd" else None)
                step()  # compiles, caches: outside the range
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(f"{tag}.{'fwd' if mode == 'fwd' else 'train'}")
                step()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
                if args.profile:
                    times = profile_cuda_us(step, 5)
                    print(f"\n### {w.name} {tag} {mode}: CUDA µs per call and kernel")
                    for kernel, us in sorted(times.items(), key=lambda kv: -kv[1])[:8]:
                        print(f"- {us / 5:9.1f}  {kernel[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
