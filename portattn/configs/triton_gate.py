"""The installed Triton: the versions portattn is checked with (:data:`SUPPORTED_TRITON`), the
check that refuses any other at the first lookup (:func:`supported_triton_version`), and
whether Triton runs the kernels on the CPU interpreter.

Which rows a supported version runs instead of the base ones is data, beside the rows
(:data:`portattn.configs.rows.SINCE_TRITON`); :mod:`portattn.configs.lookup` applies them.
"""

from __future__ import annotations

import os
import re

import torch

# Triton releases the kernels and the table are checked with: (major, minor) from the first
# supported up to the first unsupported one. pyproject.toml's `triton>=3.6,<3.10` says the same.
SUPPORTED_TRITON = ((3, 6), (3, 10))


class UnsupportedTritonError(RuntimeError):
    """The installed Triton is outside :data:`SUPPORTED_TRITON`."""


def installed_triton() -> str:
    """``triton.__version__``: also on ROCm, whose Triton is the distribution
    ``pytorch-triton-rocm`` (package metadata would not find "triton" there)."""
    import triton

    return triton.__version__


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: ``"3.9.0"``, ``"3.6.0+git1234"``, ``"3.5.0rc1"``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise UnsupportedTritonError(f"cannot read Triton's version {version!r}")
    return int(match[1]), int(match[2])


def supported_triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton; raises :class:`UnsupportedTritonError`, naming
    the version and the range, when portattn is not checked with it. Called through
    ``lookup.config_table`` (cached) at the first launch, so an unsupported Triton fails there
    with this message rather than deep inside a compile, and importing portattn never does."""
    version = installed_triton()
    parsed = parse_version(version)
    low, high = SUPPORTED_TRITON
    if not low <= parsed < high:
        supported = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise UnsupportedTritonError(
            f"portattn supports Triton {supported} (its kernels and configuration table are "
            f"checked with {low[0]}.{low[1]} through {high[0]}.{high[1] - 1}); the installed "
            f"Triton is {version}. Install a supported one: pip install 'triton{supported}' "
            "(ROCm: the pytorch-triton-rocm of a torch build that ships one)"
        )
    return parsed


def interpreter_active() -> bool:
    """True when Triton runs kernels on the CPU interpreter (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def upcast_dot(q: torch.Tensor) -> bool:
    """Operands of ``tl.dot`` go to float32 only under the interpreter for bfloat16, where the
    interpreter would otherwise multiply raw bits (triton-lang/triton#11584)."""
    return interpreter_active() and q.dtype == torch.bfloat16
