"""How the benchmarks time a step: ``do_bench`` medians with the L2 flushed (:func:`gpu_timer`),
CUDA-graph capture, the untimed heat before a pass and the passes' order, per-kernel CUDA
times from the profiler, and :func:`attempt`, which turns a failure into its message."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

WARMUP_MS = 50  # do_bench's warm-up and repetition budgets: about 0.4 s per do_bench call
REP_MS = 300

Step = Callable[[], object]
Timer = Callable[[Step], tuple[float, float | None, float | None]]  # ms, peak GiB, resident GiB


def cuda_graph(fn: Callable[[], Any], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn`` captured in a CUDA graph after ``warmup`` calls on a side stream (as
    ``torch.cuda.graph``'s docs ask); returns the graph and the captured call's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def attempt(fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """``(fn(*args), None)``, or ``(None, message)`` if it raised. The message includes the
    warnings raised meanwhile: SDPA gives the reasons why a backend cannot run only as
    warnings before its "No available kernel" error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args), None
        except Exception as exc:  # report, do not hide: the tables show it as failed
            text = f"{type(exc).__name__}: {exc}".strip()
            extra = [m for m in dict.fromkeys(str(c.message) for c in caught) if m not in text]
            return None, "; ".join([text, *extra])[:4000]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _no_recompile() -> Iterator[None]:
    """While timing, a recompile raises instead of being timed (torch >= 2.6)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        yield
        return
    with set_stance("fail_on_recompile"):
        yield


def gpu_timer(
    step: Step, warmup_ms: int = WARMUP_MS, rep_ms: int = REP_MS
) -> tuple[float, float | None, float | None]:
    """Median ms of ``do_bench`` (L2 flushed before each repeat: see ``benchmarks/bench.py``'s
    docstring; its warm-up and repeat budgets in ms), and the peak and resident memory in GiB
    of one call measured before it."""
    import triton.testing

    with _no_recompile():
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        ms = triton.testing.do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return ms, peak / 2**30, resident / 2**30


def profile_cuda(step: Step, calls: int) -> Any:
    """``torch.profiler``'s record of the CUDA activity of ``calls`` calls of ``step``, after
    one call outside it."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    return prof


def profile_cuda_us(step: Step, calls: int) -> dict[str, float]:
    """CUDA microseconds of each kernel (by name) over ``calls`` calls of ``step``, after one
    call outside the profile (``torch.profiler``; the CI scripts' per-kernel times)."""
    return {evt.key: evt.device_time_total for evt in profile_cuda(step, calls).key_averages()}


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """The CI scripts' ``--json``: their rows, in order, as JSON indented by one space."""
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


def pass_order(names: list[str], pass_: int, passes: int) -> list[str]:
    """The implementations' order in pass ``pass_`` of ``passes``: odd passes reverse the pass
    before them, and each pair of passes starts ``len(names) / (passes / 2)`` places further
    round, so over the passes every implementation is timed early and late alike (two passes:
    the names, then reversed)."""
    pairs = (passes + 1) // 2
    turn = (pass_ // 2) * len(names) // pairs
    order = names[turn:] + names[:turn]
    return order[::-1] if pass_ % 2 else order


def heat(steps: list[Step], seconds: float) -> None:
    """Call ``steps`` round robin, untimed, for about ``seconds`` (none: nothing), then wait
    for the GPU: the first timed call finds it as busy as every later one (``bench.HEAT_S``)."""
    if seconds <= 0 or not steps:
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for step in steps:
            attempt(step)
        if torch.cuda.is_available():  # a round at a time: the queue never runs far ahead
            torch.cuda.synchronize()
