"""Where a row's time varies between identical processes (issue 36: no row may vary by more than
5%; perf-notes row 108: the skewed 16k d64 causal forward+backward of varlen took 1.16-1.70 ms
in four processes of the same code, its forward 0.28-0.31).

For each workload and portattn kernel, in this process: the out and gradient hashes, do_bench's
median ms (L2 flushed before each repeat, as the benchmark) twice, the back-to-back ms per step
(CUDA events around ``--calls`` steps, no flush: what the GPU takes when the host runs ahead),
the host ms to queue one step on an idle GPU (median and largest: a wait inside shows), the
garbage collector's passes and ms during the do_bench calls,
and each kernel's CUDA µs per step from ``torch.profiler`` over the same number of steps, with
its fastest and slowest launch (a kernel of one launch per step that is bimodal shows here). Run it
in several processes (``ci/gpu_variance.sh``): a kernel whose µs move with the total is the
limiter; totals that move while every kernel's µs stay put mean gaps (the host, or a wait).

Usage (GPU): python ci/variance_probe.py [--workloads W ...] [--fixed-order] [--calls 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton

from benchmarks import bench
from benchmarks.bench_report import FIXED, VARLEN
from benchmarks.timing import profile_cuda
from ci.wait_barrier_probe import digest, probe_impls

DEFAULT = ("skewed 16k h16 d64 causal", "skewed 16k h16 d64 full")


def back_to_back_ms(step, calls: int) -> float:
    """ms per step over ``calls`` steps queued without a sync or an L2 flush between them."""
    step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


class GcClock:
    """Python's garbage-collector passes and their ms while active (``gc.callbacks``): a
    collection of the bench process's many objects would stall the host mid-step."""

    def __init__(self) -> None:
        self.passes, self.ms, self._t0 = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        import time

        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3

    def __enter__(self) -> GcClock:
        import gc

        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.callbacks.remove(self)


def host_ms(step, calls: int) -> tuple[float, float]:
    """Median and largest host ms of one step, each started on an idle GPU (a sync before):
    the time to queue its launches, or more where something inside waits for the GPU."""
    import statistics
    import time

    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times), max(times)


def kernel_times_us(step, calls: int) -> dict[str, list[float]]:
    """Each kernel's CUDA µs per launch (by name) over ``calls`` steps, after one step outside
    the profile (``torch.profiler``): the spread of one kernel within this process shows."""
    times: dict[str, list[float]] = {}
    for event in profile_cuda(step, calls).events():
        if event.device_time_total > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name, []).append(event.device_time_total)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", action="append")
    parser.add_argument("--fixed-order", action="store_true", help="portattn fixed_order too")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--tag", default="", help="printed in each line (the process's name)")
    args = parser.parse_args()
    only = [VARLEN, FIXED] if args.fixed_order else [VARLEN]
    tag = f"{args.tag} | "
    for w, name, impl, q, k, v, do in probe_impls(args.workloads or list(DEFAULT), only, tag):
        out = impl.fn(q, k, v)
        bits = digest(out, *torch.autograd.grad(out, (q, k, v), do))
        for mode in ("fwd", "fwd+bwd"):
            step = bench.make_step(impl, mode, q, k, v, do if mode != "fwd" else None)
            with GcClock() as gc_clock:
                flushed = [
                    triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median")
                    for _ in range(2)
                ]
            queued = back_to_back_ms(step, args.calls)
            host, host_max = host_ms(step, args.calls)
            kernels = kernel_times_us(step, args.calls)
            total = sum(sum(times) for times in kernels.values()) / args.calls / 1e3
            print(
                f"{args.tag} | {w.name} | {name} | {mode} | {bits} | "
                f"{flushed[0]:.3f}, {flushed[1]:.3f} | {queued:.3f} | "
                f"{host:.3f} ({host_max:.3f}) | {gc_clock.passes}, {gc_clock.ms:.1f} | "
                f"{total:.3f} | "
                + "; ".join(
                    f"{key[:32]} {sum(t) / args.calls:.0f} ({min(t):.0f}-{max(t):.0f})"
                    for key, t in sorted(kernels.items())
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
