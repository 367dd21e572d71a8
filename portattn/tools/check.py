"""``python -m portattn check``: detect the device and check a small case of each kernel.

For each kernel, each dtype and causal off/on, one small packed case runs forward and backward
(upstream gradients on both ``out`` and ``lse``) against the float64 reference with the test
suite's acceptance rule (:mod:`portattn.accuracy`): each error at most twice that
of the same computation done eagerly in the input dtype plus a margin; no NaN, ``-inf`` lse
exactly on the rows that see no key, and exactly 0 wherever the reference is (the output buffers
start as NaN, so an element the kernels never write shows up).

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, which the CLI
sets for its own child process) and only float16 is checked (the interpreter mishandles bfloat16
``tl.dot`` operands, triton-lang/triton#11584).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import torch

from portattn.accuracy import LSE_MARGIN, REL_MARGIN
from portattn.tools.harness import (
    NAMES,
    Pack,
    cu_seqlens,
    measure,
    run_kernel,
    run_reference,
    seeded_inputs,
    zero_where_no_key,
)

# Sequence lengths of the pack: an empty query sequence whose keys nobody sees, a decode-like
# sequence (Sq < Sk) and one with Sq > Sk (causal: its first Sq - Sk rows see no key).
LENS_Q = (0, 17, 63)
LENS_K = (9, 40, 50)
N_HEADS_Q, N_HEADS_K, HEAD_DIM = 4, 2, 64
KERNELS = ("varlen", "fixed_order")


@dataclass
class CaseResult:
    kernel: str
    dtype: torch.dtype
    causal: bool
    errors: dict[str, float] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.problems


def check_case(
    kernel: str,
    dtype: torch.dtype,
    causal: bool,
    device: torch.device,
    lens_q: tuple[int, ...] = LENS_Q,
    lens_k: tuple[int, ...] = LENS_K,
    head_dim: int = HEAD_DIM,
) -> CaseResult:
    """One packed case (``N_HEADS_Q`` / ``N_HEADS_K`` heads) forward and backward against
    float64 with the accuracy rule; the defaults are the case ``python -m portattn check`` runs
    (``ci/tune_sm90.py`` passes others)."""
    result = CaseResult(kernel, dtype, causal)
    start = time.perf_counter()
    q, k, v, dout, dlse = seeded_inputs(
        lens_q, lens_k, N_HEADS_Q, N_HEADS_K, head_dim, dtype, device, seed=0
    )
    pack = Pack(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), dout, dlse)
    ref = run_reference(pack, causal=causal)
    # Rows that see no key have lse = -inf; their upstream lse gradient is meaningless: the
    # eager yardstick and the kernels get dlse zeroed on the reference's -inf rows.
    pack = dataclasses.replace(pack, dlse=zero_where_no_key(dlse, ref["lse"]))
    eager = run_reference(pack, causal=causal, compute_dtype=dtype)
    try:  # output buffers start as NaN: an element the kernels never write shows up
        got = run_kernel(pack, causal=causal, kernel=kernel, poison=True)
    except Exception as exc:  # report, keep checking the other cases
        result.problems.append(f"raised {type(exc).__name__}: {exc}")
        result.seconds = time.perf_counter() - start
        return result

    for name in NAMES:
        x, r = got[name], ref[name]
        if x.shape != r.shape:
            result.problems.append(f"{name} has shape {tuple(x.shape)}, expected {tuple(r.shape)}")
            continue
        if torch.isnan(x).any():
            result.problems.append(f"{name} has {int(torch.isnan(x).sum())} NaN (unwritten?)")
            continue
        if name == "lse":
            if not torch.equal(torch.isneginf(x), torch.isneginf(r)):
                result.problems.append("lse is -inf on different rows than the reference")
                continue
            margin = LSE_MARGIN
        else:
            if not torch.isfinite(x).all():
                result.problems.append(f"{name} has inf")
                continue
            exact_zero = r == 0
            if (x[exact_zero] != 0).any():
                result.problems.append(f"{name} is not 0 where the reference is exactly 0")
                continue
            margin = REL_MARGIN
        err, base, result.limits[name] = measure(name, x, r, eager[name])
        result.errors[name] = err
        if not err <= result.limits[name]:
            result.problems.append(
                f"{name}: error {err:.3g} > limit {result.limits[name]:.3g} "
                f"(2 x eager {_short(dtype)} {base:.3g} + {margin:g})"
            )
    result.seconds = time.perf_counter() - start
    return result


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _describe_device() -> tuple[torch.device, list[torch.dtype], list[str]]:
    """The device to check, the dtypes to check on it, and report lines about it."""
    from portattn.families import FAMILIES, OVERRIDE_ENV, config_family, family, family_override

    if not torch.cuda.is_available():
        lines = [
            f"device:  no GPU ({_cpu_name()}, {os.cpu_count()} cores); family: none",
            "no GPU: kernels ran under Triton's interpreter (TRITON_INTERPRET=1), float16",
        ]
        return torch.device("cpu"), [torch.float16], lines
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip is not None:
        arch = f"ROCm {torch.version.hip}, {getattr(props, 'gcnArchName', '?')}"
    else:
        arch = f"CUDA {torch.version.cuda}, compute capability {props.major}.{props.minor}"
    fam = family()
    if fam is not None:
        fam_line = f"family:  {fam} ({FAMILIES[fam].devices})"
    else:
        fam_line = (
            f"family:  none (device outside the family table; runs the nearest family's "
            f"configuration, {config_family(device)}; no golden family)"
        )
    lines = [f"device:  {torch.cuda.get_device_name(device)} ({arch})", fam_line]
    override = family_override(device)
    if override is not None:
        lines.append(
            f"config:  {override}'s entries, as its PTX JIT-compiled by the driver "
            f"({OVERRIDE_ENV}={override})"
        )
    return device, [torch.bfloat16, torch.float16], lines


def numpy_problem() -> str | None:
    """Why Triton's interpreter cannot run with this environment's numpy, or None."""
    try:
        import numpy
    except ImportError:
        return "Triton's interpreter needs numpy: pip install 'numpy>=1.26,<2.4'"
    major, minor = (int(x) for x in numpy.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        return (
            f"numpy {numpy.__version__}: Triton 3.6's interpreter fails with numpy >= 2.4 (int() "
            "of 1-element arrays); pip install 'numpy>=1.26,<2.4'"
        )
    return None


def _interpreter_problem() -> str | None:
    """Why the kernels cannot run under Triton's interpreter here, or None."""
    from portattn.configs import interpreter_active

    if not interpreter_active():
        return (
            "no GPU, and TRITON_INTERPRET=1 is not set: set it before Python starts (or use "
            "`python -m portattn check`, which sets it for its own process)"
        )
    return numpy_problem()


