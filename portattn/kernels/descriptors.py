"""Host-made ragged TMA descriptors for the Gluon kernels (Hopper; perf-notes row 103).

A Gluon kernel that copies tiles by TMA needs a descriptor of each tensor it reads. Made in
every program (``tma.make_tensor_descriptor``), each costs a 128-byte tensormap written to
global memory and a proxy fence before the first copy; made here once per launch, it is a
kernel parameter. A descriptor of the whole packed tensor would read the next sequence's rows
past a sequence's end, where the per-sequence ones read 0 (and so keep a row's bits from
another sequence's values, NaN or inf included). triton/tools/ragged_tma.py's construction
keeps that: ``ragged_descriptor`` describes ``x`` [tokens, heads, D] as 5-d, [2**31 - 2**16,
2**31 - 2**16, 2**30, heads, D] with strides [2**34 - s, s, s, s_h, 1] (s: the token stride),
and a copy of rows [row, row + R) of the sequence [bos, bos + seqlen) names coordinates
[2**30, bos + seqlen, 2**30 - seqlen + row, head, 0] (``ws_common.ragged_load``): the address
wraps modulo 2**64 to row bos + row, and the row coordinate reaches 2**30, out of bounds, at the
sequence's end, where the copy reads 0 and a store writes nothing.

The ``tl`` kernels (the Triton forward, ``addressing.ragged_source``) take the same construction
with the head first, [heads, 2**31 - 2**16, 2**31 - 2**16, 2**30, D] with strides [s_h, 2**34
- s, s, s, 1] (``ragged_tl_descriptor``): their [1, 1, 1, R, C] block reshaped to [R, C] is
then a view of the copy's shared tile, which the matrix instructions read in place; with the
head between the rows and the columns, as in the Gluon layout, Triton moves both operands
through registers (``ci/ragged_tl_probe.py``). C may pass D (a d96 head read as 128 columns):
the copy reads 0 there.

A planned launch names the arguments it passes this way (``KernelLaunch.descriptors``: one
``HostDescriptor`` each); its arguments stay tensors until the launch (``with_descriptors``),
so replays, kept templates and the direct launches bind tensors as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

RAGGED_ROWS = 1 << 30
# The value of a ``tl`` kernel's ``TMA`` flag where it takes ragged host descriptors
# (``addressing.TMA_HOST``).
TMA_HOST = 2
_OUTER = 0x7FFF0000  # 2**31 - 2**16: room for bos + seqlen and for 2**30
_LAYOUT: list = []  # the 5-d block's shared layout, made at the first call (needs Gluon)


def ragged_layout() -> Any:
    """The shared layout of a ragged descriptor's [1, 1, R, 1, D] block: 128-byte swizzled
    rows of 16-bit elements (a head dim of 64 or 128), as the kernels' 2-d tiles."""
    if not _LAYOUT:
        from triton.experimental.gluon.language import NVMMASharedLayout

        _LAYOUT.append(NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=5))
    return _LAYOUT[0]


_MADE: dict[tuple, dict] = {}  # (class, block shape, dtype) -> fields Triton's checks made
_CLASSES: dict[str, Any] = {}  # "gluon" / "tl" -> Triton's descriptor class, imported once


def _descriptor_class(kind: str) -> Any:
    cls = _CLASSES.get(kind)
    if cls is None:
        if kind == "gluon":
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        else:
            from triton.tools.tensor_descriptor import TensorDescriptor
        cls = _CLASSES[kind] = TensorDescriptor
    return cls


def _descriptor(
    cls: Any, x: Any, s_t: int, s_h: int, shape: list, strides: list, block: list, *rest: Any
) -> Any:
    """``cls(x, shape, strides, block, *rest)``: Triton's checked constructor the first time
    per class, block shape and dtype, then a copy of that descriptor with ``x``, ``shape`` and
    ``strides`` put in, where the checks that depend on them hold (``x``'s address and its
    token and head strides ``s_t``, ``s_h`` 16-byte aligned; the other strides follow from
    them): about half the host time per tensor and launch (a launch passes three or four).
    Where they do not hold, the constructor raises as before."""
    key = (cls, tuple(block), x.dtype)
    fields = _MADE.get(key)
    if fields is None or (x.data_ptr() | (s_t | s_h) * x.element_size()) % 16:
        made = cls(x, shape, strides, block, *rest)
        # its fields without the tensor (kept here, it would outlive the call)
        _MADE.setdefault(key, dict(made.__dict__, base=None, shape=None, strides=None))
        return made
    copy = object.__new__(cls)
    copy.__dict__.update(fields, base=x, shape=shape, strides=strides)
    return copy


