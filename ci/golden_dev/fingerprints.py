"""``python -m ci.golden_dev fingerprints``: record golden/'s compile fingerprints and keys
(``--update``: compile every guarded entry), or compare the fingerprints of a compile's results
(``--results PATH``) as ``python -m portattn golden fingerprints`` compares its own compile
(docs/golden.md, "Fingerprints guard the goldens").
"""

from __future__ import annotations

import json
import os
from typing import Any

from ci.golden_dev.keys import keyed_records
from ci.golden_dev.merging import case_definition, empty_doc
from ci.golden_dev.write import check_writable, write_record
from portattn.tools.golden.cases import CASES, CASES_VERSION
from portattn.tools.golden.fingerprints import ConfigHashFn, RecordsFn, config_differences
from portattn.tools.golden.layout import GoldenError, golden_path, load
from portattn.tools.golden.records import stale_outputs
from portattn.tools.golden.verify import Printer, family_config_hash, say, toolchain_key


def listed(items: list[str], most: int = 8) -> str:
    """``items`` joined, at most ``most`` of them, with how many more."""
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")


def split_records(made: dict[str, dict[str, Any]]) -> tuple[dict, dict]:
    """(fingerprints, keys) of ``made``: label -> stage -> value. A kernel that failed a check
    has no key: an entry without a recorded key is compiled again by the key check."""
    fingerprints: dict[str, dict[str, str | None]] = {}
    keys: dict[str, dict[str, str]] = {}
    for label, stages in made.items():
        for stage, value in stages.items():
            record = value if isinstance(value, dict) else {"fingerprint": value}
            fingerprints.setdefault(label, {})[stage] = record.get("fingerprint")
            if record.get("key") and record.get("ok", True):
                keys.setdefault(label, {})[stage] = record["key"]
    # An entry is keyed whole or not at all: its stages compile together.
    keys = {label: k for label, k in keys.items() if set(k) == set(fingerprints[label])}
    return fingerprints, keys


def update_fingerprints(
    families: list[str],
    golden_dir: str | os.PathLike,
    out: Printer = say,
    toolchain: str | None = None,
    fingerprint_fn: RecordsFn = keyed_records,
    config_hash_fn: ConfigHashFn = family_config_hash,
) -> int:
    """Compile every guarded entry of each family with its compile keys (``fingerprint_fn``:
    records with a ``"key"``, :func:`ci.golden_dev.keys.keyed_records`) and store its
    fingerprints, the compile keys of what passed its checks, and the configuration hashes in
    ``golden/<family>.json``. Exit 1 when a kernel failed a check (its entry is not keyed)."""
    toolchain = toolchain or toolchain_key()
    worst = 0
    for family in families:
        try:
            path = golden_path(golden_dir, family)
            doc = load(path, family)
            check_writable(path)  # before the compile, which takes minutes
        except GoldenError as exc:
            out(f"{family}: error: {exc}")
            worst = max(worst, 2)
            continue
        hashes, _ = config_differences(doc, family, toolchain, config_hash_fn)
        made = fingerprint_fn(family)
        current, keys = split_records(made)
        failed = sorted(
            label
            for label, stages in made.items()
            if any(isinstance(r, dict) and not r.get("ok", True) for r in stages.values())
        )
        section = {"config_hashes": hashes, "fingerprints": current, "keys": keys}
        code = _update(path, family, toolchain, section, config_hash_fn(family), out)
        if failed:
            out(f"{family}: not keyed, a kernel failed a check: {listed(failed)}")
        worst = max(worst, code, 1 if failed else 0)
    return worst


def _update(path, family: str, toolchain: str, section: dict, config_hash, out: Printer) -> int:
    record = empty_doc(family)
    # The canonical case list and input hashes are the same on every machine.
    record["cases_version"] = CASES_VERSION
    record["cases"] = {c.name: case_definition(c) for c in CASES}
    record["toolchains"][toolchain] = section
    code = write_record(path, record, False, lambda line: out(f"{family}: {line.strip()}"))
    if code:
        return code
    stale = stale_outputs(load(path) or {}, toolchain, config_hash)
    if stale:
        out(
            f"{family}: stale: re-record on {family} hardware ({len(stale)} case(s) now "
            "hold output hashes of older code)"
        )
    return 0


def results_fingerprints(path: str | os.PathLike) -> RecordsFn:
    """Fingerprints read from a compile check's results (``python -m portattn compile --json
    PATH``: family -> entry -> kernel -> record) instead of compiling every entry again: the
    same compiles give the same fingerprints. A family or entry the results lack counts as
    missing, so it differs from what golden/ stores. A file that cannot be read or is not such
    results raises :class:`GoldenError` naming it, before anything is compared."""
    results = _read_results(path)

    def fingerprints(family: str) -> dict[str, dict[str, str | None]]:
        return {
            label: {stage: record["fingerprint"] for stage, record in stages.items()}
            for label, stages in results.get(family, {}).items()
        }

    return fingerprints


def _read_results(path: str | os.PathLike) -> dict:
    """A compile check's results (family -> entry -> kernel -> record with its
    ``fingerprint``), checked whole: GoldenError naming the file and where it departs."""
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except OSError as exc:
        raise GoldenError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise GoldenError(f"{path} is not valid JSON: {exc}") from None
    where = _results_problem(results)
    if where is not None:
        raise GoldenError(
            f"{path} is not a compile check's results (python -m portattn compile --json): {where}"
        )
    return results


def _results_problem(results) -> str | None:
    """Where ``results`` departs from family -> entry -> kernel -> {"fingerprint": str}."""
    if not isinstance(results, dict):
        return f"the top level is {'an array' if isinstance(results, list) else 'no object'}"
    for family, entries in results.items():
        if not isinstance(entries, dict):
            return f"{family} is not an object of entries"
        for label, stages in entries.items():
            if not isinstance(stages, dict):
                return f"{family} / {label} is not an object of kernels"
            for stage, record in stages.items():
                if not _has_fingerprint(record):
                    return f"{family} / {label} / {stage} has no fingerprint"
    return None


def _has_fingerprint(record) -> bool:
    """A kernel's record holds its fingerprint: a string, or null where it did not compile."""
    if not isinstance(record, dict) or "fingerprint" not in record:
        return False
    return record["fingerprint"] is None or isinstance(record["fingerprint"], str)
