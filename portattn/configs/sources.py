"""Where each field of an entry comes from: the rows that :func:`lookup.entry_config` puts
together, step by step, for ``python -m portattn config``.

An entry is built in at most four steps, each from :mod:`portattn.configs.rows`: the family's
base row (or the kernel's own in ``FIXED_ORDER``), replaced from a Triton version on by that
version's row (``SINCE_TRITON``), the family's ``page_block`` (``PAGE_BLOCK``), then a borrowed
head dim's or a value-head-dim pair's own tiles (``BORROWED_TILES``, ``PAIR_SINCE_TRITON``). A
field's source is the last step that changed it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from portattn.configs import lookup, rows
from portattn.configs.triton_gate import supported_triton_version
from portattn.configs.types import DTYPES, KERNELS, KernelConfig, retuned, table_head_dim


@dataclass(frozen=True)
class FieldSource:
    """One field of an entry: its value and the row it comes from (a ``rows.`` expression, or
    how it is derived)."""

    name: str
    value: object
    source: str


@dataclass(frozen=True)
class EntrySources:
    """An entry (``config``, the one :func:`lookup.entry_config` gives), the table row it runs
    (``row_head_dim``), the steps that built it (labels, first to last) and each field's
    source, in :class:`KernelConfig`'s field order."""

    family: str
    kernel: str
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    triton: tuple[int, int]
    row_head_dim: int
    config: KernelConfig
    steps: tuple[str, ...]
    fields: tuple[FieldSource, ...]


def family_table_name(family: str) -> str:
    """The name in :mod:`rows` of the family's base rows (cdna4 runs ``CDNA3``)."""
    table = rows.BY_FAMILY[family]
    names = [family.upper()] + sorted(vars(rows))
    return next(n for n in names if n.isupper() and getattr(rows, n, None) is table)


def base_row_label(family: str, kernel: str, head_dim: int) -> str:
    """Where :func:`lookup.base_row` finds the row, as it is written in :mod:`rows`."""
    if kernel == "fixed_order" and head_dim in rows.FIXED_ORDER.get(family, {}):
        return f"rows.FIXED_ORDER[{family!r}][{head_dim}]"
    return f"rows.{family_table_name(family)}[{head_dim}]"


def _steps(
    family: str, kernel: str, head_dim: int, head_dim_v: int, triton: tuple[int, int]
) -> list[tuple[str, KernelConfig]]:
    """(label, row after that step), in the order :func:`lookup.entry_config` applies them."""
    row_d = table_head_dim(max(head_dim, head_dim_v))
    steps = [(base_row_label(family, kernel, row_d), lookup.base_row(family, kernel, row_d))]
    since = lookup.version_override(family, kernel, row_d, triton)
    if since is not None:
        label = f"rows.SINCE_TRITON[{since}][{(family, kernel, row_d)!r}]"
        steps.append((label, rows.SINCE_TRITON[since][(family, kernel, row_d)]))
    if family in rows.PAGE_BLOCK:
        label = f"rows.PAGE_BLOCK[{family!r}]"
        steps.append((label, lookup.with_page_block(steps[-1][1], family)))
    if head_dim_v != head_dim:
        since, fields = lookup.pair_fields(family, kernel, head_dim, head_dim_v, triton)
        label = f"rows.PAIR_SINCE_TRITON[{since}][{(family, kernel, (head_dim, head_dim_v))!r}]"
    else:
        fields = lookup.borrowed_fields(family, kernel, head_dim)
        label = f"rows.BORROWED_TILES[{(family, kernel, head_dim)!r}]"
    if fields:
        steps.append((label, retuned(steps[-1][1], **fields)))
    return steps


def check_entry_key(family: str, kernel: str, dtype: torch.dtype) -> None:
    """ValueError naming the choices for a family, kernel or dtype outside the table (head
    dims: ``validation.check_head_dims``)."""
    if family not in rows.BY_FAMILY:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(rows.BY_FAMILY)}")
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; one of {', '.join(KERNELS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype}")


def entry_sources(
    family: str,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
    triton: tuple[int, int] | None = None,
) -> EntrySources:
    """The entry of :func:`lookup.entry_config` (same arguments; ``triton`` None: the installed
    one) with the source of each field. ``decode`` is the decode kernel's tiles: the entry's
    own where it has them, else derived from the forward's (``KernelConfig.decode_tiles``)."""
    check_entry_key(family, kernel, dtype)
    triton = triton or supported_triton_version()
    dv = head_dim if head_dim_v is None else head_dim_v
    cfg = lookup.entry_config(family, kernel, head_dim, dtype, head_dim_v, triton)
    steps = _steps(family, kernel, head_dim, dv, triton)
    if steps[-1][1] != cfg:  # the steps must retrace the lookup, or their labels would lie
        raise AssertionError(f"the sources of {family} {kernel} d{head_dim} retrace no entry")
    fields = []
    for f in dataclasses.fields(KernelConfig):
        source, prev = steps[0][0], getattr(steps[0][1], f.name)
        for label, row in steps[1:]:
            if getattr(row, f.name) != prev:
                source, prev = label, getattr(row, f.name)
        if f.name == "decode" and cfg.decode is None:
            fwd_source = next(s.source for s in fields if s.name == "fwd")
            fields.append(
                FieldSource("decode", cfg.decode_tiles(), f"derived from fwd ({fwd_source})")
            )
            continue
        fields.append(FieldSource(f.name, getattr(cfg, f.name), source))
    return EntrySources(
        family,
        kernel,
        head_dim,
        dv,
        dtype,
        triton,
        table_head_dim(max(head_dim, dv)),
        cfg,
        tuple(label for label, _ in steps),
        tuple(fields),
    )
