"""Checks of the attention functions' scalar parameters that ``validation.check_common``
runs: ``softmax_scale`` and the values of ``sinks``, with the bounds that keep the kernels' float32
arithmetic finite and accurate. Pure host checks of Python values (a tensor given for a window
is read to the host first); :mod:`portattn.validation` re-exports them with its other checks.

The bounds are far beyond what models use (scales about ``1 / sqrt(D)``, caps 30 to 50, sinks
of order 1 to 10) and far inside what float32 holds: at and past float32's range the kernels
computed all-NaN rows, and large caps lost accuracy, silently.
"""

from __future__ import annotations

import math
import numbers
import struct

# The kernels' log2(e) (kernels/forward.py LOG2E): they compute in float32 with
# ``softmax_scale`` and ``softmax_scale * LOG2E`` (scores in log2 units).
LOG2E = 1.4426950408889634
FLOAT32_TINY = 2.0**-126  # the smallest normal float32 (GPUs may flush smaller ones to 0)
# softmax_scale: the kernels' scores are ``scale * log2(e) * q.k`` in float32. With fp16 inputs
# |q.k| <= 256 * 65504**2 (about 1.1e12), so 2**16 keeps every score below 1e17, and bf16
# inputs up to 2**30 in magnitude below 2**92: float32's max is about 3.4e38 (2**128). Real
# scales are 1 / sqrt(D) or at most about 1.
SOFTMAX_SCALE_MAX = 2.0**16
# sinks: logits in natural-log units like the scaled scores; the kernels fold ``sink * log2(e)``
# into each row's running max and exp2 of differences (``primitives.fold_sink``), in float32.
# gpt-oss's sinks are of order 1 to 10.
SINK_MAX = 2.0**16


def type_name(value: object) -> str:
    """The qualified name of ``value``'s type for error messages: ``numpy.bool``,
    ``torch.Tensor``; builtins unqualified (``str``, ``NoneType``)."""
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def check_softmax_scale(softmax_scale, head_dim: int) -> float:
    """The softmax scale (None: ``1 / sqrt(head_dim)``): a real number > 0, at most 2**16
    (``SOFTMAX_SCALE_MAX``: the kernels' float32 scores ``scale * log2(e) * q.k`` stay far
    from float32's max for fp16 and bf16 inputs of any realistic size), and a normal float32
    number (at least about 1.18e-38: GPUs may flush smaller ones to 0)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type_name(softmax_scale)}")
    if not 0 < softmax_scale < math.inf:  # comparisons first: 10**400 must not overflow float()
        raise ValueError(f"softmax_scale must be a finite number > 0, got {softmax_scale}")
    if softmax_scale > SOFTMAX_SCALE_MAX:
        raise ValueError(
            f"softmax_scale must be at most 2**16 = {SOFTMAX_SCALE_MAX:g} (the default is "
            f"1 / sqrt(D)), got {softmax_scale}: the kernels compute the scores "
            f"softmax_scale * log2(e) * q.k in float32, which larger scales can overflow"
        )
    scale = float(softmax_scale)
    if _float32(scale) < FLOAT32_TINY:
        raise ValueError(
            f"softmax_scale must be a normal float32 number for the kernels, which compute "
            f"with it in float32 (at least about 1.18e-38), got {softmax_scale}"
        )
    return scale


def _float32(x: float) -> float:
    """``x`` rounded to float32 (inf beyond its range), as a kernel's float argument."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def check_sink_values(values: list[float]) -> None:
    """The values of ``sinks`` (a host copy): each finite with ``|sink| <= 2**16``
    (``SINK_MAX``), or ``-inf`` (no sink for that head); NaN, ``+inf`` and larger magnitudes
    are a ValueError (the kernels' float32 fold computed NaN rows from them)."""
    for h, sink in enumerate(values):
        if sink == -math.inf:
            continue
        if not -SINK_MAX <= sink <= SINK_MAX:  # NaN fails too
            raise ValueError(
                f"sinks[{h}] must be -inf (no sink) or finite with |sinks[{h}]| <= 2**16 = "
                f"{SINK_MAX:g}, got {sink}: the kernels fold sink * log2(e) into each row's "
                f"softmax in float32"
            )
