"""Launches for Nsight Compute to profile the repair passes (design §3.2) beside their passes:
a causal varlen forward and backward of 8 x 2048 tokens, h16, d128 and d64, bf16, twice each
(``ci/gpu_next.sh 6`` runs it under ``ncu`` with the launch statistics and occupancy sections).
The question (perf-notes row 74's follow-up): is a repair pass's cost (+6.5% of the replayed
d128 forward, row 72) the waves of CTAs that check one row and exit, each holding the pass's
shared memory, rather than any work?

Usage (GPU): python ci/repair_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as `python ci/repair_probe.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn


def main() -> int:
    cu = torch.arange(9, dtype=torch.int32, device="cuda") * 2048
    for dim in (128, 64):
        gen = torch.Generator(device="cuda").manual_seed(dim)
        q, k, v = (
            torch.randn(
                8 * 2048, 16, dim, device="cuda", dtype=torch.bfloat16, generator=gen
            ).requires_grad_()
            for _ in range(3)
        )
        for _ in range(2):
            out = portattn.varlen_attention(q, k, v, cu, cu, 2048, 2048, causal=True)
            out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
