"""``python -m ci.golden_dev {refresh,fingerprints,keycheck}``, from the root of a checkout."""

from __future__ import annotations

import argparse

from ci.golden_dev.fingerprints import results_fingerprints, update_fingerprints
from ci.golden_dev.key_check import compile_changed, run_key_check
from ci.golden_dev.refresh import compile_fingerprints, run_refresh
from portattn.families import FAMILIES
from portattn.tools.golden.cli import Hardware, usable_hardware
from portattn.tools.golden.fingerprints import run_fingerprints
from portattn.tools.golden.layout import GoldenError
from portattn.tools.golden.verify import default_golden_dir, say


def cmd_refresh(args: argparse.Namespace, hw: Hardware | None = None) -> int:
    """``refresh``; ``hw`` replaces the detected hardware (tests inject it)."""
    hw = usable_hardware("refresh", args, hw)
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
    """``fingerprints --update`` or ``--results PATH`` (CPU: Triton's compiler, no GPU)."""
    families = args.family or list(FAMILIES)
    if args.update:
        return update_fingerprints(families, args.golden_dir or default_golden_dir(write=True))
    try:
        made = results_fingerprints(args.results)
    except GoldenError as exc:
        say(f"error: {exc}")
        return 2
    return run_fingerprints(families, args.golden_dir or default_golden_dir(), fingerprint_fn=made)


def cmd_keycheck(args: argparse.Namespace) -> int:
    """``keycheck [--no-compile]``: CI's compile-key check (CPU: Triton's compiler, no GPU)."""
    compile_fn = None if args.no_compile else compile_changed
    families = args.family or list(FAMILIES)
    return run_key_check(families, args.golden_dir or default_golden_dir(), compile_fn=compile_fn)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ci.golden_dev",
        description="Record portattn's golden files, and check their compile keys.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    golden_dir = argparse.ArgumentParser(add_help=False)
    golden_dir.add_argument(
        "--golden-dir",
        help="directory of <family>.json (default: $PORTATTN_GOLDEN_DIR, else the checkout's "
        "golden/)",
    )
    p = sub.add_parser(
        "refresh",
        parents=[golden_dir],
        help="record the canonical cases' hashes on this GPU into golden/",
        description="Runs every canonical case on this GPU and merges the hashes "
        "into golden/<family>.json under a file lock (temp file + os.replace). "
        "Never drops other toolchains or cases; refuses to change a stored hash "
        "without --force (exit 1, listing the differences).",
    )
    p.set_defaults(func=cmd_refresh)
    p.add_argument(
        "--family",
        choices=list(FAMILIES),
        help="the family expected here; exit 2 when the GPU is of another one",
    )
    p.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
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
    p = sub.add_parser(
        "fingerprints",
        parents=[golden_dir],
        help="record (--update) or compare (--results) the compile fingerprints (CPU)",
        description="--update compiles every guarded entry and records fingerprints and keys; "
        "output hashes recorded with other machine code become stale until re-recorded on "
        "hardware. --results PATH compares the fingerprints of `python -m portattn compile "
        "--guarded --json PATH` (same Triton) instead of compiling.",
    )
    p.set_defaults(func=cmd_fingerprints)
    p.add_argument("--family", action="append", choices=list(FAMILIES), help="(repeatable)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--update", action="store_true", help="compile, store fingerprints, keys")
    what.add_argument("--results", metavar="PATH", help="compare a compile's results")
    p = sub.add_parser(
        "keycheck",
        parents=[golden_dir],
        help="the compile-key check CI runs: compile only the entries whose key changed (CPU)",
        description="Computes every guarded entry's compile key (a hash of everything its "
        "machine code is a function of) without compiling, compiles and checks only the "
        "entries whose key differs from golden/<family>.json, and says whether their machine "
        "code changed. Exit 0: every key matches; 1: a key, a recorded entry or a "
        "configuration hash differs; 2: no fingerprints or keys for this Triton, or an "
        "unusable golden file.",
    )
    p.set_defaults(func=cmd_keycheck)
    p.add_argument("--family", action="append", choices=list(FAMILIES), help="(repeatable)")
    p.add_argument(
        "--no-compile", action="store_true", help="name the entries whose key changed, compile none"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
