"""``python -m ci.golden_dev refresh``: run the canonical cases on a GPU of the family and
merge their hashes into ``golden/<family>.json`` (docs/golden.md, "Refresh").

Exit codes: 0 written; 1 refused conflict or a case that is not run-to-run deterministic; 2 a
device outside the family or a golden file that cannot be used (one line naming it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ci.golden_dev.merging import build_record, provenance
from ci.golden_dev.write import check_writable, write_record
from portattn.tools.golden import verify as golden_verify
from portattn.tools.golden.cases import CASES, CASES_VERSION, Case
from portattn.tools.golden.layout import GoldenError, golden_path, load
from portattn.tools.golden.records import output_differences
from portattn.tools.golden.run import CaseResult, compute_case
from portattn.tools.golden.verify import (
    Printer,
    device_config_hash,
    device_name,
    say,
    toolchain_key,
)

FingerprintFn = Callable[[str], dict[str, dict[str, str | None]]]


def compile_fingerprints(family: str) -> dict[str, dict[str, str | None]]:
    """Compile fingerprints of every guarded entry of ``family`` (none outside the table)."""
    from portattn.tools.golden.fingerprints import compile_records

    return {
        label: {stage: record["fingerprint"] for stage, record in stages.items()}
        for label, stages in compile_records(family).items()
    }


def cases_by_name(names: list[str] | None = None) -> list[Case]:
    """The canonical cases, or those named (ValueError for an unknown name)."""
    if not names:
        return list(CASES)
    index = {c.name: c for c in CASES}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; known: {', '.join(index)}")
    return [index[n] for n in names]


def _digest_line(result: CaseResult) -> str:
    return " ".join(f"{name} {rec['sha256'][:8]}" for name, rec in result.tensors.items())


def device_problem(family: str, device: torch.device) -> str | None:
    """Why hashes of ``family`` cannot be recorded from ``device``: for a family of the table
    the device must be one of its GPUs (another device runs another configuration, and its
    hashes would replace the family's as "stale"). A family outside the table (the tests'
    made-up one) has no hardware to match."""
    from portattn.families import FAMILIES
    from portattn.families import family as family_of

    if family not in FAMILIES:
        return None
    found = family_of(device) if device.type == "cuda" else None
    if found == family or golden_verify.emulated_family(device) == family:
        return None
    return (
        f"{device} ({device_name(device)}, family {found or 'none'}) is not a {family} GPU: "
        f"{family} hashes are recorded on {family} hardware only; nothing computed or written"
    )


def provisional_mark(family: str, device: torch.device) -> str:
    """The provenance note of hashes recorded under the family override."""
    return (
        f"{family} code (its PTX, JIT-compiled by the NVIDIA driver) run on "
        f"{device_name(device)} under $PORTATTN_FAMILY_OVERRIDE; not yet seen on {family} "
        "hardware, where golden verify confirms or refutes them"
    )


def _check_target(path: Path, family: str) -> None:
    """Before any work: the golden file can be written, and what it holds now (if anything)
    is a well-formed golden file of ``family`` (GoldenError otherwise)."""
    check_writable(path)
    load(path, family)


def run_refresh(
    family: str,
    device: torch.device | str,
    golden_dir: str | os.PathLike,
    force: bool = False,
    case_names: list[str] | None = None,
    out: Printer = say,
    toolchain: str | None = None,
    fingerprint_fn: FingerprintFn | None = compile_fingerprints,
    repeat: int = 2,
    config_hash_of: Callable[[str], str] | None = None,
    cases: list[Case] | None = None,
) -> int:
    """Run the canonical cases (or those named in ``case_names``, or ``cases`` given outright)
    ``repeat`` times on ``device``, then merge their hashes into ``golden/<family>.json`` under
    the file lock. Refuses (exit 2, before computing anything) a device outside ``family``
    (:func:`device_problem`; ``force`` does not override it) and a golden file that is
    malformed or not writable."""
    device = torch.device(device)
    toolchain = toolchain or toolchain_key()
    try:
        path = golden_path(golden_dir, family)  # before anything: a name, not a path
    except GoldenError as exc:
        out(f"error: {exc}")
        return 2
    problem = device_problem(family, device)
    if problem:
        out(f"error: {problem}")
        return 2
    if cases is None:
        try:
            cases = cases_by_name(case_names)
        except ValueError as exc:
            out(f"error: {exc}")
            return 2
    try:
        _check_target(path, family)
    except GoldenError as exc:
        out(f"error: {exc}")
        return 2
    provisional = golden_verify.emulated_family(device) == family
    if provisional and _held_hashes(path, toolchain) == "recorded":
        out(
            f"error: {path} holds {toolchain} hashes recorded on {family} hardware; hashes made "
            "under $PORTATTN_FAMILY_OVERRIDE never replace them; nothing computed or written"
        )
        return 2
    out(f"refreshing {path} [{toolchain}]: {len(cases)} case(s) x {repeat} run(s) on {device}")
    if provisional:
        out(f"  provisional: {provisional_mark(family, device)}")
    results = []
    for i, case in enumerate(cases, 1):
        result = compute_case(case, device)
        for _ in range(repeat - 1):
            again = compute_case(case, device)
            diffs = output_differences(case.name, result.output_record(), again.output_record())
            if diffs:
                out(
                    f"error: {case.name} is not run-to-run deterministic on this machine; "
                    f"nothing written: {diffs[0]}"
                )
                return 1
        results.append(result)
        out(
            f"[{i:2d}/{len(cases)}] {case.name:44s} {_digest_line(result)}  "
            f"({result.seconds:.1f} s)"
        )
    fingerprints = None
    if fingerprint_fn is not None:
        out(f"compile fingerprints of {family} (Triton compiles every entry) ...")
        start = time.perf_counter()
        try:
            fingerprints = fingerprint_fn(family)
        except Exception as exc:  # noqa: BLE001 - recorded without fingerprints, loudly
            out(
                f"warning: compile fingerprints failed ({type(exc).__name__}: {exc}); "
                "outputs are recorded without them"
            )
        else:
            out(f"  {len(fingerprints)} entries ({time.perf_counter() - start:.0f} s)")
    config_hash = config_hash_of or device_config_hash(device)
    config_hashes = {c.entry: config_hash(c.entry) for c in cases}
    origin = provenance(device)
    if provisional:
        origin["provisional"] = provisional_mark(family, device)
    record = build_record(
        family, toolchain, results, origin, fingerprints, config_hashes, CASES_VERSION
    )
    return write_record(path, record, force, out, toolchain)


def _held_hashes(path: Path, toolchain: str) -> str | None:
    """``"provisional"`` or ``"recorded"`` for the output hashes ``path`` holds for
    ``toolchain``; None when it holds none."""
    section = ((load(path) or {}).get("toolchains") or {}).get(toolchain) or {}
    if not section.get("outputs"):
        return None
    return "provisional" if (section.get("provenance") or {}).get("provisional") else "recorded"
