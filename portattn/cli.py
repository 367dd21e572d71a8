"""Command line: ``python -m portattn {check,compile}``.

On a machine without a GPU, ``check`` runs the kernels under Triton's interpreter: it sets
TRITON_INTERPRET=1 for its own process before importing the kernels, and says so.
"""

from __future__ import annotations

import argparse
import os
import sys


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


def _cmd_check(args: argparse.Namespace) -> int:
    if not _gpu_present() and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            print("error: no GPU and triton already imported; rerun with TRITON_INTERPRET=1")
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    from portattn.check import run_check

    return run_check(verbose=args.verbose)


def _cmd_compile(args: argparse.Namespace) -> int:
    from portattn.compilecheck import main as compile_main

    return compile_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m portattn",
        description="portattn: portable, bitwise-deterministic attention kernels in Triton.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_check = sub.add_parser(
        "check",
        help="detect the device and check a small case of each kernel against float64",
        description="Detect the device and family, run a small forward+backward case of each "
        "kernel against the float64 reference and print a short report. Without a GPU the "
        "kernels run under Triton's interpreter (float16), and the report says so.",
    )
    p_check.add_argument("-v", "--verbose", action="store_true", help="print every error figure")
    p_check.set_defaults(func=_cmd_check)
    p_compile = sub.add_parser(
        "compile",
        help="compile every configuration for every GPU family on this machine and check it",
        description="Ahead-of-time compile check: see portattn.compilecheck.",
    )
    p_compile.set_defaults(func=_cmd_compile)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)
