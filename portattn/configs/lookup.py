"""The lookup: which entry a (family, kernel, head_dim, dtype) runs, for a Triton version.

An entry is a family's base row (:data:`rows.BY_FAMILY`, or the kernel's own in
:data:`rows.FIXED_ORDER`), replaced from a Triton version on by that version's row
(:data:`rows.SINCE_TRITON`), with the family's paged-decode block-table reads
(:data:`rows.PAGE_BLOCK`), then, for a head dim without a row of its own or a value head dim
of another width, the wider row with that head dim's own tiles (:data:`rows.BORROWED_TILES`,
:data:`rows.PAIR_SINCE_TRITON`); ``sources.entry_sources`` says which of these gave each field.
The table is looked up lazily, at the first call, never at import.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from portattn.configs import rows
from portattn.configs.triton_gate import SUPPORTED_TRITON, supported_triton_version
from portattn.configs.types import (
    DTYPES,
    HEAD_DIMS,
    INTERPRETER,
    KERNELS,
    KernelConfig,
    retuned,
    table_head_dim,
)


def base_row(family: str, kernel: str, head_dim: int) -> KernelConfig:
    """The row Triton 3.6 runs: the kernel's own (:data:`rows.FIXED_ORDER`), else the family's."""
    if kernel == "fixed_order" and head_dim in rows.FIXED_ORDER.get(family, {}):
        return rows.FIXED_ORDER[family][head_dim]
    return rows.BY_FAMILY[family][head_dim]


def version_override(
    family: str, kernel: str, head_dim: int, triton: tuple[int, int]
) -> tuple[int, int] | None:
    """The Triton version of the latest per-version row (:data:`rows.SINCE_TRITON`) at or
    before ``triton`` for this table row, or None where the base row runs."""
    for since in sorted(rows.SINCE_TRITON, reverse=True):
        if triton >= since and (family, kernel, head_dim) in rows.SINCE_TRITON[since]:
            return since
    return None


def versioned_row(family: str, kernel: str, head_dim: int, triton: tuple[int, int]):
    """The row of the latest per-version override at or before ``triton``, else the base row,
    with the family's ``page_block`` (:func:`with_page_block`)."""
    since = version_override(family, kernel, head_dim, triton)
    if since is not None:
        return with_page_block(rows.SINCE_TRITON[since][(family, kernel, head_dim)], family)
    return with_page_block(base_row(family, kernel, head_dim), family)


@functools.cache
def with_page_block(row: KernelConfig, family: str) -> KernelConfig:
    """``row`` with its family's paged-decode block-table reads (:data:`rows.PAGE_BLOCK`; the
    row itself where the family has none). Kept: one row gives one entry object in every
    version's table, as the rows themselves are."""
    tiles = rows.PAGE_BLOCK.get(family, 0)
    return row if tiles == row.page_block else dataclasses.replace(row, page_block=tiles)


def table_for(triton: tuple[int, int]) -> dict[tuple[str, str, int, torch.dtype], KernelConfig]:
    """Every (family, kernel, head_dim, dtype) entry for Triton ``triton`` ((major, minor); no
    range check: tests and tools read any version's table). Both dtypes currently share a row,
    and both kernels unless rows.FIXED_ORDER has a row; they are separate keys so one can
    change alone."""
    return {
        (fam, kernel, d, dtype): versioned_row(fam, kernel, d, triton)
        for fam in rows.BY_FAMILY
        for kernel in KERNELS
        for d in HEAD_DIMS
        for dtype in DTYPES
    }


def table_versions() -> tuple[tuple[int, int], ...]:
    """The Triton versions whose tables differ: the lowest supported and each override's."""
    return (SUPPORTED_TRITON[0], *sorted(rows.SINCE_TRITON))


@functools.cache
def config_table() -> dict[tuple[str, str, int, torch.dtype], KernelConfig]:
    """The table for the installed Triton (checked: ``triton_gate.supported_triton_version``)."""
    return table_for(supported_triton_version())


def get_config(family: str, kernel: str, head_dim: int, dtype: torch.dtype) -> KernelConfig:
    return config_table()[(family, kernel, head_dim, dtype)]


def pair_fields(
    family: str, kernel: str, head_dim: int, head_dim_v: int, triton: tuple[int, int]
) -> tuple[tuple[int, int] | None, dict]:
    """(first Triton, fields) of a value-head-dim pair's own tiles for Triton ``triton``
    (:data:`rows.PAIR_SINCE_TRITON`), or (None, {}) where it runs its row's."""
    for since in sorted(rows.PAIR_SINCE_TRITON, reverse=True):
        fields = rows.PAIR_SINCE_TRITON[since].get((family, kernel, (head_dim, head_dim_v)))
        if triton >= since and fields:
            return since, fields
    return None, {}


def pair_config(
    cfg: KernelConfig,
    family: str,
    kernel: str,
    head_dim: int,
    head_dim_v: int,
    triton: tuple[int, int] | None = None,
) -> KernelConfig:
    """The entry a call with v's own head dim runs: ``cfg`` (the row of the wider head dim),
    with the pair's tiles of :data:`rows.PAIR_SINCE_TRITON` for Triton ``triton`` (default: the
    installed one) where it has them."""
    if head_dim_v == head_dim:
        return cfg
    _, fields = pair_fields(
        family, kernel, head_dim, head_dim_v, triton or supported_triton_version()
    )
    return retuned(cfg, **fields) if fields else cfg


def borrowed_fields(family: str, kernel: str, head_dim: int) -> dict:
    """A borrowed head dim's own tiles (:data:`rows.BORROWED_TILES`; empty where it has none,
    and for a table head dim)."""
    return {} if head_dim in HEAD_DIMS else rows.BORROWED_TILES.get((family, kernel, head_dim), {})


def borrowed_config(cfg: KernelConfig, family: str, kernel: str, head_dim: int) -> KernelConfig:
    """The entry a borrowed head dim (q/k = v) runs: ``cfg`` (the row it borrows, as the Triton
    version at hand runs it) with its tiles of :data:`rows.BORROWED_TILES` where it has them;
    ``cfg`` itself for a table head dim."""
    fields = borrowed_fields(family, kernel, head_dim)
    return retuned(cfg, **fields) if fields else cfg


def entry_config(
    family: str,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
    triton: tuple[int, int] | None = None,
) -> KernelConfig:
    """The configuration of ``family`` for a call with head dim ``head_dim`` (v's:
    ``head_dim_v``, None: the same), for Triton ``triton`` (default: the installed one): the
    table row of the wider head dim (:func:`table_head_dim`), with a pair's tiles
    (:func:`pair_config`) or a borrowed head dim's (:func:`borrowed_config`)."""
    dims = head_dim if head_dim_v is None else max(head_dim, head_dim_v)
    row = table_head_dim(dims)
    key = (family, kernel, row, dtype)
    cfg = config_table()[key] if triton is None else table_for(triton)[key]
    if head_dim_v is not None and head_dim_v != head_dim:
        return pair_config(cfg, family, kernel, head_dim, head_dim_v, triton)
    return borrowed_config(cfg, family, kernel, head_dim)


def resolve_config(
    device: torch.device,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
):
    """The configuration for tensors on ``device``: the interpreter row for CPU tensors, else the
    device's family (or its nearest family for devices outside the table), as
    :func:`entry_config` gives it."""
    if device.type == "cpu":
        family = INTERPRETER
    else:
        from portattn.families import config_family

        family = config_family(device)
    return entry_config(family, kernel, head_dim, dtype, head_dim_v)
