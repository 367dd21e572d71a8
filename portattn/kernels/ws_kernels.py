"""The warp-specialised Gluon kernels, imported in one place for the forward, decode and backward
planners, with each kernel's ``supports`` rule and ``ws_launch_options`` (the decode's: its
module, ``decode_ws``).

They need Gluon's Hopper API as of Triton 3.6 (``ws_common``'s version gate); with an older
Triton every name here is None and the Triton kernels run always (an entry that selects a
Gluon kernel then raises, ``plan.gluon_applies``).
"""

from __future__ import annotations

try:  # Gluon's Hopper API as of Triton 3.6
    from portattn.kernels import decode_ws
    from portattn.kernels.backward_ws import attn_bwd_dkdv_ws_kernel, dkdv_ws_supports
    from portattn.kernels.dq_ws import attn_bwd_dq_ws_kernel, dq_ws_supports
    from portattn.kernels.forward_ws import attn_fwd_ws_kernel, ws_supports
    from portattn.kernels.ws_common import ws_launch_options
except ImportError:
    attn_fwd_ws_kernel = ws_supports = ws_launch_options = None
    attn_bwd_dkdv_ws_kernel = dkdv_ws_supports = None
    attn_bwd_dq_ws_kernel = dq_ws_supports = None
    decode_ws = None

__all__ = [
    "attn_bwd_dkdv_ws_kernel",
    "attn_bwd_dq_ws_kernel",
    "attn_fwd_ws_kernel",
    "decode_ws",
    "dkdv_ws_supports",
    "dq_ws_supports",
    "ws_launch_options",
    "ws_supports",
]
