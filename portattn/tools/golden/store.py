"""Golden files: layout, records, merging, and safe concurrent writes.

``golden/<family>.json`` (sorted keys, indent 1, one case per block)::

    {
     "schema": 1, "family": "sm90", "cases_version": 1,
     "cases": {name: {kernel, lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, causal,
                      seed, dlse, inputs_sha256, and where not off: page_size,
                      window_left, window_right, softcap, sinks}},
     "config_hashes": {"varlen/d128/bf16": "<16 hex>", ...},   # sections without their own
     "toolchains": {
      "triton-3.6.0": {
       "config_hashes": {"varlen/d128/bf16": "<16 hex>", ...},  # entries the cases use
       "fingerprints": {"varlen/d128/bf16": {"fwd": sha256, "bwd_pre": ..., ...}, ...},
       "provenance": {devices, drivers, torch, portattn, commit, date, first_recorded},
       "outputs": {name: {entry, config_hash, fingerprint, inputs_sha256,
                          tensors: {out|lse|dq|dk|dv|dsinks: {sha256, shape, dtype,
                                                               seqs}}}}
      }
     }
    }

Output hashes live under the toolchain (Triton version) that produced them: a new Triton adds a
section, it never replaces one. ``fingerprint`` of an output is the digest of its entry's
compile fingerprints when it was recorded; when the stored fingerprints (or the configuration)
of that entry change later, the output is *stale* until re-recorded on hardware.

Configuration hashes are per toolchain too (the table may have per-Triton-version rows,
``portattn.configs``): a section's own ``config_hashes``, else (a section recorded before
sections had them) the top-level map, which writers no longer change.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portattn.tools.golden.cases import Case

SCHEMA = 1
LOCK_TIMEOUT_S = 300.0


class GoldenConflict(Exception):
    """A merge would replace differing hashes (or case definitions) and ``force`` is off."""

    def __init__(self, conflicts: list[str]) -> None:
        super().__init__(
            f"{len(conflicts)} conflicting entr{'y' if len(conflicts) == 1 else 'ies'}"
        )
        self.conflicts = conflicts


class GoldenError(Exception):
    """A golden file that cannot be used (wrong family or schema, unreadable, malformed, not
    writable). Its message is one line naming the file."""


# ----------------------------------------------------------------------------- structure

# A check of one JSON value: ``check(value, where)`` raises ``_Malformed``.
_Check = Callable[[Any, str], None]


class _Malformed(Exception):
    """Where a document departs from the golden layout, and how (``load`` names the file)."""


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return "an array" if isinstance(value, list) else "an object"


def _scalar(expected: str, *types: type) -> _Check:
    def check(value: Any, where: str) -> None:
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise _Malformed(f"{where} must be {expected}, got {_json_kind(value)}")

    return check


def _list_of(item: _Check, expected: str) -> _Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _Malformed(f"{where} must be an array of {expected}, got {_json_kind(value)}")
        for i, x in enumerate(value):
            item(x, f"{where}[{i}]")

    return check


def _map_of(item: _Check, expected: str) -> _Check:
    """An object whose every value passes ``item`` (JSON keys are always strings)."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _Malformed(f"{where} must be an object of {expected}, got {_json_kind(value)}")
        for key, x in value.items():
            item(x, f"{where}[{json.dumps(key)}]")

    return check


