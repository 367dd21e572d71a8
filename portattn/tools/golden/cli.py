"""Command line of ``python -m portattn golden``: hardware detection, arguments, dispatch.

Recording (``refresh``, ``fingerprints --update``), ``fingerprints --results`` and the
compile-key check are the checkout's ``python -m ci.golden_dev`` (the ``golden`` parser's
description says so)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from portattn.tools.golden.fingerprints import run_fingerprints
from portattn.tools.golden.verify import default_golden_dir, run_verify, say

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


def usable_hardware(action: str, args: argparse.Namespace, hw: Hardware | None) -> Hardware | None:
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
    hw = usable_hardware("verify", args, hw)
    if hw is None:
        return 2
    return run_verify(hw.family, hw.device, args.golden_dir or default_golden_dir(), args.case)


def cmd_fingerprints(args: argparse.Namespace) -> int:
    """``golden fingerprints`` (CPU: needs Triton's compiler, not a GPU): compile every guarded
    entry and compare its fingerprints."""
    from portattn.families import FAMILIES

    families = args.family or list(FAMILIES)
    return run_fingerprints(families, args.golden_dir or default_golden_dir())


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
        "fingerprints",
        cmd_fingerprints,
        common,
        help="compile every guarded entry and compare its fingerprints with golden/ (CPU)",
        description="Compiles every guarded entry and compares its fingerprints (and the "
        "configuration hashes) with golden/<family>.json: exit 0 when all match, 1 on any "
        "difference, 2 when none are recorded for this Triton or a golden file is unusable. "
        "Recording them is the checkout's python -m ci.golden_dev fingerprints --update. "
        "CI's compile-key check, which compiles only the entries whose key changed, is the "
        "checkout's python -m ci.golden_dev keycheck (the package computes no keys).",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=list(FAMILIES),
        help="family (repeatable; default: all)",
    )
    p.add_argument("--full", action="store_true", help=argparse.SUPPRESS)  # what it always does


def main(args: argparse.Namespace) -> int:
    return args.golden_func(args)
