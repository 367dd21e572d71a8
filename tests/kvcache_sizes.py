"""The sizes of the flash_attn_with_kvcache tests (tests/test_kvcache.py,
tests/test_kvcache_errors.py): bfloat16 at d128 and real lengths on the GPU, float16 at d32 and
short lengths under the CPU interpreter."""

from __future__ import annotations

import torch
from helpers import HAS_GPU

if HAS_GPU:
    DTYPE, HQ, HKV, D = torch.bfloat16, 8, 2, 128
    LENS = [1, 17, 1000, 8192, 513, 64, 63, 4099]
    PAGE_SIZES = (16, 64, 256)
else:
    DTYPE, HQ, HKV, D = torch.float16, 4, 2, 32
    LENS = [1, 17, 63, 40, 5]
    PAGE_SIZES = (16, 32)
APPENDS = (1, 4, 16)
