"""Host time of one eager ``varlen_attention`` forward on the GPU, taken apart (issue 37 item 3).

``benchmarks/host_overhead.py`` measures the whole eager call; on the H200 it took about 340 µs
(no grad, 4 x 256 tokens) where the same call with its kernel launches stubbed takes about 70 µs
on a CPU. This script times, in one process, the public call with ``portattn.kernels.launcher``
(kept compiled kernels, from a signature's second launch) and with every launch through
``kernel[grid](...)`` (and whether the two give the same bits), then the pieces: the planned
launches replayed through ``plan.run_launches``, each launch through Triton's
``JITFunction.run``, its binder alone (Triton's argument specialisation), and the compiled
kernel's launcher called directly. Each figure: host µs per call, ``--n`` calls without a sync
inside, after warm-up.

Usage (GPU): python benchmarks/launch_overhead.py [--n 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as `python benchmarks/launch_overhead.py`: the checkout's root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import portattn  # noqa: E402
from portattn.kernels import forward as forward_mod  # noqa: E402
from portattn.kernels import launcher  # noqa: E402
from portattn.kernels import plan as plan_mod  # noqa: E402
from portattn.kernels.buffers import descriptor_scratch  # noqa: E402

# (name, lengths, heads, head dim, causal): the host-overhead case and the bench's d64 row
CASES = (
    ("4x256 h16 d128 causal", [256] * 4, 16, 128, True),
    ("4x256 h16 d128 full", [256] * 4, 16, 128, False),
    ("skewed 16k h16 d64 causal", [3000, 3000, 64, 1000, 4096, 3000, 1000, 1224], 16, 64, True),
)


def host_us(fn: Callable[[], object], n: int) -> float:
    """Host µs per call: ``n`` calls with no sync inside (the GPU queue absorbs them)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / n * 1e6


def capture_launches(call: Callable[[], object]) -> list:
    """The forward's planned launches, recorded from one real call."""
    seen: list = []
    real = forward_mod.run_launches

    def record(launches, device, before_launch=None):
        seen.extend(launches)
        return real(launches, device, before_launch)

    forward_mod.run_launches = record
    try:
        call()
    finally:
        forward_mod.run_launches = real
    return seen


def launch_pieces(launch, device: torch.device) -> dict[str, Callable[[], object]]:
    """Callables for one launch: through Triton's JIT, its binder alone, its compiled kernel."""
    from triton.runtime.driver import driver

    scratch = (lambda: descriptor_scratch(device, True)) if launch.tma else contextlib.nullcontext
    jit = launch.kernel
    with scratch():
        compiled = jit[launch.grid](*launch.args, **launch.params)
    binder = jit.device_caches[driver.active.get_current_device()][4]
    bound, _, _ = binder(*launch.args, **launch.params)
    values = tuple(bound.values())
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    stream = driver.active.get_current_stream(driver.active.get_current_device())

    def via_jit():
        with scratch():
            jit[launch.grid](*launch.args, **launch.params)

    def direct():
        with scratch():
            compiled.run(
                grid[0],
                grid[1],
                grid[2],
                stream,
                compiled.function,
                compiled.packed_metadata,
                None,
                None,
                None,
                *values,
            )

    def scratch_alone():
        with scratch():
            pass

    return {
        "jit": via_jit,
        "binder": lambda: binder(*launch.args, **launch.params),
        "compiled": direct,
        "scratch alone": scratch_alone,
    }


def time_case(name: str, lengths: list[int], heads: int, dim: int, causal: bool, n: int) -> None:
    """Print one row per piece of one eager forward of this pack."""
    from triton.runtime.driver import driver

    device = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    n_tok = sum(lengths)
    q, k, v = (
        torch.randn(n_tok, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(3)
    )
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu = cu.to("cuda")
    mx = max(lengths)

    def call():
        with torch.no_grad():
            return portattn.varlen_attention(
                q, k, v, cu, cu, mx, mx, causal=causal, return_lse=True
            )

    def stream():
        return driver.active.get_current_stream(driver.active.get_current_device())

    def call_run():  # every launch through kernel[grid](...)
        launcher.PREPARED_LAUNCHES = False
        try:
            return call()
        finally:
            launcher.PREPARED_LAUNCHES = True

    want = call_run()
    call()  # the first call of each signature goes through run and keeps its kernel
    got = call()
    same = all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    print(f"| {name} | kept launches give run's bits | {same} |", flush=True)
    launches = capture_launches(call)
    rows = [("public call (no grad)", call), ("public call, launches through run", call_run)]
    rows.append(("run_launches (all)", lambda: plan_mod.run_launches(launches, device)))
    for i, launch in enumerate(launches):
        for piece, fn in launch_pieces(launch, device).items():
            rows.append((f"{i}:{launch.stage} {piece}", fn))
    rows.append(("current device + stream", stream))
    rows.append(("torch.empty_like(q)", lambda: torch.empty_like(q)))
    for piece, fn in rows:
        print(f"| {name} | {piece} | {host_us(fn, n):.1f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    print("| case | piece | host µs |")
    print("| --- | --- | ---: |")
    for case in CASES:
        time_case(*case, n=args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
