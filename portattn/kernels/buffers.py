"""Output allocation for the launchers.

``POISON`` is a test hook: when True, every output buffer starts filled with NaN (floating) so a
test can prove that the kernels wrote every element. It costs a fill, so it is off by default.
"""

from __future__ import annotations

import torch

POISON = False


def new_buffer(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous output buffer (NaN-filled when ``POISON`` is set)."""
    if POISON:
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)
