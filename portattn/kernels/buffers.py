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


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """Whether the copy engine (TMA) can read [T, H, D] rows of these tensors: base address
    and token and head strides multiples of 16 bytes, head dim contiguous. Otherwise the
    launchers take the pointer path, which reads the same values (same bits)."""
    for x in tensors:
        size = x.element_size()
        if x.stride(-1) != 1 or x.data_ptr() % 16:
            return False
        if any((x.stride(i) * size) % 16 for i in range(x.dim() - 1)):
            return False
    return True


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
