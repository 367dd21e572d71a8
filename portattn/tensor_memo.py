"""Values derived from index tensors, made once per tensor version: ``validation.host_values``
(their host copies), the results of the value checks, and the device tensors
``flash_attn_with_kvcache`` derives.

A decode step calls ``flash_attn_with_kvcache`` once per layer with the same ``cache_seqlens``
(and ``block_table``) tensor, bumped in place once per step (rollout engines, transformers'
caches). What the call derives from them (``cu_seqlens_k``, the append's cache slots) is then the
same for every layer: :func:`derived` makes it at the step's first call and hands the same
tensors to the others, saving the aten ops (each costs 12-50 µs of host time on a GPU host).

An entry is reused only for the same tensors (identity, through a weak reference, so a new
tensor at a recycled ``id`` misses), at the same version counter and data pointer (any in-place
PyTorch op, ``set_`` or a write through a view bumps the counter), with the same other inputs
(``extra``; for a device tensor the device and the current stream: one made on a stream is
read only on that one, after its making, in stream order). Dropping an entry frees its tensors
to the caching allocator, which hands their memory out again on the same stream only, after the
reads already queued there. Inference tensors have no version counter and are never memoized;
a tensor written behind PyTorch's back (a custom kernel writing through its data pointer,
``.data``, a CUDA-graph replay) keeps its old entry: call ``validation.forget_host_values()``
(which clears these too) after such a write. Never used while a CUDA graph is captured (the
capture must record the ops: the callers pass ``use=False``) or while ``torch.compile`` traces.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

# (tag, *ids of the tensors, *extra) -> (weak references, (version, data pointer) per tensor,
# value). The key has no version: a step's new version replaces its previous entry.
_DERIVED: dict[tuple, tuple[list, list, object]] = {}
_DERIVED_MAX = 256


def stream_key(device: torch.device) -> int | None:
    """The current stream of ``device`` (None off CUDA): part of every key whose value is a
    device tensor, so it is read only on the stream it was made on."""
    if device.type != "cuda":
        return None
    return _raw_stream(torch.cuda.current_device() if device.index is None else device.index)


# The current stream's handle without a torch.cuda.Stream object per call (Triton's launch
# path reads it the same way); torch.cuda.current_stream where torch lacks the raw getter.
def _stream_of(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _stream_of)


def derived(
    tag: str,
    tensors: tuple[torch.Tensor | None, ...],
    extra: tuple,
    make: Callable[[], T],
    use: bool = True,
) -> T:
    """``make()``, or what it returned for the same ``tag``, the same ``tensors`` (None allowed)
    at the same versions and data pointers, and equal ``extra``. ``use`` False (CUDA-graph
    capture) or while tracing: always ``make()``, nothing kept."""
    if not use or torch.compiler.is_compiling():
        return make()
    key, stamps, hit = _lookup(tag, tensors, extra)
    if hit is not None:
        return hit[2]
    value = make()
    if key is None:  # an inference tensor: no version counter, no reuse
        return value
    if len(_DERIVED) >= _DERIVED_MAX:
        _DERIVED.clear()
    refs = [None if t is None else weakref.ref(t) for t in tensors]
    _DERIVED[key] = (refs, stamps, value)
    return value


def is_derived(tag: str, tensors: tuple[torch.Tensor | None, ...], extra: tuple) -> bool:
    """Whether :func:`derived` holds a value for these arguments (so it would not call
    ``make``); False while tracing."""
    return not torch.compiler.is_compiling() and _lookup(tag, tensors, extra)[2] is not None


def _lookup(tag: str, tensors: tuple, extra: tuple) -> tuple:
    """(key, stamps, the kept entry or None) of :func:`derived`'s arguments; key None for an
    inference tensor (no version counter: never kept)."""
    try:
        stamps = [None if t is None else (t._version, t.data_ptr()) for t in tensors]
    except RuntimeError:
        return None, None, None
    key = (tag, *map(id, tensors), *extra)
    hit = _DERIVED.get(key)
    if hit is not None and hit[1] == stamps and _alive(hit[0], tensors):
        return key, stamps, hit
    return key, stamps, None


def once_per_version(tag: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A function of positional arguments made :func:`derived`: its result is kept per version
    of its tensor arguments and value of the others (which must be hashable), so a call like
    the last one returns that result without running. For checks: one that raises keeps
    nothing, and runs again on the next call."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        def split(args: tuple) -> tuple[tuple, tuple]:
            # The tensors by identity and version, the other values as they are; a tensor's
            # place among the values is marked, so the key is unambiguous.
            tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
            if not tensors:
                return tensors, args
            return tensors, tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in args)

        @functools.wraps(fn)
        def kept(*args):
            tensors, values = split(args)
            return derived(tag, tensors, values, lambda: fn(*args))

        def ran(*args) -> bool:
            """Whether a call with these arguments returns a kept result (for a check: it
            passed for these versions and values) without running."""
            return is_derived(tag, *split(args))

        kept.ran = ran
        return kept

    return decorate


_TENSOR = object()  # once_per_version's mark of a tensor's place among the values


def _alive(refs: list, tensors: tuple) -> bool:
    """Whether the references still point at ``tensors`` (not at none, or a tensor since
    made at a recycled id)."""
    for ref, t in zip(refs, tensors):
        if (t is not None) if ref is None else ref() is not t:
            return False
    return True


def forget_derived() -> None:
    """Drop every memoized tensor (:func:`derived`): the next calls make them again."""
    _DERIVED.clear()


# Ramps ``0, step, 2 * step, ...`` (int32) by (length, step, device, stream): cu_seqlens of
# equal sequences (dense calls, a decode batch's queries) and the default cache rows are the
# same few per model, made once in eager mode instead of by two aten ops a call. They are only
# ever read. Keyed by stream, a ramp is read only after its own making, in stream order. Once
# full, the oldest is dropped for a new one (a transformers cache that grows by a token a step
# needs a new cu_seqlens_k ramp each step; keeping none past 256 steps cost every layer's call
# two aten ops): its memory goes back to the caching allocator, which reuses it only in its
# stream's order, after the kernels already queued there that read it. While a CUDA graph is
# captured (or torch.compile traces) they are made anew.
_RAMPS: dict[tuple, torch.Tensor] = {}
_RAMPS_MAX = 256


def ramp(length: int, step: int, device: torch.device, capturing: bool) -> torch.Tensor:
    """``arange(length) * step`` as int32 on ``device``, kept per stream (read only there,
    after its making); while a CUDA graph is captured or ``torch.compile`` traces (
    ``capturing``), made and not kept."""
    if capturing:  # nothing read from or written to the kept ones (a trace would guard on them)
        return _make_ramp(length, step, device)
    key = (length, step, device, stream_key(device))
    kept = _RAMPS.get(key)
    if kept is None:
        kept = _make_ramp(length, step, device)
        if len(_RAMPS) >= _RAMPS_MAX:
            del _RAMPS[next(iter(_RAMPS))]  # the oldest (dicts keep insertion order)
        _RAMPS[key] = kept
    return kept


def _make_ramp(length: int, step: int, device: torch.device) -> torch.Tensor:
    """``arange(length) * step`` in int32 by one kernel where its values fit int32 (a CUDA
    graph of a decode step replays each kernel of each layer's call: a tiny kernel costs about
    as much GPU time as the next), else by two, whose product wraps as int32 arithmetic does."""
    if step == 0:
        return torch.zeros(length, dtype=torch.int32, device=device)
    if step > 0 and length * step < 2**31:
        return torch.arange(0, length * step, step, dtype=torch.int32, device=device)
    return torch.arange(length, dtype=torch.int32, device=device) * step