def _fmt_row(cells, widths) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def run_check(verbose: bool = False) -> int:
    """Run the check and print the report. Returns 0 when every case passes, 1 otherwise
    (2 when kernels cannot run at all: no GPU and the interpreter is not enabled)."""
    import triton

    import portattn

    print("portattn check")
    print(
        f"versions: portattn {portattn.__version__}, torch {torch.__version__}, "
        f"triton {triton.__version__}, python {platform.python_version()}"
    )
    device, dtypes, lines = _describe_device()
    for line in lines:
        print(line)
    if device.type == "cpu":
        problem = _interpreter_problem()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    print(
        f"case:    {len(LENS_Q)} sequences, Sq {LENS_Q}, Sk {LENS_K}, Hq {N_HEADS_Q}, "
        f"Hkv {N_HEADS_K}, D {HEAD_DIM}; forward + backward (gradients on out and lse) "
        f"vs float64 reference"
    )
    print(
        f"rule:    error <= 2 x (eager same-dtype error) + {REL_MARGIN:g} (out, dq, dk, dv: "
        f"relative Frobenius; lse: max abs, margin {LSE_MARGIN:g}); no NaN; all outputs written"
    )
    print()

    header = ["kernel", "dtype", "causal", *NAMES, "time", "result"]
    widths = [11, 8, 6, 9, 9, 9, 9, 9, 6, 6]
    print(_fmt_row(header, widths))
    results = []
    for dtype in dtypes:
        for kernel in KERNELS:
            for causal in (False, True):
                res = check_case(kernel, dtype, causal, device)
                results.append(res)
                errs = [f"{res.errors[n]:.2e}" if n in res.errors else "-" for n in NAMES]
                cells = [kernel, _short(dtype), "yes" if causal else "no", *errs]
                cells += [f"{res.seconds:.1f}s", "PASS" if res.passed else "FAIL"]
                print(_fmt_row(cells, widths))
                if verbose and res.limits:
                    lims = [f"{res.limits[n]:.2e}" if n in res.limits else "-" for n in NAMES]
                    print(_fmt_row(["", "", "limit", *lims], widths[:8]))
                for problem in res.problems:
                    print(f"    FAIL {problem}")
    failed = [r for r in results if not r.passed]
    print()
    if failed:
        print(f"FAIL: {len(failed)} of {len(results)} cases failed")
        return 1
    print(f"PASS: {len(results)} of {len(results)} cases")
    return 0
