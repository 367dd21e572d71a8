"""``python benchmarks/bench.py``: portattn's kernels against SDPA and FlexAttention, one run.

Workloads (``benchmarks/workloads.py``) are packed varlen batches in bfloat16: equal-length packs
(2 x 8192 tokens, so dense SDPA is a natural peer) and skewed packs (16k or 32k tokens in
sequences of 64...4096, fixed seed), H = 16 with D = 128 or 64, and GQA with 32 query / 8 kv
heads at D = 128; each causal and full; timed forward and forward+backward.

Peers, timed in the same run: FlashAttention-4 (``flash_attn.cute``, deterministic=True and its
default) where it imports (``source .fa4/install.sh`` on the H200), SDPA with the cuDNN and the
flash backend (equal packs only: they need the dense [B, H, S, D] layout, which the packed
tensors are viewed as, without a copy),
FlexAttention with a document mask (every pack, ``torch.compile``-d), torch's ``varlen_attn``
(``torch.nn.attention.varlen``, FlashAttention-2, on the packed tensors; where the installed
torch has what the workload needs) and both portattn kernels through the public
``portattn.varlen_attention``. An implementation that fails (setup, first
call or timing) gets rows with the error message instead of timings; the run goes on.

Timing. Each implementation's first call per mode runs outside the timings (Triton JIT,
FlexAttention's compile); FlexAttention's first-call seconds are reported as its compile time,
per workload and mode. Inductor's caches apply as found: a pack whose shapes were compiled
before (on disk, or earlier in the run: skewed 16k d64 has the shapes of equal 2x8192 d64)
reports little more than a cache lookup. Then ``HEAT_S`` seconds of untimed calls of every
implementation (the GPU as busy before the first timing as before the others), then ``--passes``
passes (two: the second in reverse order; more: ``pass_order``), each timing every
implementation with ``triton.testing.do_bench(..., return_mode="median")``; the reports take
the best of the medians. While timing, ``torch.compiler`` is set to fail on
a recompile, so a compile can never hide inside a timing (it fails that implementation instead).

L2. The H200 has 50 MiB of L2 and some inputs would fit (16k x 16 x 64 bf16 is 32 MiB).
Triton 3.6's ``do_bench`` (``triton/testing.py``) calls ``runtime.driver.active.clear_cache``
before every timed repeat, outside the timed events; on CUDA that is ``cache.zero_()`` on a
256 MB buffer (``get_empty_cache_for_benchmark`` in ``triton/backends/nvidia/driver.py``),
which evicts everything the previous repeat left in L2. So no repeat reuses L2; nothing more is
done here. (The untimed warm-up calls are not separated by flushes; they are not measured.)

FLOPs: useful FLOPs, flash-attention convention: forward ``4 * Sq * Sk * D`` per query head
and sequence, halved for causal; forward+backward 3.5x forward. Peak memory:
``torch.cuda.max_memory_allocated`` over one call after a reset (outside ``do_bench``, whose
256 MB flush buffer would otherwise count), in GiB, with the resident inputs counted.

Reports (markdown, JSON, PNG chart): :mod:`benchmarks.bench_report`. ``--decode`` runs
:mod:`benchmarks.bench_decode` instead. The chart needs matplotlib (``pip install -e
'.[bench]'``).

Run from a checkout (the benchmarks are not part of the installed package):
``python benchmarks/bench.py [--quick] [--decode] [--json PATH] ...``; ``--help`` lists the
options.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/bench.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import bench_report as report
from benchmarks.bench_report import FLEX, MODES
from benchmarks.peers import Impl, build_impls, fa4_version
from benchmarks.timing import (
    REP_MS,
    WARMUP_MS,
    Step,
    Timer,
    attempt,
    gpu_timer,
    heat,
    pass_order,
    sync,
)
from benchmarks.workloads import Workload, make_inputs, select_workloads

PASSES = 2  # timed passes per (workload, mode); the reports keep each implementation's best
# Seconds of untimed calls of every implementation, round robin, before a mode's first pass.
# Without them the first pass's first implementation was timed faster than in its later pass
# (perf-notes row 111, both cards' JSON: varlen, always first, its forwards 2-4% slower in its
# second pass on average, up to 8%; FA4 det's, third, 3-4% faster in theirs): the first calls
# before it (compiles, FlexAttention's seconds on the CPU) leave the GPU idle, the likely cause.
HEAT_S = 1.0
DOCS_STEM = "docs/bench"  # --docs: docs/bench-<card>.{json,md,png}, relative to the cwd


def docs_stem(stem: str) -> str:
    """``stem`` with the GPU's short name appended (``docs/bench`` -> ``docs/bench-h100`` on an
    H100), so a run on one card never overwrites another card's recorded tables. Without a GPU
    (``plot --docs`` re-rendering a recorded table) the H200's, the card of the issues' targets."""
    if not torch.cuda.is_available():
        return f"{stem}-h200"
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", torch.cuda.get_device_name().upper())
    return f"{stem}-{match.group(1).lower() if match else 'gpu'}"


# torch.cuda covers both: ROCm builds of torch answer through the same API.
NEEDS_GPU = "a GPU (CUDA or ROCm)"


def make_step(impl: Impl, mode: str, q, k, v, do: torch.Tensor | None) -> Step:
    """One timed call: the forward, or the forward and the gradients of q, k and v."""
    if mode == "fwd":
        return lambda: impl.fn(q, k, v)
    dout = impl.view(do)

    def step() -> None:
        out = impl.fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    return step


def _first_call(impl: Impl, mode: str, args: tuple, do: torch.Tensor | None):
    """The step of ``impl`` in ``mode`` and the seconds of its first call (compiles included)."""
    step = make_step(impl, mode, *args, do)
    t0 = time.perf_counter()
    step()
    sync(args[0].device)
    return step, time.perf_counter() - t0


def _row(w: Workload, mode: str, impl: str, pass_: int | None, **fields: Any) -> dict[str, Any]:
    """One row of the results (fields described in :mod:`benchmarks.bench_report`)."""
    row = {"workload": w.name, "mode": mode, "impl": impl, "pass": pass_, "ms": None}
    row.update(tflops=None, peak_gib=None, resident_gib=None, error=None)
    row.update(fields)
    return row


def run_workload(
    w: Workload,
    impls: dict[str, Impl | str],
    inputs: tuple[torch.Tensor, ...],
    timer: Timer = gpu_timer,
    log: Callable[[str], None] = print,
    passes: int = PASSES,
    heat_s: float = HEAT_S,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Time every implementation on ``w`` in both modes. Returns the rows and FlexAttention's
    first-call (compile) seconds per mode. A failure gives a row with the error, never raises."""
    q, k, v = inputs[:3]
    rows: list[dict[str, Any]] = []
    compile_s: dict[str, float] = {}

    def failed(name: str, mode: str, error: str, pass_: int | None = None) -> None:
        rows.append(_row(w, mode, name, pass_, error=error))
        log(f"{w.name:32s} {mode:8s} {name:22s} FAILED: {error[:300]}")

    for mode in MODES:
        if mode == "fwd":
            args, do = (q, k, v), None
        else:  # leaves of their own; autograd.grad returns the gradients, accumulates nothing
            args = tuple(x.detach().requires_grad_() for x in (q, k, v))
            do = torch.randn_like(q)
        steps: dict[str, Step] = {}
        for name, impl in impls.items():
            if isinstance(impl, str):  # its setup failed
                failed(name, mode, impl)
                continue

            # The first call compiles (Triton JIT, torch.compile): never inside a timing.
            result, error = attempt(_first_call, impl, mode, args, do)
            if error is not None:
                failed(name, mode, error)
                continue
            steps[name], first_s = result
            if name == FLEX:
                compile_s[mode] = first_s
                log(f"{w.name:32s} {mode:8s} {name:22s} compile {first_s:6.1f} s")
        heat(list(steps.values()), heat_s)
        for pass_ in range(passes):
            for position, name in enumerate(pass_order(list(steps), pass_, passes)):
                result, error = attempt(timer, steps[name])
                if error is not None:
                    failed(name, mode, error, pass_)
                    continue
                ms, peak, resident = result
                tflops = w.flops(mode) / ms / 1e9
                fields = dict(ms=ms, tflops=tflops, peak_gib=peak, resident_gib=resident)
                fields.update(position=position)
                rows.append(_row(w, mode, name, pass_, **fields))
                log(f"{w.name:32s} {mode:8s} {name:22s} {ms:8.3f} ms {tflops:7.1f} TF/s")
    return rows, compile_s


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def metadata() -> dict[str, Any]:
    """Device, versions, git commit (None outside a checkout), date and command line."""
    import triton

    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):  # python benchmarks/bench.py ...
        argv = ["python", *argv]
    status = _git("status", "--porcelain", "--untracked-files=no")
    return dict(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        git_commit=_git("rev-parse", "HEAD"),
        git_dirty=None if status is None else bool(status),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join(argv),
        do_bench=dict(warmup_ms=WARMUP_MS, rep_ms=REP_MS, return_mode="median"),
        fa4=fa4_version(),
    )


