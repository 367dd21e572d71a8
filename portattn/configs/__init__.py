"""The one configuration table: fixed launch parameters per (family, kernel, head_dim, dtype).

Split by job, all importable from here as before:

* :mod:`~portattn.configs.rows`: the rows, as data (every entry's tiles in one file, with the
  per-Triton-version rows and the borrowed head dims' tiles);
* :mod:`~portattn.configs.types`: :class:`Tiles`, :class:`KernelConfig` (and its content
  hash), the table's axes;
* :mod:`~portattn.configs.lookup`: the entry a call runs (:func:`entry_config`,
  :func:`resolve_config`), for the installed Triton or any version's table;
* :mod:`~portattn.configs.triton_gate`: the Triton versions portattn is checked with, and the
  check at the first lookup (:class:`UnsupportedTritonError`);
* :mod:`~portattn.configs.sources`: where each field of an entry comes from (``python -m
  portattn config``).
"""

from portattn.configs.lookup import (
    base_row,
    borrowed_config,
    config_table,
    entry_config,
    get_config,
    pair_config,
    resolve_config,
    table_for,
    table_versions,
    versioned_row,
)
from portattn.configs.triton_gate import (
    SUPPORTED_TRITON,
    UnsupportedTritonError,
    installed_triton,
    interpreter_active,
    parse_version,
    supported_triton_version,
    upcast_dot,
)
from portattn.configs.types import (
    AMD_KNOBS,
    BORROWED_HEAD_DIMS,
    DTYPES,
    HEAD_DIMS,
    INTERPRETER,
    KERNELS,
    PAIR_HEAD_DIMS,
    SUPPORTED_HEAD_DIMS,
    TILE_FIELDS,
    TMA_KERNELS,
    VALUE_HEAD_DIM_PAIRS,
    KernelConfig,
    Tiles,
    compact_tiles,
    retuned,
    table_head_dim,
)

__all__ = [
    "AMD_KNOBS",
    "BORROWED_HEAD_DIMS",
    "DTYPES",
    "HEAD_DIMS",
    "INTERPRETER",
    "KERNELS",
    "PAIR_HEAD_DIMS",
    "SUPPORTED_HEAD_DIMS",
    "SUPPORTED_TRITON",
    "TILE_FIELDS",
    "TMA_KERNELS",
    "VALUE_HEAD_DIM_PAIRS",
    "KernelConfig",
    "Tiles",
    "UnsupportedTritonError",
    "base_row",
    "borrowed_config",
    "compact_tiles",
    "config_table",
    "entry_config",
    "get_config",
    "installed_triton",
    "interpreter_active",
    "pair_config",
    "parse_version",
    "resolve_config",
    "retuned",
    "supported_triton_version",
    "table_for",
    "table_head_dim",
    "table_versions",
    "upcast_dot",
    "versioned_row",
]
