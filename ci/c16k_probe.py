"""Session 44 probe: C 16384 decode at more batch sizes, and the split at 2 stages (GPU)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from benchmarks import bench_decode as bd  # noqa: E402
from ci import split_decode_ab as s  # noqa: E402
from portattn.kernels import decode  # noqa: E402

s.WORKLOADS.update({"B16 32k": (32768,) * 16, "B64 32k": (32768,) * 64, "B2 32k": (32768,) * 2})
for name in ("B1 32k", "B2 32k", "B16 32k", "B64 32k"):
    w = bd.DecodeWorkload(name, s.WORKLOADS[name], 1, 32, 8, 128)
    inp = bd.make_inputs(w)
    outs = {}
    for label, chunk, below, stages in (("shipped", None, 0, 0), ("C16k split 3st", 16384, 1 << 30, 0),
                                        ("C16k split 2st", 16384, 1 << 30, 2),
                                        ("C16k unsplit", 16384, 0, 0), ("C16k default", 16384, 264, 0)):
        s.patch_entries(chunk, decode_stages=stages)
        decode.SPLIT_BELOW_PROGRAMS = below
        for kernel in ("varlen", "fixed_order"):
            fn = s.decode_call(inp, kernel)
            with torch.no_grad():
                outs[label, kernel] = fn()
                g, e = s.tbps(w, fn)
            same = all(torch.equal(a, b) for a, b in zip(outs[label, kernel], outs.get(("C16k unsplit", kernel), outs[label, kernel])))
            print(f"| {name} | {kernel} | {label} | {g:.2f} | {e:.2f} |", flush=True)
    for kernel in ("varlen", "fixed_order"):
        for label in ("C16k split 3st", "C16k split 2st", "C16k default"):
            same = all(torch.equal(a, b) for a, b in zip(outs[label, kernel], outs["C16k unsplit", kernel]))
            print(f"| {name} | {kernel} | {label} == unsplit | {same} |", flush=True)
