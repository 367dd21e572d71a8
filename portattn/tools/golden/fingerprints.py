"""``python -m portattn golden fingerprints``: the machine code of every guarded entry against
``golden/<family>.json`` (CPU only: Triton's compiler, no GPU; docs/golden.md, "Fingerprints
guard the goldens"): :func:`run_fingerprints` compiles every entry and compares the
fingerprints. Recording them, and CI's compile-key check (which compiles only the entries whose
key changed), are the checkout's ``python -m ci.golden_dev fingerprints --update`` and
``python -m ci.golden_dev keycheck``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from portattn.tools.golden.cases import CASES, Case
from portattn.tools.golden.layout import GoldenError, golden_path, load
from portattn.tools.golden.records import config_hashes_of, stale_outputs
from portattn.tools.golden.verify import Printer, family_config_hash, say, toolchain_key

# family -> entry label -> stage -> a fingerprint (str / None), or a compile record (a dict with
# "fingerprint", "ok", "failures": compilecheck.KernelResult.record)
RecordsFn = Callable[[str], dict[str, dict[str, Any]]]
ConfigHashFn = Callable[[str], Callable[[str], str | None]]

UPDATE_HINT = "python -m ci.golden_dev fingerprints --update"


def compile_records(family: str) -> dict:
    """Compile and check every guarded entry of ``family``: label -> stage -> record. Empty for
    a family the table does not have."""
    from portattn.families import FAMILIES

    if family not in FAMILIES:
        return {}
    from portattn.tools.compilecheck import compile_records as compile_family

    return compile_family(family)


def fingerprints_of(made: dict[str, dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """label -> stage -> fingerprint of ``made`` (fingerprints, or compile records)."""
    return {
        label: {s: r.get("fingerprint") if isinstance(r, dict) else r for s, r in stages.items()}
        for label, stages in made.items()
    }


def config_differences(
    doc: dict | None, family: str, toolchain: str, config_hash_fn: ConfigHashFn
) -> tuple[dict[str, str], list[str]]:
    """(configuration hashes of the entries the cases use, the entries whose hash differs from
    the recorded one)."""
    config_hash = config_hash_fn(family)
    recorded = (doc or {}).get("cases", {})
    entries = sorted(
        {c.entry for c in CASES} | {Case.from_json(n, c).entry for n, c in recorded.items()}
    )
    hashes = {e: h for e in entries if (h := config_hash(e)) is not None}
    recorded_hashes = config_hashes_of(doc or {}, toolchain)
    diffs = [e for e, h in hashes.items() if recorded_hashes.get(e) not in (None, h)]
    return hashes, diffs


def stale_note(doc: dict, family: str, toolchain: str, config_hash_fn: ConfigHashFn) -> str:
    stale = stale_outputs(doc, toolchain, config_hash_fn(family))
    return f"; stale outputs: re-record on {family} hardware" if stale else ""


# ----------------------------------------------------------------------------- full compile


def run_fingerprints(
    families: list[str],
    golden_dir: str | os.PathLike,
    out: Printer = say,
    toolchain: str | None = None,
    fingerprint_fn: RecordsFn = compile_records,
    config_hash_fn: ConfigHashFn = family_config_hash,
) -> int:
    """Compare the compile fingerprints and configuration hashes of each family with
    ``golden/<family>.json``. ``fingerprint_fn(family)`` compiles every guarded entry (or
    reads a compile's results). CPU only, no GPU needed."""
    toolchain = toolchain or toolchain_key()
    worst = 0
    for family in families:
        try:
            path = golden_path(golden_dir, family)
            doc = load(path, family)
        except GoldenError as exc:
            out(f"{family}: error: {exc}")
            worst = max(worst, 2)
            continue
        _, config_diffs = config_differences(doc, family, toolchain, config_hash_fn)
        start = time.perf_counter()
        current = fingerprints_of(fingerprint_fn(family))
        took = f"{time.perf_counter() - start:.0f} s"
        stored = (doc or {}).get("toolchains", {}).get(toolchain, {}).get("fingerprints")
        if not stored:
            out(f"{family}: no fingerprints for {toolchain} in {path} ({took}); run {UPDATE_HINT}")
            worst = max(worst, 2)
            continue
        diffs = [
            f"{e}/{s}"
            for e in sorted(set(stored) | set(current))
            for s in sorted(set(stored.get(e, {})) | set(current.get(e, {})))
            if stored.get(e, {}).get(s) != current.get(e, {}).get(s)
        ]
        diffs += [f"configuration of {e}" for e in config_diffs]
        if diffs:
            out(
                f"{family}: {len(diffs)} fingerprint(s) differ from {path} ({took}): "
                f"{', '.join(diffs[:8])}{' ...' if len(diffs) > 8 else ''}; if the change is "
                f"intended run {UPDATE_HINT} and re-record the outputs on {family} hardware"
            )
            worst = max(worst, 1)
            continue
        note = stale_note(doc, family, toolchain, config_hash_fn)
        out(f"{family}: {len(current)} entries match {path} ({took}){note}")
    return worst
