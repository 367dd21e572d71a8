"""Ahead-of-time compile check (``python -m portattn compile``): every kernel of every
configuration entry compiled for its family's target without a GPU, and checked (compiles with
the table's tiles, fits shared memory, no spills, the family's matrix instruction; docs/families.md,
"The ahead-of-time compile check"); each kernel's fingerprint is the SHA-256 of its machine code
(:mod:`.compile_artifacts`).

The launches compiled are the real planners' for a representative call on CPU tensors
(:mod:`.compile_launches`), specialised as Triton's JIT does it
(:func:`.compile_inputs.specialize`): causal, with GQA and a ``dlse`` input. Fingerprints
describe that specialisation.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from typing import Any

from portattn.configs import (
    KERNELS,
    PAIR_HEAD_DIMS,
    SUPPORTED_HEAD_DIMS,
    VALUE_HEAD_DIM_PAIRS,
    KernelConfig,
    interpreter_active,
)
from portattn.families import FAMILIES, Family
from portattn.tools.compile_artifacts import (
    HAS_PRODUCT,
    Artifacts,
    check_artifacts,
    matrix_instruction,
    merge_artifacts,
)
from portattn.tools.compile_inputs import compile_source, guarded_entries, pinned_knobs
from portattn.tools.compile_launches import (
    CHECKED_STAGES,
    DTYPE_ALIASES,
    GUARDED_STAGES,
    STAGES,
    Entry,
    Launch,
    compiler_env,
    entry_stages,
    record_launches,
    select_entries,
    table_mismatches,
)

CI_HEAD_DIMS = (128, 64, 80)  # 80: a borrowed head dim (the d96 row), Phi-2's
# --head-dim's choices: the supported head dims and the q/k ones of VALUE_HEAD_DIM_PAIRS (192)
_QK_HEAD_DIMS = sorted(set(SUPPORTED_HEAD_DIMS) | {d for d, _ in VALUE_HEAD_DIM_PAIRS})
CI_DTYPES = ("bf16",)


@dataclass
class KernelResult:
    """Outcome of compiling and checking one kernel of one entry."""

    entry: Entry
    stage: str
    config_hash: str
    failures: list[str] = field(default_factory=list)
    shared: int | None = None
    regs: int | None = None
    spills: int | None = None  # CUDA: spill store+load bytes; ROCm: spilled VGPRs
    scratch: int | None = None  # CUDA: stack frame bytes; ROCm: private segment bytes
    sgpr_spills: int | None = None  # ROCm only: SGPRs spilled (to VGPR lanes unless scratch)
    mma: int | None = None  # matrix instructions found; None where none is expected
    # CUDA: ptxas serialized the wgmma instructions (C7515: each waits for the one before;
    # removing it from sm90 varlen d128 dK/dV, with head-major lse, cut that kernel's time by a
    # fifth). Reported, not a failure.
    wgmma_serialized: bool | None = None
    fingerprint: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def record(self) -> dict[str, Any]:
        """The JSON record of this kernel (golden files keep these)."""
        skip = ("entry", "stage", "seconds")
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        return record | {"ok": self.ok}


# ----------------------------------------------------------------------------- compile


def compile_launch(launch: Launch, family: Family) -> Artifacts:
    """Compile one recorded launch for ``family``'s target (call inside :func:`pinned_knobs`)."""
    import triton
    from triton.compiler.compiler import make_backend

    target = family.target()
    src, options = compile_source(launch, make_backend(target))
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(src, target=target, options=options)
    asm = kernel.asm["ptx"] if target.backend == "cuda" else kernel.asm["amdgcn"]
    return Artifacts(kernel.metadata.shared, kernel.kernel, asm, log.getvalue())


# ----------------------------------------------------------------------------- checks


