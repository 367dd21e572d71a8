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

A planned launch names the arguments it passes this way (``KernelLaunch.descriptors``:
position, rows of a tile); its arguments stay tensors until the launch (``with_descriptors``),
so replays, kept templates and the direct launches bind tensors as before.
"""

from __future__ import annotations

from typing import Any

RAGGED_ROWS = 1 << 30
_OUTER = 0x7FFF0000  # 2**31 - 2**16: room for bos + seqlen and for 2**30
_LAYOUT: list = []  # the 5-d block's shared layout, made at the first call (needs Gluon)


def ragged_layout() -> Any:
    """The shared layout of a ragged descriptor's [1, 1, R, 1, D] block: 128-byte swizzled
    rows of 16-bit elements (a head dim of 64 or 128), as the kernels' 2-d tiles."""
    if not _LAYOUT:
        from triton.experimental.gluon.language import NVMMASharedLayout

        _LAYOUT.append(NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=5))
    return _LAYOUT[0]


def ragged_descriptor(x: Any, block_rows: int) -> Any:
    """The ragged host descriptor of ``x`` [tokens, heads, D] (16-byte aligned rows and
    strides, ``buffers.rows_aligned``) whose copies are [block_rows, D] tiles of one head of
    one sequence (module docstring)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    s_t, s_h, _ = x.stride()
    heads, dim = x.shape[1], x.shape[2]
    return TensorDescriptor(x, [_OUTER, _OUTER, RAGGED_ROWS, heads, dim],
                            [(1 << 34) - s_t, s_t, s_t, s_h, 1], [1, 1, block_rows, 1, dim],
                            ragged_layout())  # fmt: skip


def ragged_coordinates(bos: int, seqlen: int, row: int, head: int) -> tuple[int, ...]:
    """The coordinates of a ragged copy of rows [row, ...) of head ``head`` of the sequence
    [bos, bos + seqlen): what ``ws_common.ragged_load`` / ``ragged_store`` compute in the
    kernel (the host's statement of it, for the tests)."""
    return (RAGGED_ROWS, bos + seqlen, RAGGED_ROWS - seqlen + row, head, 0)


def ragged_arguments(kernel: Any, **block_rows: int) -> tuple[tuple[int, int], ...]:
    """``KernelLaunch.descriptors`` for the arguments of ``kernel`` named in ``block_rows``
    (name: the rows of its copies' tiles), each at its position in the kernel's signature."""
    return tuple((kernel.arg_names.index(name), rows) for name, rows in block_rows.items())


def with_descriptors(args: tuple, descriptors: tuple[tuple[int, int], ...]) -> tuple:
    """``args`` with the tensor at each (position, block rows) of ``descriptors`` passed as
    its ragged descriptor."""
    if not descriptors:
        return args
    out = list(args)
    for position, rows in descriptors:
        out[position] = ragged_descriptor(args[position], rows)
    return tuple(out)
