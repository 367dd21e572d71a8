"""Building a golden record from a run and folding it into a golden document: what it adds,
what it replaces (outputs recorded with another configuration or machine code, or anything
with ``force``), what conflicts; and where a record came from (its provenance)."""

from __future__ import annotations

import copy
import datetime
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from portattn.tools.golden.cases import Case
from portattn.tools.golden.layout import SCHEMA, GoldenError
from portattn.tools.golden.records import fingerprint_digest, output_differences
from portattn.tools.golden.run import make_inputs
from portattn.tools.golden.verify import REPO_ROOT, device_name


class GoldenConflict(Exception):
    """A merge would replace differing hashes (or case definitions) and ``force`` is off."""

    def __init__(self, conflicts: list[str]) -> None:
        super().__init__(
            f"{len(conflicts)} conflicting entr{'y' if len(conflicts) == 1 else 'ies'}"
        )
        self.conflicts = conflicts


def empty_doc(family: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "family": family,
        "cases_version": 0,
        "cases": {},
        "config_hashes": {},
        "toolchains": {},
    }


def case_definition(case: Case) -> dict:
    """A case's stored definition: its fields and the SHA-256 of its generated inputs."""
    return case.to_json() | {"inputs_sha256": _inputs_sha256(case)}


@functools.cache
def _inputs_sha256(case: Case) -> str:
    return make_inputs(case).sha256()


def build_record(
    family: str,
    toolchain: str,
    results: list,
    provenance: dict[str, Any] | None,
    fingerprints: dict[str, dict[str, str | None]] | None,
    config_hashes: dict[str, str],
    cases_version: int,
) -> dict[str, Any]:
    """A golden document holding just ``results`` (``CaseResult`` objects) and the run's
    metadata; :func:`merge` folds it into the file. ``config_hashes``: entry -> hash of the
    configuration the results ran with; ``fingerprints``: entry -> kernel -> fingerprint."""
    doc = empty_doc(family)
    doc["cases_version"] = cases_version
    section: dict[str, Any] = {
        "config_hashes": {},
        "fingerprints": copy.deepcopy(fingerprints or {}),
        "outputs": {},
    }
    if provenance:
        section["provenance"] = provenance
    for r in results:
        entry = r.case.entry
        doc["cases"][r.case.name] = r.case.to_json() | {"inputs_sha256": r.inputs_sha256}
        section["config_hashes"][entry] = config_hashes[entry]
        section["outputs"][r.case.name] = {
            "entry": entry,
            "config_hash": config_hashes[entry],
            "fingerprint": fingerprint_digest((fingerprints or {}).get(entry)),
            "inputs_sha256": r.inputs_sha256,
            "tensors": copy.deepcopy(r.tensors),
        }
    doc["toolchains"][toolchain] = section
    return doc


def recorded_with_other_kernel(old: dict, new: dict) -> bool:
    """True when ``old`` was recorded with another configuration or machine code than ``new``
    (so differing hashes are expected: ``old`` is stale)."""
    if old.get("config_hash") != new.get("config_hash"):
        return True
    a, b = old.get("fingerprint"), new.get("fingerprint")
    return a is not None and b is not None and a != b


def _merge_provenance(old: dict | None, new: dict) -> dict:
    if not old:
        return dict(new, first_recorded=new.get("first_recorded") or new.get("date"))
    merged = dict(old)
    for key in ("devices", "drivers", "torch"):
        merged[key] = sorted(set(old.get(key, [])) | set(new.get(key, [])))
    for key in ("portattn", "commit", "date"):
        if key in new:
            merged[key] = new[key]
    merged.pop("provisional", None)  # provisional only while every recording was
    if "provisional" in new and old.get("provisional"):
        merged["provisional"] = new["provisional"]
    merged["first_recorded"] = old.get("first_recorded") or old.get("date")
    return merged


