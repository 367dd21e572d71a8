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


def rows_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every [T, H, D] row of these tensors starts on a 16-byte boundary (base address,
    token and head strides) with the head dim contiguous: what a tensor descriptor (TMA) needs.
    Broadcast dimensions (stride 0, e.g. an expanded output gradient) are left to the pointer
    path too: a descriptor's strides describe distinct rows."""
    for x in tensors:
        size = x.element_size()
        if x.stride(-1) != 1 or x.data_ptr() % 16:
            return False
        if any(x.stride(i) <= 0 or (x.stride(i) * size) % 16 for i in range(x.dim() - 1)):
            return False
    return True


def dense_specialized(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when Triton specializes a kernel argument on it as on a dense tensor (it
    specializes a pointer on 16-byte alignment and an integer, here a stride, on divisibility
    by 16; dense [T, H, D] strides H*D and D are multiples of 16 for every supported D), else
    a dense copy."""
    if x.data_ptr() % 16 == 0 and all(x.stride(i) % 16 == 0 for i in range(x.dim() - 1)):
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
