"""Checks of the attention functions' scalar parameters: ``window_size``, ``softcap``,
``softmax_scale`` and the values of ``sinks``, with the bounds that keep the kernels' float32
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
import sys

import torch

# The kernels' log2(e) (kernels/forward.py LOG2E): they compute in float32 with
# ``softmax_scale`` and ``softmax_scale * LOG2E`` (scores in log2 units).
LOG2E = 1.4426950408889634
FLOAT32_TINY = 2.0**-126  # the smallest normal float32 (GPUs may flush smaller ones to 0)
WINDOW_MAX = 2**30 - 1  # window bounds stay far from int32 overflow in the kernels' positions
# softmax_scale: the kernels' scores are ``scale * log2(e) * q.k`` in float32. With fp16 inputs
# |q.k| <= 256 * 65504**2 (about 1.1e12), so 2**16 keeps every score below 1e17, and bf16
# inputs up to 2**30 in magnitude below 2**92: float32's max is about 3.4e38 (2**128). Real
# scales are 1 / sqrt(D) or at most about 1.
SOFTMAX_SCALE_MAX = 2.0**16
# softcap: tanh(u) = 1 - 2 / (exp(2u) + 1) in float32 has an absolute error of about 2**-24,
# which the cap multiplies into the score: about softcap * 2**-23 (1.2e-4 at 2**10, below fp16's
# own rounding of p; 1e6 gave 2.9e-2 relative output error). Gemma 2 caps at 50, Grok at 30.
SOFTCAP_MAX = 2.0**10
# The kernels multiply raw scores by ``2 * softmax_scale * log2(e) / softcap`` in float32: at
# 2**-16 and the largest scale that is about 1.2e10, finite (below ~6e-34 it was inf, and a
# score of 0 became NaN). A cap that small makes every score about 0 anyway.
SOFTCAP_MIN = 2.0**-16
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


def _is_numpy_array(value) -> bool:
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be a numpy array
    return numpy is not None and isinstance(value, numpy.ndarray)


def _window_sides(window_size) -> list:
    """The two sides of ``window_size`` as given: a tuple or list of two, or a 1-D integer
    tensor / numpy array of two elements (flash-attn's tests pass
    ``torch.randint(0, seqlen_k, (2,))``), read to the host with ``tolist()``."""
    if isinstance(window_size, torch.Tensor) or _is_numpy_array(window_size):
        dtype = window_size.dtype
        integer = (
            not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool
            if isinstance(window_size, torch.Tensor)
            else dtype.kind in "iu"
        )
        if not integer:
            raise TypeError(
                f"window_size must hold integers, got a {type_name(window_size)} of dtype {dtype}"
            )
        if tuple(window_size.shape) != (2,):
            raise ValueError(
                f"window_size as a tensor must be 1-D with 2 elements (left, right), got shape "
                f"{tuple(window_size.shape)}"
            )
        return window_size.tolist()  # a GPU tensor: one device-to-host copy (a sync)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right), got {window_size!r}")
    return list(window_size)


def _window_int(side: str, value) -> int:
    """One side: an int or numpy integer, or a 0-d integer tensor (read with ``int()``);
    never a bool."""
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
        if value.dim() != 0 or dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
            raise TypeError(
                f"window_size {side} must be an int or a 0-d integer tensor, got a tensor of "
                f"dtype {dtype} and shape {tuple(value.shape)}"
            )
        return int(value)  # a GPU tensor: one device-to-host copy (a sync)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"window_size {side} must be an int, got {type_name(value)}")
    return int(value)


def check_window(window_size, causal: bool) -> tuple[bool, int, int]:
    """flash-attn's ``window_size=(left, right)``: query row ``i`` of a sequence sees keys
    ``j`` with ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded.
    Returns ``(causal, left, right)`` normalized as flash-attn does: with ``causal`` the right
    side is 0, which the causal mask already is, so ``right`` becomes -1; a right side of 0
    without ``causal`` is causal (``(-1, 0)`` is plain causal attention).

    Accepted as flash-attn accepts it: a tuple or list of two ints (numpy integers and 0-d
    integer tensors too), or a 1-D integer tensor (or numpy array) of two elements. Each side
    is -1 or from 0 to 2**30 - 1 (ValueError otherwise); bools, floats and float tensors are a
    TypeError. A tensor is read to the host (``int()`` / ``tolist()``): for a GPU tensor that
    is a device-to-host copy, which waits for the GPU, as flash-attn's own conversion does
    (and under ``torch.compile`` a graph break): pass Python ints where it matters."""
    pair = type(window_size) is tuple and len(window_size) == 2
    if pair and type(window_size[0]) is int and type(window_size[1]) is int:  # (no bool)
        sides = list(window_size)  # the usual spelling, taken as it is
    else:
        sides = [_window_int(s, v) for s, v in zip(("left", "right"), _window_sides(window_size))]
    for side, value in zip(("left", "right"), sides):
        if not -1 <= value <= WINDOW_MAX:
            raise ValueError(
                f"window_size {side} must be -1 (unbounded) or from 0 to {WINDOW_MAX}, got {value}"
            )
    left, right = sides
    if causal or right == 0:
        return True, left, -1
    return False, left, right


def check_softcap(softcap) -> float:
    """``softcap``: None or 0 (off), or a cap ``c`` of the scores ``c * tanh(s / c)`` from
    2**-16 to 2**10 = 1024 (a real number, not a bool: TypeError; negative, NaN, infinite or
    outside those bounds: ValueError, see ``SOFTCAP_MAX`` / ``SOFTCAP_MIN`` for why). portattn's
    own functions default to None: under ``torch.compile(dynamic=True)`` Dynamo makes a float
    default a symbolic input, and its specialization then restarts the trace."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type_name(softcap)}")
    # Comparisons only (no math.isfinite, no float() first): traceable by Dynamo, and an int
    # beyond float64 (10**400) compares instead of raising OverflowError.
    if not 0 <= softcap < math.inf:
        raise ValueError(f"softcap must be 0 (off) or a finite float > 0, got {softcap}")
    if softcap == 0:
        return 0.0
    if softcap > SOFTCAP_MAX:
        raise ValueError(
            f"softcap must be at most 2**10 = {SOFTCAP_MAX:g} (Gemma 2 uses 50), got "
            f"{softcap}: the kernels' float32 tanh has an absolute error of about 2**-24, "
            f"which the cap turns into a score error of about softcap * 2**-23"
        )
    if softcap < SOFTCAP_MIN:
        raise ValueError(
            f"softcap must be at least 2**-16 (about 1.5e-5), got {softcap}: the kernels "
            f"scale the scores by 2 * softmax_scale * log2(e) / softcap in float32"
        )
    return float(softcap)


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