def check_entry(
    entry: Entry,
    family: Family | None = None,
    cfg: KernelConfig | None = None,
    stages: Iterable[str] = STAGES,
) -> list[KernelResult]:
    """Compile and check the kernels ``stages`` of ``entry`` (those it launches: the chunk
    merge's only with a key chunk, ``entry_stages``). ``family`` (its limits, its instruction)
    and ``cfg`` (the tiles) replace the table's, for tests and tuning."""
    family = family or FAMILIES[entry.family]
    cfg = cfg or entry.config()
    config_hash = cfg.content_hash()
    results = [KernelResult(entry, stage, config_hash) for stage in entry_stages(cfg, stages)]
    try:
        launches = record_launches(entry, cfg)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        for result in results:
            failure = f"launch recording failed for {entry.family} {entry.label}: "
            result.failures.append(failure + error_summary(exc))
        return results
    with tempfile.TemporaryDirectory(prefix="portattn-cc-") as cache_dir, pinned_knobs(cache_dir):
        for result in results:
            group = launches[result.stage]
            for launch in group:
                result.failures.extend(table_mismatches(launch, cfg))
            start = time.perf_counter()
            parts = _compile_group(result, group, family)
            if parts is not None:
                check_artifacts(result, merge_artifacts(parts), family)
            result.seconds = time.perf_counter() - start
    return results


def _compile_group(
    result: KernelResult, group: tuple[Launch, ...], family: Family
) -> list[Artifacts] | None:
    """Compile one stage's launches; None (and a failure naming the kernel, the entry and
    Triton's error) when one does not compile."""
    parts = []
    for launch in group:
        try:
            parts.append(compile_launch(launch, family))
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile fails
            kernel = getattr(launch.fn, "__name__", launch.stage)
            entry = f"{result.entry.family} {result.entry.label}"
            result.failures.append(f"compile failed: {kernel} ({entry}): {error_summary(exc)}")
            return None
    return parts


ERROR_LINES = 3  # lines of the real error a failure keeps
ERROR_CHARS = 400


def error_summary(exc: BaseException) -> str:
    """What went wrong, in one line: the type and first lines of the innermost cause, and where
    in the kernel source it happened. Triton wraps an error in a ``CompilationError`` per jit
    function on the call path (each message a source excerpt ending in a ``^`` line, the
    outermost often nothing else); the innermost locates it, and its cause (or, without one,
    its own message) says what failed."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 100:
        chain.append(chain[-1].__cause__)
    located = [e for e in chain if _is_compilation_error(e)]
    root = chain[-1]
    text = (root.error_message or "") if _is_compilation_error(root) else str(root)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("^")][:ERROR_LINES]
    summary = f"{type(root).__name__}: {' | '.join(lines) or '(no message)'}"
    if located:
        summary += f" (at {_source_location(located[-1])})"
    return summary if len(summary) <= ERROR_CHARS else summary[: ERROR_CHARS - 3] + "..."


def _is_compilation_error(exc: BaseException) -> bool:
    """Triton's ``CompilationError`` (duck-typed: its module moved between releases)."""
    return type(exc).__name__ == "CompilationError" and hasattr(exc, "error_message")


def _source_location(exc: Any) -> str:
    """``function line N: source`` of a ``CompilationError`` (N counts from the ``def``)."""
    src, node = getattr(exc, "src", None), getattr(exc, "node", None)
    lineno = getattr(node, "lineno", None)
    if not isinstance(src, str) or not lineno:
        return "unknown location"
    src_lines = src.splitlines()
    name = re.match(r"\s*def\s+(\w+)", src)
    code = src_lines[lineno - 1].strip() if lineno <= len(src_lines) else ""
    return f"{name[1] if name else '?'} line {lineno}: {code}"


# ----------------------------------------------------------------------------- running


def _leave_now() -> None:
    """A worker's exit: flush what it printed, then leave without the interpreter's teardown,
    where Triton 3.9's bindings (nanobind) print ~50 lines of "leaked instances" (module-level
    caches the exit frees anyway) that read like a crash between the progress lines. Status 0:
    the pool reads results from the worker's pipe, already written by then, not its status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced
            stream.flush()
    os._exit(0)


def quiet_exit() -> None:
    """A ``ProcessPoolExecutor`` initializer: registered last, :func:`_leave_now` runs first
    among the worker's ``atexit`` handlers, after its loop has returned."""
    atexit.register(_leave_now)


