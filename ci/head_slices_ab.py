"""The decode's query heads spread over programs at small batches (``decode.heads_per_tile``):
each variant's paged-decode TB/s (CUDA-graph replay and eager) and its out / lse against the
full group's, bitwise, with FA4 deterministic (paged) beside it where importable.

Variants: ``group`` (every query head of a kv head's group in one tile: the decode before
slicing), ``auto`` (the planner's choice: halved while the grid stays below
``SLICE_BELOW_PROGRAMS``), and ``heads 1`` / ``heads 2`` forced. The entries as they ship
(the key chunk included: the 32k rows split in every variant). Both kernels; bf16, pages of
64 keys; the query heads of GQA 32/8 and 8/1, d128 and d64; decode and append 16.

Usage (GPU): python ci/head_slices_ab.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/head_slices_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import bench_decode as bd
from ci import split_decode_ab as ab
from portattn.kernels import decode, plan

AUTO = decode.heads_per_tile
# name -> (kv lengths, query rows, query heads, kv heads, head dim)
WORKLOADS = {
    "B1": (bd.kv_lengths(1), 1, 32, 8, 128),
    "B8": (bd.kv_lengths(8), 1, 32, 8, 128),
    "B32": (bd.kv_lengths(32), 1, 32, 8, 128),
    "B64": (bd.kv_lengths(64), 1, 32, 8, 128),
    "B1 32k": ((32768,), 1, 32, 8, 128),
    "B8 32k": ((32768,) * 8, 1, 32, 8, 128),
    "append16 B8": (bd.kv_lengths(8), 16, 32, 8, 128),
    "B64 gqa8/1": (bd.kv_lengths(64), 1, 8, 1, 128),
    "B8 d64": (bd.kv_lengths(8), 1, 32, 8, 64),
}
QUICK = ("B1", "B8", "B1 32k", "B64 gqa8/1")


def use_heads(heads: int | None) -> None:
    """Every decode plans with ``heads`` query heads per tile (None: the planner's choice)."""
    decode.SLICE_BELOW_PROGRAMS = decode.SPLIT_BELOW_PROGRAMS  # auto: below two waves
    if heads is None:
        decode.heads_per_tile = AUTO
    else:
        decode.heads_per_tile = lambda p: min(heads, decode.group_heads(p.cfg, p.group))
    plan.forget_problems()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=", ".join(QUICK) + " only")
    args = parser.parse_args()
    names = QUICK if args.quick else tuple(WORKLOADS)
    variants = {"group": 1 << 10, "auto": None, "heads 2": 2, "heads 1": 1}
    print("| workload | kernel | variant | graph TB/s | eager TB/s | bits vs group |")
    print("| --- | --- | --- | ---: | ---: | --- |", flush=True)
    for name in names:
        lens, q_len, hq, hk, dim = WORKLOADS[name]
        w = bd.DecodeWorkload(name, lens, q_len, hq, hk, dim)
        inp = bd.make_inputs(w)
        for kernel in ("varlen", "fixed_order"):
            results, outputs = {}, {}
            for _ in range(2):  # alternating passes, the best kept
                for label, heads in variants.items():
                    use_heads(heads)
                    fn = ab.decode_call(inp, kernel)
                    with torch.no_grad():
                        outputs[label] = fn()
                    g, e = ab.tbps(w, fn)
                    old = results.get(label, (0.0, 0.0))
                    results[label] = (max(old[0], g), max(old[1], e))
            use_heads(None)
            for label, (g, e) in results.items():
                same = all(map(torch.equal, outputs[label], outputs["group"]))
                bits = "-" if label == "group" else ("equal" if same else "DIFFER")
                print(f"| {name} | {kernel} | {label} | {g:.2f} | {e:.2f} | {bits} |", flush=True)
        fa4 = ab.fa4_call(w, inp) if q_len == 1 else None
        if fa4 is not None:
            g, e = ab.tbps(w, fa4)
            print(f"| {name} | FA4 det paged | - | {g:.2f} | {e:.2f} | - |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