def run(
    workloads: list[Workload],
    log: Callable[[str], None] = print,
    impls: list[str] | None = None,
    passes: int = PASSES,
    after_workload: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark on the current CUDA device; returns the data the reports take.
    ``after_workload(data)``: called with the rows so far after each workload (a run cut
    short by a time limit keeps what it measured)."""
    data = metadata()
    data.update(workloads=[w.describe() for w in workloads], rows=[], flex_compile_s={})
    data.update(passes=passes, heat_s=HEAT_S)
    for w in workloads:
        inputs = make_inputs(w)
        built = build_impls(w, inputs[3], impls)
        rows, compile_s = run_workload(w, built, inputs, log=log, passes=passes)
        data["rows"] += rows
        if compile_s:
            data["flex_compile_s"][w.name] = compile_s
        del inputs
        torch.cuda.empty_cache()  # the next workload's peaks start from a clean allocator
        if after_workload is not None:
            after_workload(data)
    return data


# --- command line -----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python benchmarks/bench.py``."""
    p.add_argument(
        "action",
        nargs="?",
        choices=("run", "plot"),
        default="run",
        help="run (default): time on this GPU; plot: render --png (and --markdown) from --json",
    )
    p.add_argument("--quick", action="store_true", help="only d128 H=16: equal 2x8192, skewed 32k")
    p.add_argument(
        "--workloads",
        action="append",
        metavar="SUBSTRING",
        help="only workloads whose name contains SUBSTRING (case-insensitive; repeatable)",
    )
    p.add_argument(
        "--impls",
        action="append",
        metavar="SUBSTRING",
        help="only implementations whose name contains SUBSTRING (case-insensitive; "
        "repeatable), e.g. --impls portattn --impls FA4",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="also the skewed packs drawn with seeds 1 .. N-1 (default 1: seed 0 only; each "
        "seed adds 6 workloads, about 3.5 minutes on an H100)",
    )
    p.add_argument("--list", action="store_true", help="print the selected workloads and exit")
    p.add_argument(
        "--passes",
        type=int,
        default=PASSES,
        metavar="N",
        help=f"timed passes per workload and mode, each implementation early in some and late "
        f"in others (default {PASSES}: in order, then reversed); the reports keep the best",
    )
    p.add_argument("--json", metavar="PATH", help="raw rows and metadata (plot: read from here)")
    p.add_argument("--markdown", metavar="PATH", help="write the markdown summary here")
    p.add_argument(
        "--png",
        "--plot",
        dest="png",
        metavar="PATH",
        help="bar chart (needs matplotlib: the `bench` extra; without it, render later with "
        "`plot`)",
    )
    p.add_argument(
        "--docs",
        action="store_true",
        help=f"default --json/--markdown/--png to {DOCS_STEM}-<card>.{{json,md,png}}",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="the decode/append benchmark against a KV cache instead (benchmarks/bench_decode.py; "
        "--quick, --workloads, --list, --json, --markdown and --docs apply to it)",
    )


def _write_png(data: dict[str, Any], png: str, json_path: str | None) -> bool:
    try:
        report.plot(data, png)
    except ImportError as exc:
        later = json_path or "RUN.json"
        print(
            f"no chart: {exc}; or render it where matplotlib is installed "
            f"with: python benchmarks/bench.py plot --json {later} --png {png}",
            file=sys.stderr,
        )
        return False
    print(f"wrote {png}")
    return True


def command(args: argparse.Namespace) -> int:
    """The benchmark (not ``--decode``) for parsed ``args``. Exit status: 0 done, 2 usage error
    or no GPU, 3 (plot) matplotlib missing."""
    if args.docs:
        for attr, ext in (("json", "json"), ("markdown", "md"), ("png", "png")):
            if getattr(args, attr) is None:
                setattr(args, attr, f"{docs_stem(DOCS_STEM)}.{ext}")
    if args.action == "plot":
        if not args.json or not (args.png or args.markdown):
            print("plot needs --json PATH and --png PATH (or --markdown PATH)", file=sys.stderr)
            return 2
        if not Path(args.json).is_file():
            print(f"plot: no such file: {args.json}", file=sys.stderr)
            return 2
        data = report.load_json(args.json)
        if args.markdown:
            Path(args.markdown).write_text(report.markdown(data), encoding="utf-8")
            print(f"wrote {args.markdown}")
        return 0 if not args.png or _write_png(data, args.png, args.json) else 3

    workloads = select_workloads(args.quick, args.workloads, getattr(args, "seeds", 1))
    if not workloads:
        names = "\n  ".join(w.name for w in select_workloads(args.quick))
        print(
            f"no workload matches {args.workloads}; the workloads are:\n  {names}", file=sys.stderr
        )
        return 2
    if args.passes < 1:
        print(f"--passes must be at least 1, got {args.passes}", file=sys.stderr)
        return 2
    if args.list:
        for w in workloads:
            print(f"{w.name:32s} {len(w.lengths):3d} sequences, {sum(w.lengths)} tokens")
        return 0
    if not torch.cuda.is_available():
        print(
            f"error: python benchmarks/bench.py times kernels on {NEEDS_GPU} and none is "
            "available here (torch.cuda.is_available() is False). `--list` and `plot` work "
            "without one.",
            file=sys.stderr,
        )
        return 2

    def partial(data: dict[str, Any]) -> None:  # the JSON so far, rewritten after each workload
        if args.json:
            report.write_json(args.json, data)

    data = run(workloads, impls=args.impls, passes=args.passes, after_workload=partial)
    text = report.markdown(data)
    print(text)
    report.write_reports(data, text, args.json, args.markdown)
    if args.png:
        _write_png(data, args.png, args.json)  # a missing matplotlib does not fail the run
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Benchmark portattn's kernels against SDPA (cuDNN, flash) and "
        "FlexAttention on packed bfloat16 workloads (docs/performance.md): prints a markdown "
        "table, optionally writes JSON, markdown and a PNG chart. `plot` renders the chart "
        "(and markdown) from a JSON file, on any machine with matplotlib. --decode: the "
        "decode/append benchmark against a KV cache.",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.decode:
        if args.passes != PASSES:
            parser.error("--passes applies to the training benchmark, not to --decode")
        from benchmarks import bench_decode  # it imports this module: imported here, not above

        return bench_decode.main(args)
    return command(args)


if __name__ == "__main__":
    # Through the package's module, so that bench_decode and this run share one copy of it.
    from benchmarks.bench import main as package_main

    raise SystemExit(package_main())
