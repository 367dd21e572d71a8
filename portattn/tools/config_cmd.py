"""``python -m portattn config``: the configuration entry a call runs, for the installed Triton
(or ``--triton X.Y``), each field with the row it comes from, and the entry's content hash.

The entry is :func:`portattn.configs.entry_config`'s; its sources are
:func:`portattn.configs.sources.entry_sources`' (the family's row, the Triton version's row,
a borrowed head dim's or a value-head-dim pair's tiles). Nothing is compiled or launched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, TextIO

import torch

from portattn.configs import (
    KERNELS,
    SUPPORTED_TRITON,
    Tiles,
    UnsupportedTritonError,
    parse_version,
    supported_triton_version,
)
from portattn.configs.sources import EntrySources, check_entry_key, entry_sources
from portattn.validation import check_head_dims

DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", required=True, help="sm80, sm90, sm100, sm120, cdna2-4, interpreter")
    p.add_argument("--kernel", default="varlen", help=f"one of {', '.join(KERNELS)} (varlen)")
    p.add_argument("--head-dim", type=int, required=True, help="q's and k's head dim D")
    p.add_argument("--head-dim-v", type=int, default=None, help="v's head dim (default: D)")
    p.add_argument("--dtype", default="bf16", help="bf16 or fp16 (default bf16)")
    p.add_argument("--triton", default=None, help="X.Y: that version's table (default: installed)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _triton(version: str | None) -> tuple[int, int]:
    """(major, minor) of ``--triton`` (checked against SUPPORTED_TRITON), else the installed."""
    if version is None:
        return supported_triton_version()
    parsed = parse_version(version)
    low, high = SUPPORTED_TRITON
    if not low <= parsed < high:
        last = f"{high[0]}.{high[1] - 1}"
        raise ValueError(f"--triton must be one of {low[0]}.{low[1]} to {last}, got {version}")
    return parsed


def resolve(
    family: str,
    kernel: str,
    head_dim: int,
    dtype: str,
    head_dim_v: int | None = None,
    triton: str | None = None,
) -> EntrySources:
    """The entry and its sources; ValueError for a family, kernel, head dim (pair) or dtype
    outside the table, or a Triton version outside the supported range."""
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_NAMES)}")
    check_entry_key(family, kernel, DTYPE_NAMES[dtype])
    dv = head_dim if head_dim_v is None else head_dim_v
    check_head_dims(head_dim, head_dim, dv)
    return entry_sources(family, kernel, head_dim, DTYPE_NAMES[dtype], dv, _triton(triton))


def _value(value: object) -> Any:
    """A field's value as JSON: tiles as their fields (unset AMD knobs left out)."""
    if isinstance(value, Tiles):
        return {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
    return list(value) if isinstance(value, tuple) else value


def as_dict(entry: EntrySources) -> dict[str, Any]:
    return {
        "family": entry.family,
        "kernel": entry.kernel,
        "head_dim": entry.head_dim,
        "head_dim_v": entry.head_dim_v,
        "dtype": str(entry.dtype).removeprefix("torch."),
        "triton": "{}.{}".format(*entry.triton),
        "row_head_dim": entry.row_head_dim,
        "steps": list(entry.steps),
        "content_hash": entry.config.content_hash(),
        "fields": {f.name: {"value": _value(f.value), "source": f.source} for f in entry.fields},
    }


def _text_value(value: object) -> str:
    if isinstance(value, Tiles):
        stages = f"{value.num_stages} stage" + ("s" if value.num_stages != 1 else "")
        text = f"{value.block_m}x{value.block_n}, {value.num_warps} warps, {stages}"
        return ", ".join([text] + [f"{k}={v}" for k, v in value.amd_knobs().items()])
    if isinstance(value, tuple):
        return ", ".join(value) or "-"
    return "-" if value is None else str(value)


def format_text(entry: EntrySources) -> str:
    d = as_dict(entry)
    dims = f"d{entry.head_dim}" + (
        f"/v{entry.head_dim_v}" if entry.head_dim_v != entry.head_dim else ""
    )
    lines = [
        f"{entry.family} {entry.kernel} {dims} {d['dtype']}, Triton {d['triton']}",
        f"table row: d{entry.row_head_dim} (portattn/configs/rows.py)",
        "built from: " + " -> ".join(entry.steps),
        f"content hash: {d['content_hash']}",
        "",
    ]
    rows = [(f.name, _text_value(f.value), f.source) for f in entry.fields]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    lines += [f"{'field':<{w0}}  {'value':<{w1}}  source"]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def run_config(
    family: str,
    kernel: str,
    head_dim: int,
    dtype: str = "bf16",
    head_dim_v: int | None = None,
    triton: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Print the entry (a table, or JSON) to ``out`` (stdout) and return 0; an unknown family,
    kernel, head dim or dtype (or an unsupported Triton) prints the reason to stderr and
    returns 2."""
    out = out or sys.stdout
    try:
        entry = resolve(family, kernel, head_dim, dtype, head_dim_v, triton)
    except (ValueError, UnsupportedTritonError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(as_dict(entry), indent=2) if as_json else format_text(entry), file=out)
    return 0


def main(args: argparse.Namespace) -> int:
    return run_config(
        args.family,
        args.kernel,
        args.head_dim,
        args.dtype,
        args.head_dim_v,
        args.triton,
        args.json,
    )
