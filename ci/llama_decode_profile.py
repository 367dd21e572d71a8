"""Where transformers' decode step spends its time with ``attn_implementation="portattn"``
against ``"sdpa"`` (issue 37: benchmarks/transformers_llama.py's decode row, 0.85x SDPA at d128
and 0.92x at d64 on an H100 in session 48).

GPU, per implementation (benchmarks/transformers_llama.py's model and decode step: 2 layers,
GQA 16/4, B 8 x 2,048 cached tokens, one new token): the step's host time (``perf_counter``
around a step, no sync), its GPU time (CUDA events around it), the wall time of 50 steps
back to back, whether a step waits for the GPU (``torch.cuda.set_sync_debug_mode``), the CUDA
kernels one step launches with their GPU time (``torch.profiler``), and the host functions of
the attention path by own time (cProfile). A table first, details after it.

    python ci/llama_decode_profile.py [--head-dim 128]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

if not __package__:  # run as `python ci/llama_decode_profile.py`: the checkout's root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.transformers_llama import IMPLS, decode_step, make_model

STEPS = 50


def step_times(step) -> dict[str, float]:
    """Median host µs and GPU µs of one step, and the wall µs a step of ``STEPS`` in a row."""
    host, events = [], []
    for _ in range(STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    gpu = [a.elapsed_time(b) for a, b in events]
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / STEPS
    return {"host": statistics.median(host) * 1e6, "gpu": statistics.median(gpu) * 1e3,
            "wall": wall * 1e6}  # fmt: skip


def syncs(step) -> list[str]:
    """Where one step synchronizes with the GPU (``set_sync_debug_mode("warn")``): the Python
    line that made each synchronizing CUDA call."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # Only the sync warnings: the first ``set_sync_debug_mode`` of a process also warns that the
    # mode is a prototype (a "Synchronization ..." message, counted as a sync before session 50).
    found = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    return [f"{w.filename}:{w.lineno}" for w in found]


def kernels(step) -> str:
    """The CUDA kernels of one step by GPU time (torch.profiler's table)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


def host_functions(step) -> str:
    """cProfile's top 30 by own time over ``STEPS`` steps."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(STEPS):
        step()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    import portattn.integrations.transformers as portattn_hf

    portattn_hf.register()
    device = torch.device("cuda")
    steps = {impl: decode_step(make_model(args.head_dim, impl), device) for impl in IMPLS}
    for step in steps.values():  # warm: compiles, caches, the mask's derived values
        for _ in range(10):
            step()
    torch.cuda.synchronize()
    rows, details = {}, []
    for impl in (*IMPLS, *IMPLS[::-1]):  # two passes in alternating order, the best kept
        got = step_times(steps[impl])
        old = rows.get(impl)
        rows[impl] = got if old is None else {k: min(v, old[k]) for k, v in got.items()}
    for impl in IMPLS:
        where = syncs(steps[impl])
        rows[impl]["syncs"] = len(where)
        details += [f"## {impl}: synchronizing calls of one step", *where]
        details += [
            f"## {impl}: CUDA kernels of one step",
            kernels(steps[impl]),
            f"## {impl}: host functions, {STEPS} steps",
            host_functions(steps[impl]),
        ]
    print(f"| d{args.head_dim} decode step | host µs | GPU µs | wall µs ({STEPS} in a row) | "
          "syncs |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for impl, r in rows.items():
        print(f"| {impl} | {r['host']:.0f} | {r['gpu']:.0f} | {r['wall']:.0f} | {r['syncs']} |")
    print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
