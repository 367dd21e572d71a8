"""Command line: ``python -m portattn {check,compile,golden,config}``, also installed as the
``portattn`` console script (``portattn check``); the usage line names the way it was launched.

The benchmarks are not part of the package: ``python benchmarks/bench.py`` in a checkout.

On a machine without a GPU, ``check`` runs the kernels under Triton's interpreter, and says so.
Triton decides between compiling and interpreting when a kernel is defined, i.e. when
``portattn`` is imported, which ``python -m portattn`` has already done by the time this module
runs; so ``check`` re-runs itself in a child process with TRITON_INTERPRET=1 set.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


def needs_interpreter_rerun() -> bool:
    """No GPU and the interpreter is off: the kernels were defined (compiled mode) when
    portattn was imported, so a CPU run must start over with TRITON_INTERPRET=1."""
    return not _gpu_present() and os.environ.get("TRITON_INTERPRET") != "1"


def rerun_under_interpreter(python_args: list[str]) -> int:
    """Run ``python <python_args>`` in a child process with TRITON_INTERPRET=1 (set for that
    process from its start; the package itself never sets it) and return its exit code, or 2
    when this numpy is too new for Triton's interpreter."""
    from portattn.tools.check import numpy_problem

    problem = numpy_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.call([sys.executable, *python_args], env=env)


def _cmd_check(args: argparse.Namespace) -> int:
    if needs_interpreter_rerun():
        return rerun_under_interpreter(
            ["-m", "portattn", "check"] + (["--verbose"] if args.verbose else [])
        )
    from portattn.tools.check import run_check

    return run_check(verbose=args.verbose)


def _cmd_compile(args: argparse.Namespace) -> int:
    from portattn.tools.compilecheck import main as compile_main

    return compile_main(args)


def _cmd_golden(args: argparse.Namespace) -> int:
    from portattn.tools.golden.cli import main as golden_main

    return golden_main(args)


def _cmd_config(args: argparse.Namespace) -> int:
    from portattn.tools.config_cmd import main as config_main

    return config_main(args)


def _add_command(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """The sub-command ``python -m portattn <name>``, which runs ``func(args)``."""
    p = sub.add_parser(name, help=help, description=description)
    p.set_defaults(func=func)
    return p


def prog_name(argv0: str | None = None) -> str:
    """How this command was launched, for the usage line: ``portattn`` from the console
    script (``sys.argv[0]`` is its path), else ``python -m portattn`` (``__main__.py``, or a
    caller of :func:`main`)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return "portattn" if name in ("portattn", "portattn.exe") else "python -m portattn"


COMPILE_DESCRIPTION = (
    "Ahead-of-time compile check, on this machine (no GPU needed; Triton's compiler, not its "
    "interpreter). For each entry of the configuration table (family, kernel, head dim, dtype) "
    "the five Triton kernels (forward, backward preprocess, dK/dV, dQ, decode) are compiled "
    "for the family's GPU target, each entry in a worker process of its own, and checked: it "
    "compiles with the table's tiles and launch options, its shared memory / LDS fits the "
    "family, it spills no registers, the family's matrix instruction (mma.sync, wgmma, "
    "tcgen05.mma, v_mfma) is in the code. Prints a progress line per entry, then a table with "
    "each kernel's shared memory, registers, spills, matrix instructions and machine-code "
    "fingerprint. Exit 0 when every check passes, 1 when one fails, 2 on bad usage. Without "
    "options it compiles every entry of every family (about 13 minutes on a 2-core machine); the "
    "filters select a part (e.g. --family sm90 --head-dim 128), --guarded the entries whose "
    "fingerprints golden/ records (docs/families.md; the checks: portattn/tools/compilecheck.py)."
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog or prog_name(),
        description="portattn: portable, bitwise-deterministic attention kernels in Triton.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_check = _add_command(
        sub,
        "check",
        _cmd_check,
        help="detect the device and check a small case of each kernel against float64",
        description="Detect the device and family, run a small forward+backward case of each "
        "kernel against the float64 reference and print a short report. Without a GPU the "
        "kernels run under Triton's interpreter (float16), and the report says so.",
    )
    p_check.add_argument("-v", "--verbose", action="store_true", help="print every error figure")
    p_compile = _add_command(
        sub,
        "compile",
        _cmd_compile,
        help="compile every configuration for every GPU family on this machine and check it",
        description=COMPILE_DESCRIPTION,
    )
    from portattn.tools.compilecheck import add_arguments

    add_arguments(p_compile)
    p_golden = _add_command(
        sub,
        "golden",
        _cmd_golden,
        help="verify the golden output hashes of this GPU's family (docs/golden.md)",
        description="Golden output hashes per GPU family: verify them bitwise on this GPU, "
        "or check the compile fingerprints beside them (CPU, a full compile). Recording them "
        "(golden refresh, fingerprints --update / --results before) and CI's compile-key check "
        "moved out of the package: python -m ci.golden_dev {refresh,fingerprints,keycheck}, "
        "from a checkout of portattn.",
    )
    from portattn.tools.golden.cli import add_arguments as add_golden_arguments

    add_golden_arguments(p_golden)
    p_config = _add_command(
        sub,
        "config",
        _cmd_config,
        help="print the configuration entry a call runs, each field with the row it comes from",
        description="The configuration entry of a family, kernel, head dim and dtype for the "
        "installed Triton (or --triton X.Y): every field with its source in "
        "portattn/configs/rows.py (the family's row, a Triton version's row, a borrowed head "
        "dim's tiles), and the entry's content hash. Nothing is compiled.",
    )
    from portattn.tools.config_cmd import add_arguments as add_config_arguments

    add_config_arguments(p_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)
