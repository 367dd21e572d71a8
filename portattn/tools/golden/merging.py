"""Folding a run's record into a golden document: what it adds, what it replaces (outputs
recorded with another configuration or machine code, or anything with ``force``), and what
conflicts.
"""

from __future__ import annotations

import copy
from typing import Any

from portattn.tools.golden.layout import SCHEMA, GoldenConflict, GoldenError, empty_doc
from portattn.tools.golden.records import output_differences, recorded_with_other_kernel


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
        # Compile keys (compile_keys) attest the fingerprints they were recorded with: a
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