def run_entries(
    entries: list[Entry], jobs: int, progress=None, stages: tuple[str, ...] = CHECKED_STAGES
) -> list[KernelResult]:
    """Check ``entries`` on ``jobs`` worker processes, each entry in a fresh one.

    A fresh process per entry, because Triton 3.9's AMD codegen library keeps state from one
    compile to the next: after another entry compiled in the same process, cdna3's
    fixed_order/d96/bf16 ``bwd_dkdv`` schedules and reassociates a few integer adds
    differently (other machine code, so another fingerprint). An entry's stages always compile
    in ``stages`` order within its process (golden/'s :data:`GUARDED_STAGES`, or those and the
    repair passes'). ``progress(done, total, entry_results)`` is called as each entry finishes."""
    import multiprocessing

    results: list[KernelResult] = []
    ctx = multiprocessing.get_context("spawn")
    workers = max(1, min(jobs, len(entries)))
    # quiet_exit: no nanobind leak report from Triton 3.9 as each worker ends
    with ProcessPoolExecutor(workers, ctx, quiet_exit, max_tasks_per_child=1) as pool:
        futures = [pool.submit(check_entry, entry, stages=stages) for entry in entries]
        for i, future in enumerate(as_completed(futures)):
            results.extend(part := future.result())
            if progress:
                progress(i + 1, len(entries), part)
    order = {e: i for i, e in enumerate(entries)}
    return sorted(results, key=lambda r: (order[r.entry], CHECKED_STAGES.index(r.stage)))


def results_json(results: list[KernelResult]) -> dict[str, dict[str, dict[str, dict]]]:
    """family -> entry label -> kernel stage -> record."""
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for r in results:
        out.setdefault(r.entry.family, {}).setdefault(r.entry.label, {})[r.stage] = r.record()
    return out


def compile_records(family: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Compile and check every guarded entry of ``family`` (``compile_inputs.guarded_entries``,
    the set golden/ records; each entry whole, its stages in order in one process): entry label
    -> stage -> record (:meth:`KernelResult.record`: fingerprint, ok, resources). Under Triton's
    interpreter the compile runs in a child process without ``TRITON_INTERPRET``."""
    if interpreter_active():
        return _run_child(["--family", family, "--guarded"]).get(family, {})
    entries = guarded_entries(family)
    jobs = min(os.cpu_count() or 1, len(entries))
    return results_json(run_entries(entries, jobs, stages=GUARDED_STAGES)).get(family, {})


def _run_child(argv: list[str]) -> dict:
    env = compiler_env()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "results.json")
        cmd = [sys.executable, "-m", "portattn", "compile", "--quiet", "--json", path, *argv]
        proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True)
        if not os.path.exists(path):
            raise RuntimeError(
                f"compile check child failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
            )
        with open(path) as f:
            return json.load(f)


# ----------------------------------------------------------------------------- report


COLUMNS = ("family", "kernel", "stage", "d", "dtype", "shared", "regs", "spills", "mma")
COLUMNS += ("fingerprint", "status")


def _row(r: KernelResult) -> tuple[str, ...]:
    if not HAS_PRODUCT[r.stage]:
        mma = "n/a"
    else:
        instr = matrix_instruction(r.entry, r.stage, FAMILIES[r.entry.family])
        mma = f"{instr} x{r.mma}" if r.mma else "NONE"
    spills = str(r.spills) + (f" (s{r.sgpr_spills})" if r.sgpr_spills else "")
    status = "ok" if r.ok else "FAIL: " + "; ".join(r.failures)
    if r.wgmma_serialized:
        status += " (wgmma serialized, C7515)"
    e = r.entry
    dims = f"{e.head_dim}/{e.head_dim_v}" if e.head_dim_v else e.head_dim
    cells = (e.family, e.kernel, r.stage, dims, e.dtype, r.shared, r.regs, spills, mma)
    return (*map(str, cells), (r.fingerprint or "-")[:12], status)


def format_table(results: list[KernelResult]) -> str:
    rows = [COLUMNS] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows
    ]
    return "\n".join(lines)


def _progress_line(done: int, total: int, part: list[KernelResult]) -> None:
    e = part[0].entry
    bad = [r for r in part if not r.ok]
    status = "ok" if not bad else f"FAIL ({', '.join(r.stage for r in bad)})"
    secs = sum(r.seconds for r in part)
    print(f"[{done:3d}/{total}] {e.family:5s} {e.label:22s} {status}  ({secs:.1f} s)", flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m portattn compile``."""
    filters = (
        ("--family", str, list(FAMILIES), "family (default: all)"),
        ("--kernel", str, list(KERNELS), "kernel (default: both)"),
        ("--head-dim", int, _QK_HEAD_DIMS, "head dim (default: the table's)"),
        ("--dtype", str, sorted(DTYPE_ALIASES), "input dtype (default: both)"),
    )
    for flag, kind, choices, text in filters:
        parser.add_argument(flag, action="append", type=kind, choices=choices, help=text)
    dv_help = "v's own head dim, with --head-dim: e.g. --head-dim 192 --head-dim-v 128 (MLA)"
    parser.add_argument("--head-dim-v", type=int, choices=PAIR_HEAD_DIMS, help=dv_help)
    ci = "ci: every family, both kernels, head dims 128, 64, 80, bf16 (filters still apply)"
    parser.add_argument("--subset", choices=["ci"], help=ci)
    guarded = (
        "every entry golden/ records (the table's, and the borrowed head dims and value-head-dim "
        "pairs of compile_inputs); --family still applies, the other filters do not"
    )
    parser.add_argument("--guarded", action="store_true", help=guarded)
    json_help = "write family -> entry -> kernel -> record as JSON"
    parser.add_argument("--json", metavar="PATH", help=json_help)
    jobs_help = "worker processes (default: CPU count)"
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help=jobs_help)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or table")


