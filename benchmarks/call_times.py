"""Host and GPU time of one eager call on a GPU, and of its CUDA-graph replay (the host-time
scripts' shared timer: ``benchmarks/host_overhead.py --gpu``, ``ci/host_peers.py``)."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch

from benchmarks.timing import cuda_graph


def gpu_times(call, n: int) -> dict[str, float]:
    """µs per call: host (perf_counter around ``n`` calls, no sync inside), GPU (CUDA events
    around the same calls) and CUDA-graph replay (events around ``n`` replays)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    end.record()
    torch.cuda.synchronize()
    # The median call: a lent GPU host's stalls (other tenants) move the mean by 2x between
    # runs; the GPU time is the events' total over the calls, as before.
    row = {"host_us": statistics.median(times) * 1e6, "gpu_us": start.elapsed_time(end) / n * 1e3}
    torch.cuda.set_sync_debug_mode("error")  # a warm call must not wait for the GPU
    try:
        call()
        row["syncs"] = "none"
    except RuntimeError as err:
        row["syncs"] = f"yes ({str(err).splitlines()[0][:60]})"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    try:
        graph, _ = cuda_graph(call)
    except Exception as err:  # report and go on: the eager numbers stand on their own
        print(f"  graph capture failed: {type(err).__name__}: {err}", file=sys.stderr)
        return row
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    row["graph_us"] = start.elapsed_time(end) / n * 1e3
    return row


def profile(call, n: int, sort: str, top: int = 25) -> None:
    """cProfile of ``n`` calls, the ``top`` functions by ``sort`` (e.g. tottime)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    pstats.Stats(prof).sort_stats(sort).print_stats(top)