def _record(expected: str, required: dict[str, _Check], optional: dict[str, _Check]) -> _Check:
    """An object with the ``required`` keys and maybe the ``optional`` ones (others ignored)."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _Malformed(f"{where} must be {expected}, got {_json_kind(value)}")
        for key in required:
            if key not in value:
                raise _Malformed(f"{where or 'the document'} has no {key!r}")
        for key, item in (required | optional).items():
            if key in value:
                item(value[key], f"{where}.{key}" if where else key)

    return check


_STR = _scalar("a string", str)
_STR_OR_NULL = _scalar("a string or null", str, type(None))
_INT = _scalar("an integer", int)
_BOOL = _scalar("a boolean", bool)
_NUMBER = _scalar("a number", int, float)
_INTS = _list_of(_INT, "integers")
_STRS = _list_of(_STR, "strings")
_CASE = _record(
    "a case definition (an object)",
    {
        "kernel": _STR,
        "lens_q": _INTS,
        "lens_k": _INTS,
        "heads_q": _INT,
        "heads_kv": _INT,
        "head_dim": _INT,
        "dtype": _STR,
        "causal": _BOOL,
        "seed": _INT,
    },
    {
        "dlse": _BOOL,
        "inputs_sha256": _STR,
        "page_size": _INT,
        "window_left": _INT,
        "window_right": _INT,
        "softcap": _NUMBER,
        "sinks": _BOOL,
    },
)
_TENSOR = _record(
    "a tensor record (an object)",
    {"sha256": _STR, "seqs": _STRS},
    {"shape": _INTS, "dtype": _STR},
)
_OUTPUT = _record(
    "an output record (an object)",
    {"entry": _STR, "tensors": _map_of(_TENSOR, "tensor records")},
    {"config_hash": _STR_OR_NULL, "fingerprint": _STR_OR_NULL, "inputs_sha256": _STR},
)
_PROVENANCE = _record(
    "a provenance record (an object)",
    {},
    {"devices": _STRS, "drivers": _STRS, "torch": _STRS}
    | {
        key: _STR_OR_NULL for key in ("portattn", "commit", "date", "first_recorded", "provisional")
    },
)
_TOOLCHAIN = _record(
    "a toolchain section (an object)",
    {},
    {
        "config_hashes": _map_of(_STR_OR_NULL, "configuration hashes"),
        "fingerprints": _map_of(
            _map_of(_STR_OR_NULL, "fingerprints (strings or null)"), "per-kernel fingerprints"
        ),
        "provenance": _PROVENANCE,
        "outputs": _map_of(_OUTPUT, "output records"),
    },
)
_BODY = _record(
    "an object",
    {"family": _STR},
    {
        "cases_version": _INT,
        "cases": _map_of(_CASE, "case definitions"),
        "config_hashes": _map_of(_STR_OR_NULL, "configuration hashes"),
        "toolchains": _map_of(_TOOLCHAIN, "toolchain sections"),
    },
)


def check_document(doc: Any) -> None:
    """Raise ``_Malformed`` unless ``doc`` has the layout of this module's docstring (schema
    :data:`SCHEMA` or older; a newer schema is an error of its own). Keys the layout does not
    name are ignored; a missing ``family`` is an error, other missing sections are empty."""
    if not isinstance(doc, dict) or "schema" not in doc:
        raise _Malformed("it is not a golden file (no schema)")
    _INT(doc["schema"], "schema")
    if doc["schema"] > SCHEMA:
        raise _Malformed(f"it has schema {doc['schema']}; this portattn reads {SCHEMA}")
    if "family" not in doc:
        raise _Malformed("it names no family (the key 'family')")
    _BODY(doc, "")
    for name, definition in doc.get("cases", {}).items():
        try:
            Case.from_json(name, definition)
        except ValueError as exc:
            raise _Malformed(f"cases[{json.dumps(name)}]: {exc}") from exc


# ----------------------------------------------------------------------------- reading/writing


def golden_path(golden_dir: str | os.PathLike, family: str) -> Path:
    return Path(golden_dir) / f"{family}.json"


def load(path: str | os.PathLike) -> dict[str, Any] | None:
    """The golden document at ``path``, or None when there is no file. A file that is not
    UTF-8 JSON of the golden layout (:func:`check_document`) raises :class:`GoldenError`
    naming the file, as does one that cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise GoldenError(f"{path} is not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise GoldenError(f"{path} is not valid JSON: {exc}") from exc
    except OSError as exc:
        raise GoldenError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    try:
        check_document(doc)
    except _Malformed as exc:
        raise GoldenError(f"{path} is malformed: {exc}") from None
    return doc


def _encode(value: Any, level: int) -> str:
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f"{inner}{json.dumps(str(k))}: {_encode(value[k], level + 1)}" for k in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, (list, tuple)):
        if all(v is None or isinstance(v, (bool, int, float)) for v in value):
            return "[" + ", ".join(json.dumps(v) for v in value) + "]"
        items = [inner + _encode(v, level + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


def dumps(doc: dict[str, Any]) -> str:
    """The canonical text of a golden document: JSON with sorted keys, indent 1, lists of
    numbers on one line and every string of a list (a sequence's head digests) on its own, so
    one case is one block and a changed hash is a one-line diff."""
    return _encode(doc, 0) + "\n"


def _write_text(f, text: str) -> None:
    """Write the document's text (a seam for the kill-mid-write test)."""
    f.write(text)


def _writable(path: Path) -> bool:
    """Writable by this process, and by its mode: a file or directory without any write
    permission bit is read-only by intent, even for root (whom ``os.access`` always lets)."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def check_writable(path: str | os.PathLike) -> None:
    """Raise :class:`GoldenError` unless the golden file ``path`` can be (re)written: an
    existing file must be writable (a read-only one is never replaced), and its directory, or
    the nearest existing one above it (which the write then extends), must be writable for
    the lock file, the temp file and the rename."""
    path = Path(path)
    if path.is_dir():
        raise GoldenError(f"{path} is a directory, not a golden file")
    if path.exists() and not _writable(path):
        mode = stat.S_IMODE(path.stat().st_mode)
        raise GoldenError(
            f"{path} is not writable (mode {mode:04o}); nothing written: make it writable "
            "to record into it"
        )
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not _writable(parent):
        raise GoldenError(f"cannot write {path}: the directory {parent} is not writable")


def _new_file_mode(path: Path) -> int:
    """The mode of the file that replaces ``path``: the replaced file's, else the umask's
    usual mode for a new file (a golden file is data to share)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    """Write ``doc`` to a temp file beside ``path``, fsync it, then ``os.replace`` it in: a
    reader (or a crash) sees the old file or the new one, never a part. A file that is not
    writable is refused (:func:`check_writable`); a replaced file keeps its mode."""
    path = Path(path)
    check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, mode)  # mkstemp creates the file 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _write_text(f, dumps(doc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_file(
    path: str | os.PathLike,
    update: Callable[[dict[str, Any] | None], dict[str, Any]],
    timeout: float = LOCK_TIMEOUT_S,
) -> dict[str, Any]:
    """Under ``FileLock(<path>.lock)``: re-read the file, apply ``update`` to it and write the
    result atomically. Returns what was written. Exceptions of ``update`` leave the file as it
    was; so does a file that cannot be written (:class:`GoldenError`, before the lock)."""
    from filelock import FileLock

    path = Path(path)
    check_writable(path)  # the lock file needs the directory too
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=timeout):
        new = update(load(path))
        atomic_write(path, new)
    return new


# ----------------------------------------------------------------------------- records


def fingerprint_digest(stages: dict[str, str | None] | None) -> str | None:
    """One digest of an entry's per-kernel fingerprints (None when any is unknown)."""
    if not stages or any(v is None for v in stages.values()):
        return None
    blob = json.dumps(stages, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def empty_doc(family: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "family": family,
        "cases_version": 0,
        "cases": {},
        "config_hashes": {},
        "toolchains": {},
    }


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


def recorded_with_other_kernel(old: dict, new: dict) -> bool:
    """True when ``old`` was recorded with another configuration or machine code than ``new``
    (so differing hashes are expected: ``old`` is stale)."""
    if old.get("config_hash") != new.get("config_hash"):
        return True
    a, b = old.get("fingerprint"), new.get("fingerprint")
    return a is not None and b is not None and a != b


# ----------------------------------------------------------------------------- merging


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
        added, updated = [], []
        for entry, stages in sorted(section.get("fingerprints", {}).items()):
            if target["fingerprints"].get(entry) != stages:
                (updated if entry in target["fingerprints"] else added).append(entry)
                target["fingerprints"][entry] = stages
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