def _entries_from_args(args: argparse.Namespace) -> list[Entry]:
    if getattr(args, "guarded", False):
        if args.kernel or args.head_dim or args.dtype or args.subset:
            raise ValueError("--guarded takes --family, no other filter")
        return [e for f in args.family or FAMILIES for e in guarded_entries(f)]
    head_dims, dtypes = args.head_dim, args.dtype
    if args.subset == "ci":
        head_dims = head_dims or list(CI_HEAD_DIMS)
        dtypes = dtypes or list(CI_DTYPES)
    head_dim_v = getattr(args, "head_dim_v", None)
    if head_dim_v and not head_dims:
        raise ValueError("--head-dim-v needs --head-dim (the q/k head dims to pair it with)")
    return select_entries(args.family, args.kernel, head_dims, dtypes, head_dim_v)


def _check_json_path(path: str | None) -> None:
    """``--json PATH`` must be writable where it points before the compile, which takes
    minutes (it died after the compile with FileNotFoundError)."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--json {path} is a folder, not a file; nothing compiled")
    if not os.path.isdir(folder):
        raise ValueError(f"--json {path}: the folder {folder} does not exist; nothing compiled")


def main(args: argparse.Namespace) -> int:
    """Run the compile check; 0 when every check passed, 1 otherwise, 2 on bad usage."""
    if interpreter_active():
        print("error: the compile check needs Triton's compiler; unset TRITON_INTERPRET")
        return 2
    try:
        entries = _entries_from_args(args)
        _check_json_path(args.json)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    import triton

    quiet = getattr(args, "quiet", False)
    jobs = max(1, min(getattr(args, "jobs", 1) or 1, len(entries)))
    # --guarded compiles what golden/ records (GUARDED_STAGES); otherwise the repair passes too
    stages = GUARDED_STAGES if getattr(args, "guarded", False) else CHECKED_STAGES
    if not quiet:
        kernels = sum(len(entry_stages(e.config(), stages)) for e in entries)
        what = f"{len(entries)} entries, {kernels} kernels with Triton {triton.__version__}"
        print(f"compiling {what} on {jobs} process(es)", flush=True)
    start = time.perf_counter()
    results = run_entries(entries, jobs, None if quiet else _progress_line, stages)
    elapsed = time.perf_counter() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results_json(results), f, indent=1, sort_keys=True)
    failed = [r for r in results if not r.ok]
    if not quiet:
        print(format_table(results))
        print(f"{len(results)} kernels, {len(failed)} failed, {elapsed:.0f} s", flush=True)
    return 1 if failed else 0
