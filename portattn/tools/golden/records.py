"""The records of a golden document: the differences of two output records (by sequence and
head), and the recorded outputs that are stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any


def fingerprint_digest(stages: dict[str, str | None] | None) -> str | None:
    """One digest of an entry's per-kernel fingerprints (None when any is unknown)."""
    if not stages or any(v is None for v in stages.values()):
        return None
    blob = json.dumps(stages, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- differences


def tensor_differences(case: str, tensor: str, want: dict, got: dict) -> list[str]:
    """Where two tensor records differ, by sequence and head (empty when equal)."""
    if want["sha256"] == got["sha256"]:
        return []
    where = f"case {case}: {tensor}"
    if want.get("shape") != got.get("shape") or want.get("dtype") != got.get("dtype"):
        return [
            f"{where}: shape/dtype {want.get('shape')} {want.get('dtype')} -> "
            f"{got.get('shape')} {got.get('dtype')}"
        ]
    lines = []
    for seq, (a, b) in enumerate(zip(want["seqs"], got["seqs"])):
        heads = [h for h, (x, y) in enumerate(zip(a.split(), b.split())) if x != y]
        if heads:
            lines.append(
                f"{where}: sequence {seq}, head{'s' if len(heads) > 1 else ''} "
                f"{', '.join(map(str, heads))} differ"
            )
    if not lines:
        lines.append(f"{where}: sha256 differs but every per-sequence digest matches")
    return lines


def output_differences(case: str, want: dict, got: dict) -> list[str]:
    """Differences of two output records of one case: inputs first, then each tensor."""
    if want.get("inputs_sha256") != got.get("inputs_sha256"):
        return [
            f"case {case}: INPUTS changed (inputs_sha256 {want.get('inputs_sha256', '')[:16]}"
            f" -> {got.get('inputs_sha256', '')[:16]}): the input generator or the case "
            "definition differs, the outputs cannot be compared"
        ]
    lines = []
    for tensor in sorted(set(want["tensors"]) | set(got["tensors"])):
        if tensor not in want["tensors"] or tensor not in got["tensors"]:
            lines.append(f"case {case}: {tensor} missing on one side")
            continue
        lines.extend(
            tensor_differences(case, tensor, want["tensors"][tensor], got["tensors"][tensor])
        )
    return lines


# ----------------------------------------------------------------------------- staleness


def config_hashes_of(doc: dict[str, Any], toolchain: str) -> dict[str, str | None]:
    """entry -> configuration hash recorded for ``toolchain``: its section's own map, else (a
    section recorded before sections had one) the document's top-level map."""
    section = doc.get("toolchains", {}).get(toolchain, {})
    if "config_hashes" in section:
        return section["config_hashes"]
    return doc.get("config_hashes", {})


def stale_outputs(
    doc: dict[str, Any], toolchain: str, config_hash_of: Callable[[str], str | None]
) -> dict[str, str]:
    """Outputs of ``toolchain`` that no longer describe the code: case -> reason. A case is
    stale when its entry's configuration hash (``config_hash_of(entry)``, from the code) or
    the entry's stored fingerprints differ from what it was recorded with."""
    section = doc.get("toolchains", {}).get(toolchain, {})
    fingerprints = section.get("fingerprints", {})
    stale = {}
    for name, record in section.get("outputs", {}).items():
        entry = record["entry"]
        current = config_hash_of(entry)
        if current is not None and current != record.get("config_hash"):
            stale[name] = f"configuration of {entry} changed"
            continue
        digest = fingerprint_digest(fingerprints.get(entry))
        if digest and record.get("fingerprint") and digest != record["fingerprint"]:
            stale[name] = f"machine code of {entry} changed (fingerprints)"
    return stale
