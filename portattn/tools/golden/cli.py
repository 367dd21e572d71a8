"""Command line of ``python -m portattn golden``: hardware detection, arguments, dispatch."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from portattn.tools.golden.commands import (
    compile_fingerprints,
    default_golden_dir,
    results_fingerprints,
    run_refresh,
    run_verify,
    say,
)
from portattn.tools.golden.fingerprints import compile_records, run_fingerprints, run_key_check
from portattn.tools.golden.layout import GoldenError

NOT_A_FAMILY = (
    "no GPU here: golden hashes are recorded and verified on a GPU of a family (sm80, sm90, "
    "sm100, sm120, cdna2, cdna3, cdna4); Triton's CPU interpreter is not a family"
)


@dataclass(frozen=True)
class Hardware:
    """What the machine offers: its family (None if not a golden family) and device."""

    family: str | None
    device: torch.device | None
    name: str


def detect_hardware() -> Hardware:
    """The current GPU and its family; ``device`` is None without a GPU."""
    if not torch.cuda.is_available():
        return Hardware(None, None, "no GPU")
    from portattn.families import family, family_override

    device = torch.device("cuda", torch.cuda.current_device())
    # Under $PORTATTN_FAMILY_OVERRIDE the device runs (and records) the override's family.
    found = family_override(device) or family(device)
    return Hardware(found, device, torch.cuda.get_device_name(device))


def hardware_problem(hw: Hardware, requested: str | None) -> str | None:
    """Why golden hashes cannot be checked or recorded on ``hw`` (for family ``requested``)."""
    if hw.device is None:
        return NOT_A_FAMILY
    if hw.family is None:
        return (
            f"{hw.name} is outside the family table: it runs the nearest family's "
            "configuration but has no golden hashes of its own"
        )
    if requested and requested != hw.family:
        return f"this machine has {hw.name} (family {hw.family}), not a {requested} GPU"
    return None


def _usable_hardware(action: str, args: argparse.Namespace, hw: Hardware | None) -> Hardware | None:
    """``hw`` (default: the detected hardware) when ``golden <action>`` can run on it, else
    None, once the reason is said."""
    hw = hw or detect_hardware()
    problem = hardware_problem(hw, args.family)
    if problem:
        say(f"golden {action}: {problem}")
        return None
    return hw


def cmd_verify(args: argparse.Namespace, hw: Hardware | None = None) -> int:
    """``golden verify``; ``hw`` replaces the detected hardware (tests inject it)."""
    hw = _usable_hardware("verify", args, hw)
    if hw is None:
        return 2
    return run_verify(hw.family, hw.device, args.golden_dir or default_golden_dir(), args.case)


def cmd_refresh(args: argparse.Namespace, hw: Hardware | None = None) -> int:
    """``golden refresh``; ``hw`` replaces the detected hardware (tests inject it)."""
    hw = _usable_hardware("refresh", args, hw)
    if hw is None:
        return 2
    return run_refresh(
        hw.family,
        hw.device,
        args.golden_dir or default_golden_dir(write=True),
        force=args.force,
        case_names=args.case,
        repeat=args.repeat,
        fingerprint_fn=None if args.skip_fingerprints else compile_fingerprints,
    )


def cmd_fingerprints(args: argparse.Namespace) -> int:
    """``golden fingerprints [--update | --full | --results PATH]`` (CPU: needs Triton's
    compiler, not a GPU). Without options: the compile-key check (compiles only what changed)."""
    from portattn.families import FAMILIES

    families = args.family or list(FAMILIES)
    golden_dir = args.golden_dir or default_golden_dir(write=args.update)
    if args.update and args.results:
        say("error: --update compiles every entry itself; it takes no --results")
        return 2
    if args.update or args.full:
        return run_fingerprints(families, golden_dir, args.update)
    if args.results:
        try:
            made = results_fingerprints(args.results)
        except GoldenError as exc:
            say(f"error: {exc}")
            return 2
        return run_fingerprints(families, golden_dir, fingerprint_fn=made)
    return run_key_check(
        families, golden_dir, compile_fn=None if args.no_compile else compile_records
    )


def _add_action(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    parent: argparse.ArgumentParser,
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """The sub-command ``golden <name>``, with ``parent``'s arguments, that runs ``func(args)``."""
    p = sub.add_parser(name, parents=[parent], help=help, description=description)
    p.set_defaults(golden_func=func)
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Sub-commands of ``python -m portattn golden``."""
    from portattn.families import FAMILIES

    sub = parser.add_subparsers(dest="golden_command", metavar="ACTION", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--golden-dir",
        help="directory of <family>.json (default: $PORTATTN_GOLDEN_DIR, else the checkout's "
        "golden/ when run from one, else, to read, the copy installed with portattn)",
    )
    on_gpu = argparse.ArgumentParser(add_help=False, parents=[common])
    on_gpu.add_argument(
        "--family",
        choices=list(FAMILIES),
        help="the family expected here; exit 2 when the GPU is of another one",
    )
    on_gpu.add_argument(
        "--case", action="append", metavar="NAME", help="only this case (repeatable; default: all)"
    )

    _add_action(
        sub,
        "verify",
        cmd_verify,
        on_gpu,
        help="run the recorded cases on this GPU and compare bitwise",
        description="Exit 0: every case matches; 1: a mismatch (the report names "
        "case, tensor, sequence, head and the error vs float64); 2: nothing to "
        "compare (no GPU, wrong family, no golden for this toolchain, stale).",
    )

    p = _add_action(
        sub,
        "refresh",
        cmd_refresh,
        on_gpu,
        help="record the canonical cases' hashes on this GPU into golden/",
        description="Runs every canonical case on this GPU and merges the hashes "
        "into golden/<family>.json under a file lock (temp file + os.replace). "
        "Never drops other toolchains or cases; refuses to change a stored hash "
        "without --force (exit 1, listing the differences).",
    )
    p.add_argument("--force", action="store_true", help="overwrite differing stored hashes")
    p.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="runs per case that must agree bitwise before recording (default 2)",
    )
    p.add_argument(
        "--skip-fingerprints",
        action="store_true",
        help="do not compile the family's fingerprints (outputs recorded without)",
    )

    p = _add_action(
        sub,
        "fingerprints",
        cmd_fingerprints,
        common,
        help="check (or --update) the compile keys and fingerprints in golden/ (CPU)",
        description="Computes every guarded entry's compile key (a hash of everything its "
        "machine code is a function of) without compiling, compiles and checks only the "
        "entries whose key differs from golden/<family>.json, and fails (exit 1) on any "
        "difference. --update compiles every entry and records fingerprints and keys; output "
        "hashes recorded with other machine code become stale until re-recorded on hardware. "
        "--full compiles every entry and compares its fingerprints.",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=list(FAMILIES),
        help="family (repeatable; default: all)",
    )
    p.add_argument(
        "--update", action="store_true", help="compile every entry, store fingerprints and keys"
    )
    p.add_argument(
        "--full", action="store_true", help="compile every entry and compare its fingerprints"
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="the key check names the entries whose key changed without compiling them",
    )
    p.add_argument(
        "--results",
        metavar="PATH",
        help="compare the fingerprints of `python -m portattn compile --guarded --json PATH` "
        "(same Triton) instead of compiling",
    )


def main(args: argparse.Namespace) -> int:
    return args.golden_func(args)
