"""One attention call's options, checked once: :class:`AttentionOptions` and
:func:`check_options`, the one function that builds it from the public arguments.

Every entry point (``varlen_attention``, ``attention``, ``flash_attn_with_kvcache``, and through
them the flash-attn and transformers adapters) calls :func:`check_options`; from there down the
record travels whole: into the forward entry (:mod:`portattn.forward_entry`), across the custom
ops (whose schemas name its fields one by one, :mod:`portattn.ops`) and into the planner's
``VarlenProblem``. Its field names are the ops' argument names, so the ops bind them by name.
A new keyword becomes a field here and a check in :func:`check_options` (design, "Adding a
parameter").
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import NamedTuple, TypeVar

import torch

from portattn.configs import interpreter_active
from portattn.kernels.primitives import Features
from portattn.validation import check_common, check_sinks
from portattn.validation_params import type_name

T = TypeVar("T")

WINDOW_MAX = 2**30 - 1  # window bounds stay far from int32 overflow in the kernels' positions
# softcap: tanh(u) = 1 - 2 / (exp(2u) + 1) in float32 has an absolute error of about 2**-24,
# which the cap multiplies into the score: about softcap * 2**-23 (1.2e-4 at 2**10, below fp16's
# own rounding of p; 1e6 gave 2.9e-2 relative output error). Gemma 2 caps at 50, Grok at 30.
SOFTCAP_MAX = 2.0**10
# The kernels multiply raw scores by ``2 * softmax_scale * log2(e) / softcap`` in float32: at
# 2**-16 and the largest scale that is about 1.2e10, finite (below ~6e-34 it was inf, and a
# score of 0 became NaN). A cap that small makes every score about 0 anyway.
SOFTCAP_MIN = 2.0**-16


class CallScalars(NamedTuple):
    """A call's options as its caller gave them, before any check (``flash_attn_with_kvcache``
    hands them to :mod:`portattn.kvcache` in this record; :func:`checked_options` keys its
    records on them). Named as :func:`checked_options`' arguments."""

    causal: object
    softmax_scale: object
    return_lse: object
    kernel: object
    window_size: object
    softcap: object


