"""The one configuration table: fixed launch parameters per (family, kernel, head_dim, dtype).

No autotuning, and nothing here depends on max_seqlen, batch size or SM count: a sequence's
bits depend only on the family, the kernel, its head dim and dtype. The table is looked up
lazily, at the first call, never at import.
"""

from __future__ import annotations

import hashlib
import json
import functools
import os
from dataclasses import asdict, dataclass

import torch

KERNELS = ("varlen", "fixed_order")
HEAD_DIMS = (32, 64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
INTERPRETER = "interpreter"  # pseudo-family: CPU tensors under TRITON_INTERPRET=1


@dataclass(frozen=True)
class Tiles:
    """Launch parameters of one kernel. AMD-only knobs are None on CUDA."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None
    kpack: int | None = None

    def launch_kwargs(self) -> dict[str, int]:
        kwargs = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        for knob in ("waves_per_eu", "matrix_instr_nonkdim", "kpack"):
            if getattr(self, knob) is not None:
                kwargs[knob] = getattr(self, knob)
        return kwargs


@dataclass(frozen=True)
class KernelConfig:
    """Tiles of the four kernels of one (family, kernel, head_dim, dtype)."""

    fwd: Tiles
    bwd_pre: Tiles
    bwd_dkdv: Tiles
    bwd_dq: Tiles

    def content_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the canonical JSON of this entry."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cfg(fwd, dkdv, dq, amd=None) -> KernelConfig:
    """Compact row: (block_m, block_n, warps, stages) per kernel; ``amd`` = AMD knobs."""
    amd = amd or {}
    pre = Tiles(64, 64, 4, 1, **amd)
    return KernelConfig(Tiles(*fwd, **amd), pre, Tiles(*dkdv, **amd), Tiles(*dq, **amd))


# fmt: off
# head_dim:        fwd (BM, BN, warps, stages)   dK/dV (BM, BN, w, s)   dQ (BM, BN, w, s)
_SM90 = {
    32:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    64:  _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    96:  _cfg((128, 128, 8, 2),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    128: _cfg((128, 128, 8, 3),  (64, 128, 8, 2),  (128, 64, 8, 2)),
    256: _cfg((128, 64, 8, 2),   (32, 64, 8, 2),   (64, 32, 8, 2)),
}
_SM80 = {
    32:  _cfg((128, 64, 4, 3),   (32, 64, 4, 2),   (64, 32, 4, 2)),
    64:  _cfg((128, 64, 4, 3),   (32, 64, 4, 2),   (64, 32, 4, 2)),
    96:  _cfg((128, 64, 4, 2),   (32, 64, 4, 2),   (64, 32, 4, 2)),
    128: _cfg((128, 64, 4, 2),   (32, 64, 4, 2),   (64, 32, 4, 2)),
    256: _cfg((64, 64, 4, 2),    (32, 32, 4, 1),   (32, 32, 4, 1)),
}
_CDNA3 = {
    32:  _cfg((128, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    64:  _cfg((128, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    96:  _cfg((128, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    128: _cfg((128, 64, 4, 1),   (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    256: _cfg((64, 64, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), dict(waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1)),
}
_CDNA2 = {
    32:  _cfg((64, 64, 4, 1),    (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    64:  _cfg((64, 64, 4, 1),    (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    96:  _cfg((64, 64, 4, 1),    (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    128: _cfg((64, 64, 4, 1),    (32, 64, 4, 1),   (64, 32, 4, 1), dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1)),
    256: _cfg((64, 32, 4, 1),    (32, 32, 4, 1),   (32, 32, 4, 1), dict(waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1)),
}
# Small tiles under the CPU interpreter: fast there, and many tile boundaries in small tests.
_INTERP = {d: _cfg((32, 16, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)) for d in HEAD_DIMS}
# fmt: on

_BY_FAMILY = {
    "sm80": _SM80,
    "sm90": _SM90,
    "cdna2": _CDNA2,
    "cdna3": _CDNA3,
    "cdna4": _CDNA3,
    INTERPRETER: _INTERP,
}


@functools.cache
def config_table() -> dict[tuple[str, str, int, torch.dtype], KernelConfig]:
    """Every (family, kernel, head_dim, dtype) entry. Both kernels and both dtypes currently
    share a family's row; they are separate keys so one can be changed alone."""
    return {
        (fam, kernel, d, dtype): rows[d]
        for fam, rows in _BY_FAMILY.items()
        for kernel in KERNELS
        for d in HEAD_DIMS
        for dtype in DTYPES
    }


def get_config(family: str, kernel: str, head_dim: int, dtype: torch.dtype) -> KernelConfig:
    return config_table()[(family, kernel, head_dim, dtype)]


def interpreter_active() -> bool:
    """True when Triton runs kernels on the CPU interpreter (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def upcast_dot(q: torch.Tensor) -> bool:
    """Operands of ``tl.dot`` go to float32 only under the interpreter for bfloat16, where the
    interpreter would otherwise multiply raw bits (triton-lang/triton#11584)."""
    return interpreter_active() and q.dtype == torch.bfloat16


def resolve_config(device: torch.device, kernel: str, head_dim: int, dtype: torch.dtype):
    """The configuration for tensors on ``device``: the interpreter row for CPU tensors, else the
    device's family (or its nearest family for devices outside the table)."""
    if device.type == "cpu":
        return get_config(INTERPRETER, kernel, head_dim, dtype)
    from portattn.families import config_family

    return get_config(config_family(device), kernel, head_dim, dtype)
