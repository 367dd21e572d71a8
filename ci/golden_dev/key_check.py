"""``python -m ci.golden_dev keycheck``: the compile-key check CI runs after the test suite
(docs/golden.md, "Fingerprints guard the goldens"). Every guarded entry's compile key
(:mod:`ci.golden_dev.keys`) is computed without compiling and compared with the one
``golden/<family>.json`` records; only the entries whose key changed are compiled and checked
(``--no-compile``: only named), and the check says whether their machine code moved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ci.golden_dev.fingerprints import listed
from ci.golden_dev.keys import family_keys, in_compiler_process
from portattn.families import FAMILIES
from portattn.tools.compile_inputs import guarded_entries
from portattn.tools.compile_launches import GUARDED_STAGES
from portattn.tools.compilecheck import results_json, run_entries
from portattn.tools.golden.fingerprints import (
    UPDATE_HINT,
    ConfigHashFn,
    config_differences,
    stale_note,
)
from portattn.tools.golden.layout import GoldenError, golden_path, load
from portattn.tools.golden.verify import Printer, family_config_hash, say, toolchain_key

# (family, {label: stages}) -> entry label -> stage -> compile record, of those kernels only
CompileFn = Callable[[str, dict[str, list[str]]], dict[str, dict[str, dict[str, Any]]]]
# family -> entry label -> stage -> compile key (nothing compiled)
KeyFn = Callable[[str], dict[str, dict[str, str]]]


def compile_entries(family: str, labels: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Compile and check the guarded entries of ``family`` that ``labels`` names, each whole (its
    stages in order in one process, as when golden/ was recorded: Triton 3.9's AMD backend
    keeps state from one compile to the next): label -> stage -> record. Under Triton's
    interpreter in a child process without it."""
    if family not in FAMILIES or not labels:
        return {}
    return in_compiler_process(_compile_entries, family, labels)


def _compile_entries(family: str, labels: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    entries = [e for e in guarded_entries(family) if e.label in labels]
    jobs = min(os.cpu_count() or 1, len(entries))
    return results_json(run_entries(entries, jobs, stages=GUARDED_STAGES)).get(family, {})


def compile_changed(family: str, stages_of: dict[str, list[str]]) -> dict:
    """Compile and check the entries ``stages_of`` names (entry label -> stages; each entry
    compiles whole, as when golden/ was recorded): label -> stage -> record, of those stages."""
    records = compile_entries(family, list(stages_of))
    return {
        label: {s: r for s, r in records.get(label, {}).items() if s in stages}
        for label, stages in stages_of.items()
    }


def run_key_check(
    families: list[str],
    golden_dir: str | os.PathLike,
    out: Printer = say,
    toolchain: str | None = None,
    key_fn: KeyFn = family_keys,
    compile_fn: CompileFn | None = compile_changed,
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
