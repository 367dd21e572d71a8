"""C = 16,384 patched into the device's entries (design §3.1, perf-notes row 116): the paged
decode's TB/s at B1, B2, B16 and B64 sequences of 32k keys, both kernels, for the split at the
decode's stages and at 2, the unsplit decode (chunks merged in registers) and the planner's
default, each one's out and lse against the unsplit decode's, bitwise.

Usage (GPU): python ci/c16k_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as `python ci/c16k_probe.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import decode_workloads as dw
from ci import split_decode_ab as ab
from portattn.kernels import decode

C = 16384
BATCHES = (1, 2, 16, 64)
# label -> (key chunk, decode.SPLIT_BELOW_PROGRAMS, the decode's stages; 0: the entry's)
VARIANTS = {
    "shipped": (None, decode.SPLIT_BELOW_PROGRAMS, 0),
    "split": (C, 1 << 30, 0),
    "split 2 stages": (C, 1 << 30, 2),
    "unsplit": (C, 0, 0),
    "default": (C, decode.SPLIT_BELOW_PROGRAMS, 0),
}


def main() -> int:
    print("| workload | kernel | variant | graph TB/s | eager TB/s | bits |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for batch in BATCHES:
        name = f"B{batch} 32k"
        w = dw.DecodeWorkload(name, (32768,) * batch, 1, 32, 8, 128)
        inp = dw.make_inputs(w)
        for kernel in ("varlen", "fixed_order"):
            rows, outputs = [], {}
            for label, (chunk, below, stages) in VARIANTS.items():
                ab.patch_entries(chunk, decode_stages=stages)
                decode.SPLIT_BELOW_PROGRAMS = below
                fn = ab.decode_call(inp, kernel)
                with torch.no_grad():
                    outputs[label] = fn()
                rows.append((label, *ab.tbps(w, fn)))
            ab.patch_entries(None)
            decode.SPLIT_BELOW_PROGRAMS = VARIANTS["shipped"][1]
            for label, graph, eager in rows:
                same = all(map(torch.equal, outputs[label], outputs["unsplit"]))
                bits = "-" if label == "shipped" else ("= unsplit" if same else "DIFFER")
                print(f"| {name} | {kernel} | {label} | {graph:.2f} | {eager:.2f} | {bits} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