def merge(
    existing: dict[str, Any] | None, new: dict[str, Any], force: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Fold the record ``new`` into the document ``existing`` (None: no file yet).

    Never drops a case or a toolchain. A differing case definition, or differing output hashes
    of a case, is a conflict unless the stored output was recorded with another configuration
    or machine code (stale, replaced) or ``force`` is set. Returns ``(document, changes)``;
    raises :class:`GoldenConflict` listing every conflict when not forced.
    """
    doc = copy.deepcopy(existing) if existing else empty_doc(new["family"])
    if doc.get("family") != new["family"]:
        raise GoldenError(f"golden file is for family {doc.get('family')!r}, not {new['family']!r}")
    for key, value in empty_doc(new["family"]).items():
        doc.setdefault(key, value)
    doc["schema"] = SCHEMA
    changes: list[str] = []
    conflicts: list[str] = []
    doc["cases_version"] = max(doc.get("cases_version", 0), new.get("cases_version", 0))

    for name, definition in sorted(new["cases"].items()):
        old = doc["cases"].get(name)
        if old is None:
            changes.append(f"case {name}: added")
        elif old != definition:
            keys = sorted(k for k in set(old) | set(definition) if old.get(k) != definition.get(k))
            line = f"case {name}: definition differs ({', '.join(keys)})"
            if not force:
                conflicts.append(line)
                continue
            changes.append(line + ": replaced (--force)")
        doc["cases"][name] = definition
    doc["config_hashes"].update(new.get("config_hashes", {}))

    for toolchain, section in sorted(new["toolchains"].items()):
        target = doc["toolchains"].setdefault(toolchain, {})
        fresh = not target
        target.setdefault("fingerprints", {})
        target.setdefault("outputs", {})
        if section.get("config_hashes"):
            if "config_hashes" not in target:  # an older section used the top-level map
                target["config_hashes"] = {} if fresh else dict(doc["config_hashes"])
            target["config_hashes"].update(section["config_hashes"])
        added, updated, keyed = [], [], []
        for entry, stages in sorted(section.get("fingerprints", {}).items()):
            if target["fingerprints"].get(entry) != stages:
                (updated if entry in target["fingerprints"] else added).append(entry)
                target["fingerprints"][entry] = stages
        # Compile keys (ci.golden_dev.keys) attest the fingerprints they were recorded with: a
        # record's keys replace the stored ones, and an entry whose fingerprints change
        # without a key loses its stored one (the key check then compiles it again).
        new_keys = section.get("keys", {})
        if new_keys or updated:
            target.setdefault("keys", {})
        for entry in updated:
            if entry not in new_keys:
                target["keys"].pop(entry, None)
        for entry, stages in sorted(new_keys.items()):
            if target["keys"].get(entry) != stages:
                target["keys"][entry] = stages
                keyed.append(entry)
        if keyed:
            changes.append(f"[{toolchain}] compile keys recorded for {len(keyed)} entries")
        if "keys" in section:  # a full compile (fingerprints --update): what it lacks is gone
            dropped = sorted(set(target["fingerprints"]) - set(section.get("fingerprints", {})))
            for entry in dropped:
                del target["fingerprints"][entry]
                target.get("keys", {}).pop(entry, None)
            if dropped:
                changes.append(
                    f"[{toolchain}] fingerprints removed for {len(dropped)} entries no longer "
                    f"compiled: {', '.join(dropped)}"
                )
        if added:
            changes.append(f"[{toolchain}] fingerprints added for {len(added)} entries")
        if updated:
            changes.append(f"[{toolchain}] fingerprints changed: {', '.join(updated)}")
        if section.get("provenance"):
            target["provenance"] = _merge_provenance(
                target.get("provenance"), section["provenance"]
            )
        for name, record in sorted(section.get("outputs", {}).items()):
            old = target["outputs"].get(name)
            if old is None:
                changes.append(f"[{toolchain}] outputs of {name}: added")
            else:
                diffs = output_differences(name, old, record)
                if diffs and recorded_with_other_kernel(old, record):
                    changes.append(
                        f"[{toolchain}] outputs of {name}: replaced (stale: recorded "
                        "with another configuration / machine code)"
                    )
                elif diffs and not force:
                    conflicts.extend(f"[{toolchain}] {d}" for d in diffs)
                    continue
                elif diffs:
                    changes.append(
                        f"[{toolchain}] outputs of {name}: replaced (--force): "
                        + "; ".join(diffs[:3])
                    )
                elif recorded_with_other_kernel(old, record):
                    changes.append(
                        f"[{toolchain}] outputs of {name}: same bits, now recorded "
                        "with the current configuration / machine code (no longer stale)"
                    )
            target["outputs"][name] = record
        if fresh:
            changes.insert(0, f"[{toolchain}] new toolchain section")
    if conflicts:
        raise GoldenConflict(conflicts)
    return doc, changes


# ----------------------------------------------------------------------------- provenance


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout portattn runs from (``+dirty`` with local
    changes), or None outside a git checkout."""
    commit = _run(["git", "rev-parse", "HEAD"], REPO_ROOT)
    if not commit:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    return commit + ("+dirty" if status else "")


def drivers(device: torch.device) -> list[str]:
    """CUDA runtime and NVIDIA driver, or the ROCm version (what is known here)."""
    if device.type != "cuda":
        return []
    found = []
    if torch.version.hip is not None:
        found.append(f"rocm {torch.version.hip}")
        return found
    if torch.version.cuda:
        found.append(f"cuda {torch.version.cuda}")
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        found.append(f"nvidia driver {smi.splitlines()[0].strip()}")
    return found


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def provenance(device: torch.device) -> dict[str, Any]:
    """The provenance block of a refresh on ``device``."""
    import portattn

    record: dict[str, Any] = {
        "devices": [device_name(device)],
        "drivers": drivers(device),
        "torch": [torch.__version__],
        "portattn": portattn.__version__,
        "date": today(),
    }
    commit = git_commit()
    if commit:
        record["commit"] = commit
    return record
