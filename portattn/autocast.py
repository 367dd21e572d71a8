"""Mixed precision: q, k, v under ``torch.autocast`` go to the autocast dtype, as SDPA's do.

A model with float32 master weights hands float32 q/k/v to attention inside
``torch.autocast("cuda", dtype=torch.bfloat16)``. SDPA is on autocast's "lower precision" list:
its floating-point inputs are cast to the autocast dtype. portattn does the same, in one rule
used at two places:

* the public functions cast before their argument checks (which accept only float16 and
  bfloat16), so float32 inputs are an error outside autocast and work inside it;
* the forward op ``torch.ops.portattn.varlen_fwd`` has an autocast kernel for every device type
  that supports autocast, so a direct call of the op (or a graph that holds it) casts the same.

Only floating-point tensors on the autocast's device are cast, float64 excepted (as torch's own
autocast does: float64 stays float64 and is then rejected by the dtype check). The casts are
ordinary differentiable ``Tensor.to`` calls: gradients reach the float32 inputs in float32.
"""

from __future__ import annotations

import torch

__all__ = ["autocast_inputs", "register_autocast_kernel"]

# The device types whose autocast portattn follows: those with a kernel path (GPUs, and the CPU
# under Triton's interpreter).
_DEVICE_TYPES = ("cuda", "cpu")


def _castable(x: object, device_type: str) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.is_floating_point()
        and x.dtype is not torch.float64
        and x.device.type == device_type
    )


def _cast(tensors: tuple, device_type: str) -> tuple:
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if _castable(t, device_type) else t for t in tensors)


def autocast_inputs(*tensors: object) -> tuple:
    """``tensors`` cast to the autocast dtype of their device, when autocast is on there.

    Anything else (autocast off, non-tensors, integer or float64 tensors, tensors on another
    device) is returned as it is, for the argument checks to judge.
    """
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    if first is None or first.device.type not in _DEVICE_TYPES:
        return tensors
    return _cast(tensors, first.device.type)


def register_autocast_kernel(op: torch._library.custom_ops.CustomOpDef, n_cast: int) -> None:
    """Autocast kernels for ``op``: its first ``n_cast`` arguments follow :func:`autocast_inputs`,
    then the op runs with autocast off. torch's ``register_autocast`` casts to one dtype fixed at
    registration; this one reads the autocast dtype of the call, like SDPA."""
    for device_type in _DEVICE_TYPES:
        name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        key = getattr(torch._C.DispatchKey, name)

        def kernel(_keyset, *args, _key=key, _device_type=device_type, **kwargs):
            cast = _cast(args[:n_cast], _device_type)
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_key)):
                return op._opoverload(*cast, *args[n_cast:], **kwargs)

        op._lib.impl(op._name, kernel, name, with_keyset=True)
