"""The golden document: its layout, its schema, its check, and the errors of golden files.

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

Output hashes live under the toolchain (Triton version) that produced them: a new Triton adds a
section, it never replaces one. ``fingerprint`` of an output is the digest of its entry's
compile fingerprints when it was recorded; when the stored fingerprints (or the configuration)
of that entry change later, the output is *stale* until re-recorded on hardware.

Configuration hashes are per toolchain too (the table may have per-Triton-version rows,
``portattn.configs``): a section's own ``config_hashes``, else (a section recorded before
sections had them) the top-level map, which writers no longer change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from portattn.tools.golden.cases import Case

SCHEMA = 1


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


def empty_doc(family: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "family": family,
        "cases_version": 0,
        "cases": {},
        "config_hashes": {},
        "toolchains": {},
    }
