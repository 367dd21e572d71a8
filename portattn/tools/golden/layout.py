"""The golden document: its layout, its check, reading it, and the errors of golden files
(docs/golden.md, "What is stored"; design §5).

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
       "keys": {"varlen/d128/bf16": {"fwd": sha256, ...}, ...},  # compile keys (CPU-made)
       "provenance": {devices, drivers, torch, portattn, commit, date, first_recorded},
       "outputs": {name: {entry, config_hash, fingerprint, inputs_sha256,
                          tensors: {out|lse|dq|dk|dv|dsinks: {sha256, shape, dtype,
                                                               seqs}}}}
      }
     }
    }
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portattn.tools.golden.cases import Case

SCHEMA = 1


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
        "keys": _map_of(_map_of(_STR, "compile keys (strings)"), "per-kernel compile keys"),
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
