"""An experiment on the warp-specialised Gluon kernels (issue 36; perf-notes row 97): their PTX
without the warp-group barriers that Triton 3.6 puts before each mbarrier wait and arrive of a
consumer group.

Why. Nsight Compute of the d128 forward on the H200 (row 97) shows 3.8 warps stalled at a
barrier per issued instruction (FlashAttention-4: 0.5) and the tensor pipe 68% busy (FA4: 79%).
The consumer loop has two ``bar.sync <id>, 128`` per key tile that the source does not ask for:
Triton 3.6's shared-memory barrier analysis (Membar) treats ``warpgroup_mma_wait`` as a memory
wait after which every thread must meet before the next shared-memory operation, and an
``mbarrier.arrive`` (issued by one thread) as needing every thread of the group before it. Here
the next shared-memory operations are the ring's mbarrier wait (the next tile landed) and
arrive (this tile's slot is free). Neither needs the group to meet: a wgmma is one operation of
the whole warp group, so once one thread's ``wgmma.wait_group`` returns, the group's reads of
the slot are done (CUTLASS's pipelines arrive from one thread per warp group with no barrier);
an mbarrier wait reads only the barrier. Newer Triton (main, 2026) marks warp-group-local
wgmma waits as completions that need no barrier.

What. A ``knobs.runtime.add_stages_inspection_hook`` that wraps the PTX stage: in kernels whose
name is in ``KERNELS``, a ``bar.sync <id>, 128;`` whose next instruction is an
``mbarrier.try_wait`` or an ``mbarrier.arrive`` (not the producer's ``arrive.expect_tx``) is
dropped. The arithmetic is untouched, so the outputs must be bitwise those of the shipped
kernels (the probe's hashes say whether they are). Triton's cache key does not see the hook:
run with a fresh ``TRITON_CACHE_DIR``.

Usage: python ci/wait_barriers.py SCRIPT [ARGS...] (runs SCRIPT under the hook; set
``WAIT_BARRIERS=keep`` to run it unpatched with the same wrapper).
"""

from __future__ import annotations

import os
import re
import runpy
import sys

KERNELS = ("attn_fwd_ws_kernel", "attn_bwd_dkdv_ws_kernel", "attn_bwd_dq_ws_kernel")
GROUP_BARRIER = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")
SKIP = re.compile(r"^\s*($|//|\{|\}|\.reg|\$?\w+:)")
removed: dict[str, int] = {}


def strip_wait_barriers(ptx: str) -> tuple[str, int]:
    """``ptx`` without the warp-group barriers right before an mbarrier wait or arrive."""
    lines = ptx.split("\n")
    keep, dropped = [], 0
    for i, line in enumerate(lines):
        if GROUP_BARRIER.match(line):
            nxt = next((ln for ln in lines[i + 1 : i + 12] if not SKIP.match(ln)), "")
            if "mbarrier.try_wait" in nxt or ("mbarrier.arrive" in nxt and "expect_tx" not in nxt):
                dropped += 1
                continue
        keep.append(line)
    return "\n".join(keep), dropped


def _hook(backend, stages, options, language, capability) -> None:
    make_ptx = stages["ptx"]

    def ptx_stage(src, metadata):
        ptx = make_ptx(src, metadata)
        name = metadata.get("name", "")
        if name in KERNELS:
            ptx, dropped = strip_wait_barriers(ptx)
            removed[name] = dropped
            print(f"wait_barriers: {name}: {dropped} barriers dropped", file=sys.stderr)
        return ptx

    stages["ptx"] = ptx_stage


def install() -> None:
    from triton import knobs

    knobs.runtime.add_stages_inspection_hook = _hook


if __name__ == "__main__":
    if os.environ.get("WAIT_BARRIERS", "drop") != "keep":
        install()
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