def ragged_descriptor(x: Any, block_rows: int, block_cols: int = 0) -> Any:
    """The ragged host descriptor of ``x`` [tokens, heads, D] (16-byte aligned rows and
    strides, ``buffers.rows_aligned``) whose copies are [block_rows, D] tiles of one head of
    one sequence (module docstring); [block_rows, block_cols] tiles where given. A paged cache
    [num_pages, page_size, heads, D] whose pages lie one after the other (``pages_contiguous``)
    is described as its token rows (page p's rows from p * page_size on)."""
    s_t, s_h, _ = x.stride()[-3:]
    heads, dim = x.shape[-2:]
    return _descriptor(_descriptor_class("gluon"), x, s_t, s_h,
                       [_OUTER, _OUTER, RAGGED_ROWS, heads, dim],
                       [(1 << 34) - s_t, s_t, s_t, s_h, 1],
                       [1, 1, block_rows, 1, block_cols or dim], ragged_layout())  # fmt: skip


def pages_contiguous(x: Any) -> bool:
    """Whether a paged cache [num_pages, page_size, heads, D]'s pages lie one after the other,
    so its token rows have one stride (what ``ragged_descriptor`` describes)."""
    return x.stride(0) == x.shape[1] * x.stride(1)


def ragged_tl_descriptor(x: Any, block_rows: int, block_cols: int) -> Any:
    """The head-first ragged host descriptor of ``x`` [tokens, heads, D] for a ``tl`` kernel
    (module docstring), whose copies are [block_rows, block_cols] tiles of one head of one
    sequence (``addressing.ragged_tile``)."""
    s_t, s_h, _ = x.stride()
    _, heads, dim = x.shape
    return _descriptor(_descriptor_class("tl"), x, s_t, s_h,
                       [heads, _OUTER, _OUTER, RAGGED_ROWS, dim],
                       [s_h, (1 << 34) - s_t, s_t, s_t, 1],
                       [1, 1, 1, block_rows, block_cols])  # fmt: skip


def ragged_coordinates(bos: int, seqlen: int, row: int, head: int) -> tuple[int, ...]:
    """The coordinates of a ragged copy of rows [row, ...) of head ``head`` of the sequence
    [bos, bos + seqlen): what ``ws_common.ragged_load`` / ``ragged_store`` compute in the
    kernel (the host's statement of it, for the tests)."""
    return (RAGGED_ROWS, bos + seqlen, RAGGED_ROWS - seqlen + row, head, 0)


class HostDescriptor(NamedTuple):
    """An argument of a planned launch that its kernel takes as a ragged host descriptor: the
    argument's position in the kernel's signature, and its copies' tiles: ``rows``, and
    ``cols`` for a ``tl`` kernel (``ragged_tl_descriptor``; 0: a Gluon kernel's,
    ``ragged_descriptor``, whose tiles span the head dim or ``gluon_cols`` columns)."""

    position: int
    rows: int
    cols: int = 0
    gluon_cols: int = 0


def host_descriptor(x: Any, spec: HostDescriptor) -> Any:
    """The descriptor ``spec`` names, of the tensor ``x``."""
    if spec.cols:
        return ragged_tl_descriptor(x, spec.rows, spec.cols)
    return ragged_descriptor(x, spec.rows, spec.gluon_cols)


def ragged_arguments(
    kernel: Any, gluon_cols: int = 0, **tiles: int | tuple[int, int]
) -> tuple[HostDescriptor, ...]:
    """``KernelLaunch.descriptors`` for the arguments of ``kernel`` named in ``tiles`` (name:
    its copies' tile rows for a Gluon kernel, (rows, cols) for a ``tl`` kernel), each at its
    position in the kernel's signature; ``gluon_cols``: a Gluon kernel's copies' columns (0:
    the head dim)."""
    specs = []
    for name, tile in tiles.items():
        rows, cols = tile if isinstance(tile, tuple) else (tile, 0)
        specs.append(HostDescriptor(kernel.arg_names.index(name), rows, cols, gluon_cols))
    return tuple(specs)


def with_descriptors(args: tuple, descriptors: tuple[HostDescriptor, ...]) -> tuple:
    """``args`` with the tensor at each of ``descriptors``' positions passed as that
    descriptor."""
    if not descriptors:
        return args
    out = list(args)
    for spec in descriptors:
        out[spec.position] = host_descriptor(args[spec.position], spec)
    return tuple(out)
