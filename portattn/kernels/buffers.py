"""Buffers of the launchers: outputs, and the scratch of in-kernel tensor descriptors.

``POISON`` is a test hook: when True, every output buffer starts filled with NaN (floating) so a
test can prove that the kernels wrote every element. It costs a fill, so it is off by default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

POISON = False


def new_buffer(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous output buffer (NaN-filled when ``POISON`` is set)."""
    if POISON:
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


# Write-only lse buffers by (device, rows, heads): the forward writes an lse always, and where
# nobody asks for it (an eager no-grad call not returning it) one buffer per shape takes every
# call's. Nothing reads them, so calls on any stream may write one at once; none is ever freed
# (once full, calls get a new buffer), so no kernel in flight writes to memory handed out again.
# Never used while a CUDA graph is captured: a graph keeps the addresses it records.
_LSE_SCRATCH: dict[tuple, torch.Tensor] = {}
_LSE_SCRATCH_MAX = 16
LSE_SCRATCH_MAX_NUMEL = 1 << 18  # 1 MiB each: larger calls allocate as before


def lse_scratch(rows: int, heads: int, device: torch.device) -> torch.Tensor | None:
    """A float32 [rows, heads] buffer for an lse that no one reads, kept for the next call of
    the same shape; None when it is too large or the buffers are all taken (a new one then)."""
    key = (device, rows, heads)
    buf = _LSE_SCRATCH.get(key)
    room = len(_LSE_SCRATCH) < _LSE_SCRATCH_MAX
    if buf is None and room and rows * heads <= LSE_SCRATCH_MAX_NUMEL:
        buf = _LSE_SCRATCH[key] = new_buffer((rows, heads), torch.float32, device)
    return buf


def rows_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every [T, H, D] row of these tensors starts on a 16-byte boundary (base address,
    token and head strides) with the head dim contiguous: what a tensor descriptor (TMA) needs.
    Broadcast dimensions (stride 0, e.g. an expanded output gradient) are left to the pointer
    path too: a descriptor's strides describe distinct rows."""
    for x in tensors:
        strides = x.stride()  # one call: this runs on every launch's host path
        if strides[-1] != 1 or x.data_ptr() % 16:
            return False
        size = x.element_size()
        for stride in strides[:-1]:
            if stride <= 0 or (stride * size) % 16:
                return False
    return True


def row_stride_multiple(x: torch.Tensor) -> int:
    """The divisibility ``dense_specialized`` asks of ``x``'s token / head strides: 16 (what
    Triton specializes an integer on) unless its last dim is an odd multiple of 8, whose
    strides the kernels take to be multiples of 8 (``addressing.row_strides``)."""
    return 8 if x.shape[-1] % 16 == 8 else 16


def check_row_strides(*tensors: torch.Tensor) -> None:
    """Raise ValueError where a tensor whose last dim is an odd multiple of 8 has a token,
    head or page stride that is not a multiple of 8: the kernels round those strides down to
    multiples of 8 (``addressing.row_strides``), so another stride would address other rows.
    Nothing to check for the other head dims (the kernels read any strides there)."""
    for x in tensors:
        if x is None or row_stride_multiple(x) != 8:
            continue
        if any(x.stride(i) % 8 for i in range(x.dim() - 1)):
            raise ValueError(
                f"a head dim that is an odd multiple of 8 needs token / head strides that are "
                f"multiples of 8, got shape {tuple(x.shape)}, strides {x.stride()}; pass a "
                "contiguous tensor"
            )


def dense_specialized(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when Triton specializes a kernel argument on it as on a dense tensor (it
    specializes a pointer on 16-byte alignment and an integer, here a stride, on divisibility
    by 16; dense [T, H, D] strides H*D and D are multiples of 16 for every table D; for odd
    multiples of 8 the kernels take them to be multiples of 8, ``row_stride_multiple``), else
    a dense copy."""
    mult = row_stride_multiple(x)
    if x.data_ptr() % 16 == 0 and all(x.stride(i) % mult == 0 for i in range(x.dim() - 1)):
        return x
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


@contextlib.contextmanager
def descriptor_scratch(device: torch.device, needed: bool) -> Iterator[None]:
    """Tensor descriptors made inside a kernel live in global scratch memory that Triton asks
    its current allocator for at launch. Set one (torch's caching allocator) for this launch
    only, leaving the caller's allocator as it was."""
    if not needed:
        yield
        return
    from triton.runtime import _allocation

    def allocate(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    token = _allocation._allocator.set(allocate)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)
