"""Golden files on disk: reading one (checked against the layout of
:mod:`portattn.tools.golden.layout`), its canonical text, and safe concurrent writes (a lock, a
temp file, ``os.replace``).

Building, comparing and merging the records inside a document are :mod:`.records` and
:mod:`.merging`; the names they took from this module are imported here too, so that older
imports of them keep working.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portattn.tools.golden.layout import (
    SCHEMA,
    GoldenConflict,
    GoldenError,
    _Malformed,
    check_document,
    empty_doc,
)
from portattn.tools.golden.merging import merge
from portattn.tools.golden.records import (
    build_record,
    config_hashes_of,
    fingerprint_digest,
    output_differences,
    recorded_with_other_kernel,
    stale_outputs,
    tensor_differences,
)

__all__ = [
    "LOCK_TIMEOUT_S",
    "SCHEMA",
    "GoldenConflict",
    "GoldenError",
    "atomic_write",
    "build_record",
    "check_document",
    "check_writable",
    "config_hashes_of",
    "dumps",
    "empty_doc",
    "fingerprint_digest",
    "golden_path",
    "load",
    "merge",
    "output_differences",
    "recorded_with_other_kernel",
    "stale_outputs",
    "tensor_differences",
    "update_file",
    "write_record",
]

LOCK_TIMEOUT_S = 300.0


# A family name as a file name: the table's (sm90, cdna3) and the tests' made-up ones; no path
# separators, no leading dot (``../x`` made refresh write outside the golden folder).
_FAMILY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def golden_path(golden_dir: str | os.PathLike, family: str) -> Path:
    """``<golden_dir>/<family>.json``; GoldenError for a family that is no plain name."""
    if not isinstance(family, str) or not _FAMILY_NAME.fullmatch(family):
        raise GoldenError(
            f"{family!r} is not a family name (letters, digits, '_' and '-', e.g. sm90): no "
            "golden file outside the golden folder"
        )
    return Path(golden_dir) / f"{family}.json"


def load(path: str | os.PathLike, family: str | None = None) -> dict[str, Any] | None:
    """The golden document at ``path``, or None when there is no file. A file that is not
    UTF-8 JSON of the golden layout (:func:`check_document`) raises :class:`GoldenError`
    naming the file, as does one that cannot be read, and, with ``family``, one whose own
    ``family`` field names another family (sm80's file saved as sm90.json)."""
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
    if family is not None and doc["family"] != family:
        raise GoldenError(
            f"{path} holds the golden records of {doc['family']} (its 'family' field), not "
            f"{family}: a copy of {doc['family']}'s file? Nothing of it is compared or replaced"
        )
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
    writable is refused (:func:`check_writable`); a replaced file keeps its mode. A symlink is
    written through (its target replaced, beside it), never replaced by a regular file."""
    path = Path(path).resolve()
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
    was; so does a file that cannot be written (:class:`GoldenError`, before the lock). A
    symlink is followed: the lock and the write are its target's."""
    from filelock import FileLock

    path = Path(path).resolve()
    check_writable(path)  # the lock file needs the directory too
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=timeout):
        new = update(load(path))
        atomic_write(path, new)
    return new


def write_record(
    path: Path,
    record: dict,
    force: bool,
    out: Callable[[str], None],
    toolchain: str | None = None,
) -> int:
    """Merge ``record`` into the golden file at ``path`` under its lock, printing each change
    through ``out``: 0 written (or no change), 1 refused conflict (nothing written), 2 an
    unusable file or a failed write. ``toolchain``: the section whose outputs the record holds
    (hardware hashes replace provisional ones there)."""
    from filelock import Timeout

    changes: list[str] = []
    section = record["toolchains"].get(toolchain, {}) if toolchain else {}
    real = toolchain is not None and not section.get("provenance", {}).get("provisional")

    def update(existing: dict | None) -> dict:
        held = (existing or {}).get("toolchains", {}).get(toolchain) if real else None
        if held and (held.get("provenance") or {}).get("provisional"):
            # The family's own hardware replaces hashes made under the override, whatever
            # they were: they were evidence, not a record.
            held.pop("outputs", None)
            held.pop("provenance", None)
            changes.append(f"[{toolchain}] provisional outputs replaced by this hardware's")
        doc, found = merge(existing, record, force)
        changes.extend(found)
        return doc

    try:
        update_file(path, update)
    except GoldenConflict as exc:
        out(
            f"refused: {len(exc.conflicts)} stored value(s) of {path} differ; nothing written "
            "(re-run with --force to overwrite them):"
        )
        for line in exc.conflicts:
            out(f"    {line}")
        return 1
    except (GoldenError, Timeout) as exc:
        out(f"error: {exc}")
        return 2
    except OSError as exc:  # the checks before passed, the write did not (a race, a full disk)
        out(f"error: cannot write {path}: {exc.strerror or exc}; nothing written")
        return 2
    for line in changes:
        out(f"  {line}")
    out(f"wrote {path} ({len(changes)} change(s))" if changes else f"{path}: no change")
    return 0