@dataclass(frozen=True)
class AttentionOptions:
    """What one call asks of the kernels besides its tensors' shapes, checked and normalized.

    ``window_left`` / ``window_right``: the window's one spelling below validation,
    flash-attn's ``window_size`` as :func:`check_window` normalizes
    it (-1: unbounded on that side; with ``causal`` the right side is -1, the causal mask bounds
    it). ``softcap``: 0.0 (off) or the cap ``c`` of the scores ``c * tanh(s / c)``. ``sinks``:
    None, or float32 [Hq] contiguous (a tensor: equality and hashing see whether it is there,
    not its values)."""

    causal: bool
    softmax_scale: float
    kernel: str = "varlen"
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sinks: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def _identity(self) -> tuple:
        # Two records that differ only in having sinks run different kernels: a cache keyed on
        # the record must tell them apart, without comparing tensors. Made once per record
        # (frozen): the plan cache hashes the record on every call.
        identity = self.__dict__.get("_identity_tuple")
        if identity is None:
            identity = (*(getattr(self, f.name) for f in _COMPARED), self.has_sinks)
            object.__setattr__(self, "_identity_tuple", identity)
        return identity

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def windowed(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def has_sinks(self) -> bool:
        return self.sinks is not None

    def kernel_flags(self) -> dict[str, Features]:
        """The optional features' compile-time parameter of every Triton kernel that computes
        scores, one :class:`~portattn.kernels.primitives.Features` record (its off values
        compile to the code of kernels without them); the sinks, a tensor, are the kernels'
        ``HAS_SINK`` beside their tensor."""
        flags = self.__dict__.get("_kernel_flags")  # made once per record (frozen)
        if flags is None:
            flags = dict(FEATURES=Features(self.window_left, self.window_right, self.softcap))
            object.__setattr__(self, "_kernel_flags", flags)
        return flags

    @property
    def any_feature(self) -> bool:
        """Whether an optional feature is on: their kernel flags are off (and the
        warp-specialised Gluon kernels, which have none, may run) otherwise."""
        return self.windowed or self.softcap != 0 or self.has_sinks


_COMPARED = tuple(f for f in fields(AttentionOptions) if f.compare)


def capturing(q: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on q's stream: the host values of ``cu_seqlens``
    are out of reach then (a device-to-host copy is an error there, and would be frozen into
    the graph), as while ``torch.compile`` traces (reading them would break the graph)."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_options(q, k, v, **arguments) -> AttentionOptions:
    """The record of :func:`checked_options` (its arguments by name)."""
    return checked_options(q, k, v, **arguments).options


class CheckedOptions(NamedTuple):
    """:func:`check_options`' record with the dict its call signature keeps the forward's
    launches in (``forward_entry.run_kept_forward``); ``kept`` None where the signature is not
    kept (sinks, traced, an argument of a kind it does not hold)."""

    options: AttentionOptions
    kept: dict | None


def checked_options(
    q,
    k,
    v,
    *,
    causal,
    softmax_scale,
    return_lse,
    kernel,
    window_size,
    softcap,
    sinks=None,
    token_dims: int,
    kv_token_dims: int | None = None,
    compiling: bool,
) -> CheckedOptions:
    """The checks every entry point runs on its tensors and options, in this order (each
    raises ValueError / TypeError before any launch): ``check_common`` (tensors, dims, dtypes,
    devices, the flags, the kernel, the scale), ``check_window``, ``check_softcap``,
    ``check_sinks`` (its values from a host copy unless ``compiling`` or :func:`capturing`).
    ``compiling``: ``torch.compiler.is_compiling()`` read in the entry point's own frame (a
    helper's frame may be compiled alone when Dynamo runs its caller eagerly, and reads True
    there while its caller runs eagerly). ``token_dims``: q's
    leading dims (1 packed, 2 dense), whose next dim is its heads; ``kv_token_dims``: k/v's
    where they differ (2: paged caches). ``return_lse`` is only checked (a bool or numpy bool):
    the caller keeps ``bool(return_lse)``. Returns the record with the dict of launches its
    call signature keeps (:class:`CheckedOptions`)."""
    scalars = CallScalars(causal, softmax_scale, return_lse, kernel, window_size, softcap)
    if compiling or sinks is not None:  # traced: Dynamo would guard on the kept records
        options = _check(q, k, v, scalars, sinks, token_dims, kv_token_dims, compiling)
        return CheckedOptions(options, None)
    key = options_signature(q, k, v, scalars, token_dims, kv_token_dims)
    record = None if key is None else _CHECKED.get(key)
    if record is None:  # as kept_record, without a closure on this path of every new signature
        options = _check(q, k, v, scalars, sinks, token_dims, kv_token_dims, compiling)
        record = CheckedOptions(options, None if key is None else {})
        if key is not None:
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.clear()
            _CHECKED[key] = record
    return record


def kept_record(table: dict, key: tuple | None, check: Callable[[], T], most: int = 1024) -> T:
    """The record ``check()`` made for a call of signature ``key``, kept in ``table``: a call
    like one that passed its checks passes them again, with the same record. ``key`` None (a
    call of a kind not kept): ``check()`` runs every time. A check that raises keeps nothing;
    past ``most`` signatures the table starts again."""
    record = table.get(key)  # None is never a key
    if record is None:
        record = check()
        if key is not None:
            if len(table) >= most:
                table.clear()
            table[key] = record
    return record


# check_options' records by call signature (no sinks, not traced): a call like one that passed
# the checks passes them again, with the same record.
_CHECKED: dict[tuple, CheckedOptions] = {}
_CHECKED_MAX = 1024
# Tensors with nothing to redispatch to (Parameter: a Tensor with no __torch_function__)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_TYPES = frozenset(PLAIN_TENSORS)
_KEYED_SCALARS = frozenset((bool, int, float, str, type(None)))  # not tensors or arrays


def options_signature(
    q, k, v, scalars: CallScalars, token_dims: int, kv_token_dims
) -> tuple | None:
    """What the checks of :func:`check_options` read when there are no sinks, or None for an
    argument of a kind it does not hold (the checks then run): each tensor's type, shape,
    strides, dtype and device; each scalar's (the window's two sides) type and value; the
    interpreter setting."""
    window_size = scalars.window_size
    if type(window_size) is not tuple:
        return None
    scalars = scalars[:4] + scalars[5:] + window_size
    types = tuple(map(type, scalars))
    if not _KEYED_SCALARS.issuperset(types):
        return None
    if not _PLAIN_TYPES.issuperset((type(q), type(k), type(v))):
        return None
    layout = (
        (type(q), q.shape, q.stride(), q.dtype, q.device),
        (type(k), k.shape, k.stride(), k.dtype, k.device),
        (type(v), v.shape, v.stride(), v.dtype, v.device),
    )
    return (layout, types, scalars, token_dims, kv_token_dims, interpreter_active())


def _check(
    q, k, v, scalars: CallScalars, sinks, token_dims: int, kv_token_dims, compiling: bool
) -> AttentionOptions:
    """The checks of :func:`check_options`, in its order; returns its record."""
    causal, softmax_scale, return_lse, kernel = scalars[:4]
    scale = check_common(
        q, k, v, causal, softmax_scale, return_lse, kernel, token_dims, kv_token_dims
    )
    causal, window_left, window_right = check_window(scalars.window_size, bool(causal))
    traced = compiling or capturing(q)
    return AttentionOptions(
        causal=causal,
        softmax_scale=scale,
        kernel=kernel,
        window_left=window_left,
        window_right=window_right,
        softcap=check_softcap(scalars.softcap),
        sinks=check_sinks(sinks, q.shape[token_dims], q.device, check_values=not traced),
    )


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
