"""The aten ops a call issues at the top level (``torch.profiler``, CPU side): what each eager
call costs a GPU host beyond Python (each op 12-50 µs on the H200's host, docs/perf-notes.md
row 66). ``benchmarks/host_overhead.py`` reports their count; tests/test_host_caches.py pins
them for a repeated decode call."""

from __future__ import annotations

from collections.abc import Callable

import torch


def top_level_aten_ops(call: Callable[[], object]) -> list[str]:
    """The names of the ``aten::`` ops one ``call()`` issues that no other aten op issued."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        call()
    names = []
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            names.append(event.name)
    return names
