"""Hashes of tensors: SHA-256 of the raw bytes, and short per-sequence, per-head digests.

Bytes are those of a contiguous CPU copy in the machine's byte order, which must be
little-endian (every platform the kernels run on is); no numpy is needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys

import torch

DIGEST_HEX = 16  # hex digits of a per-sequence, per-head digest

if sys.byteorder != "little":  # pragma: no cover - no such platform runs the kernels
    raise ImportError(
        "portattn.tools.golden hashes raw little-endian bytes; this machine is big-endian"
    )


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw bytes of ``t`` (contiguous, row-major, little-endian), copied to the CPU."""
    t = t.detach().cpu().contiguous()
    nbytes = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b""


def sha256_tensor(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def short_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()[:DIGEST_HEX]


def sequence_digests(t: torch.Tensor, bounds: list[int]) -> list[str]:
    """Per sequence, its heads' digests joined by spaces: ``t`` is ``[tokens, heads, ...]``
    and sequence ``b`` owns tokens ``bounds[b]:bounds[b + 1]``."""
    t = t.detach().cpu()
    rows = []
    for start, end in zip(bounds, bounds[1:]):
        part = t[start:end]
        rows.append(" ".join(short_digest(part[:, h]) for h in range(t.shape[1])))
    return rows


def tensor_record(t: torch.Tensor, bounds: list[int]) -> dict:
    """The golden record of one output tensor."""
    dtype = str(t.dtype).removeprefix("torch.")
    return {
        "sha256": sha256_tensor(t),
        "shape": list(t.shape),
        "dtype": dtype,
        "seqs": sequence_digests(t, bounds),
    }


def inputs_sha256(named: list[tuple[str, torch.Tensor]]) -> str:
    """One SHA-256 over named tensors: name, dtype and shape, then the raw bytes, in order."""
    h = hashlib.sha256()
    for name, t in named:
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
