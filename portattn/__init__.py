"""portattn: portable, bitwise-deterministic attention kernels in Triton.

``import portattn`` does no GPU work and reads no configuration; both happen at first call.
Importing it registers the custom ops ``torch.ops.portattn.varlen_fwd`` / ``varlen_bwd``.
"""

from portattn.api import attention, varlen_attention
from portattn.families import family
from portattn.flash_compat import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from portattn.merge import merge_attention_states
from portattn.validation import CacheIndexError

__version__ = "0.1.0"

__all__ = [
    "CacheIndexError",
    "attention",
    "family",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "merge_attention_states",
    "varlen_attention",
    "__version__",
]
