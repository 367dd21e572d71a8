"""portattn: portable, bitwise-deterministic attention kernels in Triton.

``import portattn`` does no GPU work and reads no configuration; both happen at first call.
"""

from portattn.attention import attention, varlen_attention
from portattn.families import family

__version__ = "0.1.0"

__all__ = ["attention", "family", "varlen_attention", "__version__"]
