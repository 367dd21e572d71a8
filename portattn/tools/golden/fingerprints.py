"""``python -m portattn golden fingerprints``: the machine code of every guarded entry against
``golden/<family>.json`` (CPU only: Triton's compiler, no GPU; docs/golden.md, "Fingerprints
guard the goldens"). :func:`run_key_check` is the default (CI's): it compiles only the entries
whose compile key (``portattn.tools.compile_keys``) changed; :func:`run_fingerprints`
(``--full``) compiles every entry and compares the fingerprints. Recording them
(``--update``) is the checkout's ``python -m ci.golden_dev fingerprints --update``.
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
# "fingerprint", "key", "ok", "failures": compilecheck.KernelResult.record)
RecordsFn = Callable[[str], dict[str, dict[str, Any]]]
# (family, {label: stages}) -> entry label -> stage -> compile record, of those kernels only
CompileFn = Callable[[str, dict[str, list[str]]], dict[str, dict[str, dict[str, Any]]]]
# family -> entry label -> stage -> compile key (nothing compiled)
KeyFn = Callable[[str], dict[str, dict[str, str]]]
ConfigHashFn = Callable[[str], Callable[[str], str | None]]

UPDATE_HINT = "python -m ci.golden_dev fingerprints --update"


def compile_records(family: str, stages_of: dict[str, list[str]] | None = None) -> dict:
    """Compile and check the guarded entries of ``family`` (or only the kernels ``stages_of``
    names: entry label -> stages): label -> stage -> record. Empty for a family the table does
    not have."""
    from portattn.families import FAMILIES

    if family not in FAMILIES:
        return {}
    from portattn.tools.compilecheck import compile_records as compile_family

    return compile_family(family, stages_of=stages_of)


def compile_keys(family: str) -> dict[str, dict[str, str]]:
    """The compile keys of every guarded entry of ``family`` (nothing compiled)."""
    from portattn.families import FAMILIES

    if family not in FAMILIES:
        return {}
    from portattn.tools.compile_keys import family_keys

    return family_keys(family)


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


def listed(items: list[str], most: int = 8) -> str:
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")


# ----------------------------------------------------------------------------- key check


def run_key_check(
    families: list[str],
    golden_dir: str | os.PathLike,
    out: Printer = say,
    toolchain: str | None = None,
    key_fn: KeyFn = compile_keys,
    compile_fn: CompileFn | None = compile_records,
    config_hash_fn: ConfigHashFn = family_config_hash,
) -> int:
    """The CI check: compute every guarded entry's compile key, compile and check only the
    entries whose key differs from ``golden/<family>.json``'s, and say whether their machine
    code changed (``compile_fn`` None: only name them). 0: every key matches; 1: a key changed
    (or a recorded entry is gone, or a configuration hash differs); 2: no fingerprints or keys
    recorded for this Triton, or an unusable golden file."""
    toolchain = toolchain or toolchain_key()
    worst, keyed, compiled_entries, compile_seconds = 0, 0, 0, 0.0
    began = time.perf_counter()
    for family in families:
        try:
            path = golden_path(golden_dir, family)
            doc = load(path, family) or {}
        except GoldenError as exc:
            out(f"{family}: error: {exc}")
            worst = max(worst, 2)
            continue
        section = doc.get("toolchains", {}).get(toolchain, {})
        stored_fps, stored_keys = section.get("fingerprints"), section.get("keys")
        if not stored_fps or not stored_keys:
            what = "fingerprints" if not stored_fps else "compile keys"
            out(f"{family}: no {what} for {toolchain} in {path}; run {UPDATE_HINT}")
            worst = max(worst, 2)
            continue
        keyed += 1
        start = time.perf_counter()
        current = key_fn(family)
        _, config_diffs = config_differences(doc, family, toolchain, config_hash_fn)
        # entry label -> the stages whose key differs from the recorded one
        changed = {
            label: [s for s in sorted(keys) if stored_keys.get(label, {}).get(s) != keys[s]]
            for label, keys in sorted(current.items())
            if stored_keys.get(label) != keys
        }
        gone = sorted(set(stored_fps) - set(current))
        if not (changed or gone or config_diffs):
            note = stale_note(doc, family, toolchain, config_hash_fn)
            took = f"{time.perf_counter() - start:.0f} s"
            out(f"{family}: {len(current)} entries, compile keys match {path} ({took}){note}")
            continue
        worst = max(worst, 1)
        head = f"{family}: the compile inputs of {len(changed)} of {len(current)} entries differ "
        if compile_fn is None:
            out(head + f"from {path} (not compiled): {listed(_kernels(changed))}")
        else:
            compiling = time.perf_counter()
            compiled = compile_fn(family, changed) if changed else {}
            compile_seconds += time.perf_counter() - compiling
            compiled_entries += len(changed)
            took = f"{time.perf_counter() - start:.0f} s"
            kernels = len(_kernels(changed))
            out(head + f"from {path} ({kernels} kernels); compiled those entries ({took}):")
            _report_changed(out, family, changed, compiled, stored_fps)
        if gone:
            out(f"  recorded, no longer guarded: {listed(gone)}")
        if config_diffs:
            out(f"  configuration hash differs from the recorded one: {listed(config_diffs)}")
        out(f"  if the change is intended run {UPDATE_HINT} (docs/golden.md)")
    if keyed:  # CI's phase table reads the compile time from this line
        total = time.perf_counter() - began
        out(
            f"key check of {keyed} families under {toolchain}: {total:.0f} s, of which "
            f"{compile_seconds:.0f} s compiling {compiled_entries} entries whose keys changed"
        )
    return worst


def _kernels(changed: dict[str, list[str]]) -> list[str]:
    return [f"{label}/{stage}" for label, stages in changed.items() for stage in stages]


def _report_changed(
    out: Printer, family: str, changed: dict[str, list[str]], compiled: dict, stored_fps: dict
) -> None:
    """Per changed kernel: did it fail a check, did its machine code move."""
    failed, differ, same = [], [], []
    for label, stages in changed.items():
        for stage in stages:
            record = compiled.get(label, {}).get(stage) or {"ok": False, "failures": ["missing"]}
            if not record.get("ok", True):
                failed.append(f"{label}/{stage}: {'; '.join(record.get('failures', []))}")
            moved = stored_fps.get(label, {}).get(stage) != record.get("fingerprint")
            (differ if moved else same).append(f"{label}/{stage}")
    for line in failed:
        out(f"  check failed: {line}")
    if differ:
        out(
            f"  machine code differs ({len(differ)} kernels): {listed(differ)}; the output "
            f"hashes recorded with it become stale: re-record them on {family} hardware"
        )
    if same:
        out(f"  machine code unchanged, recorded keys stale ({len(same)} kernels): {listed(same)}")


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
