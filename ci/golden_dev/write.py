"""Writing golden files: their canonical text, and safe concurrent writes (a lock, a temp file,
``os.replace``; docs/golden.md, "Refresh")."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci.golden_dev.merging import GoldenConflict, merge
from portattn.tools.golden.layout import GoldenError, load

LOCK_TIMEOUT_S = 300.0


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
