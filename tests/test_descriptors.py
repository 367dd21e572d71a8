"""portattn.kernels.descriptors: the ragged host descriptors of the Gluon kernels (perf-notes
row 103) and of the Triton forward (row 106). CPU: their shapes and strides, and that a copy's
coordinates address the sequence's own rows and run out of bounds exactly at its end (modulo
2**64, as the copy engine computes addresses); the kernels' copies through them are tested
bitwise on the GPU (tests/test_ws_variants.py: the Gluon kernels against the Triton ones,
the descriptor paths against the pointer path) and, for the Triton forward, under the
interpreter too."""

from __future__ import annotations

import weakref

import pytest
import torch

from portattn.kernels import descriptors
from portattn.kernels.descriptors import (
    RAGGED_ROWS,
    HostDescriptor,
    ragged_coordinates,
    ragged_descriptor,
    ragged_tl_descriptor,
    with_descriptors,
)

pytest.importorskip("triton.experimental.gluon.nvidia.hopper")


def packed_qkv(tokens: int, heads: int, dim: int) -> tuple[torch.Tensor, ...]:
    """q, k, v as views of one [tokens, 3, heads, dim] buffer (strided rows, as a fused
    projection gives them)."""
    qkv = torch.randn(tokens, 3, heads, dim, dtype=torch.bfloat16)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


def test_descriptor_describes_the_whole_tensor_in_five_dims():
    q, _, _ = packed_qkv(300, 4, 128)
    desc = ragged_descriptor(q, 64)
    s_t, s_h = q.stride(0), q.stride(1)
    assert desc.base is q
    assert list(desc.block_shape) == [1, 1, 64, 1, 128]
    assert list(desc.strides) == [2**34 - s_t, s_t, s_t, s_h, 1]
    assert list(desc.shape)[2:] == [RAGGED_ROWS, 4, 128]
    assert desc.layout.rank == 5 and desc.layout.swizzle_byte_width == 128


def test_tl_descriptor_puts_the_head_first():
    """The ``tl`` kernels' descriptor: the head first, so the block's unit dims all lead (its
    reshape to 2-d is a view, ``ci/ragged_tl_probe.py``); its tiles may be wider than D."""
    q, _, _ = packed_qkv(300, 4, 96)
    desc = ragged_tl_descriptor(q, 64, 128)
    s_t, s_h = q.stride(0), q.stride(1)
    assert desc.base is q
    assert list(desc.block_shape) == [1, 1, 1, 64, 128]
    assert list(desc.strides) == [s_h, 2**34 - s_t, s_t, s_t, 1]
    assert list(desc.shape) == [4, 0x7FFF0000, 0x7FFF0000, RAGGED_ROWS, 96]


def tl_coordinates(bos: int, seqlen: int, row: int, head: int) -> tuple[int, ...]:
    """What ``addressing.ragged_source`` and ``ragged_tile`` compute for a ``tl`` kernel."""
    return (head, RAGGED_ROWS, bos + seqlen, RAGGED_ROWS - seqlen + row, 0)


@pytest.mark.parametrize("layout", ["gluon", "tl"])
def test_coordinates_address_the_sequences_rows_and_stop_at_its_end(layout):
    """For every row of a tile (in and past the sequence), the copy engine's address (the sum
    of coordinates times byte strides, modulo 2**64) is the row's own in the tensor, and the
    row coordinate is in bounds exactly for the rows before the sequence's end."""
    q, _, _ = packed_qkv(8, 3, 64)
    if layout == "gluon":
        desc, coordinates, row_dim = ragged_descriptor(q, 16), ragged_coordinates, 2
    else:
        desc, coordinates, row_dim = ragged_tl_descriptor(q, 16, 64), tl_coordinates, 3
    dtype_bytes = q.element_size()
    strides = [s * dtype_bytes for s in desc.strides]
    total = 1_500_000_000  # packs far past int32 element offsets still address right
    for bos, seqlen in [(0, 1), (17, 63), (1000, 113), (total - 1000, 1000)]:
        for row in range(0, seqlen + 130, 7):
            for head in range(3):
                coords = coordinates(bos, seqlen, row, head)
                # every coordinate but the row's within its dimension; the row's only before
                # the sequence's end
                assert all(0 <= coords[i] < desc.shape[i] for i in range(5) if i != row_dim)
                assert (coords[row_dim] < desc.shape[row_dim]) == (row < seqlen)
                address = sum(c * s for c, s in zip(coords, strides, strict=True)) % 2**64
                own = ((bos + row) * q.stride(0) + head * q.stride(1)) * dtype_bytes
                assert address == own


def test_a_paged_cache_is_described_as_its_token_rows():
    """A paged cache [num_pages, page_size, heads, D] whose pages lie one after the other is
    its token rows: page p's row r is token p * page_size + r, addressed as the packed tensor's
    (``decode_ws`` copies a page as the ragged rows [p * page_size, + rows in use))."""
    cache = torch.randn(5, 16, 3, 64).bfloat16()
    assert descriptors.pages_contiguous(cache) and not descriptors.pages_contiguous(cache[::2])
    paged, packed = ragged_descriptor(cache, 16, 64), ragged_descriptor(cache.view(80, 3, 64), 16)
    assert paged.base is cache and list(paged.block_shape) == [1, 1, 16, 1, 64]
    assert paged.shape == packed.shape and paged.strides == packed.strides
    dtype_bytes = cache.element_size()
    strides = [s * dtype_bytes for s in paged.strides]
    for page, rows, head in [(0, 16, 0), (3, 5, 2), (4, 1, 1)]:
        for row in range(16):
            coords = ragged_coordinates(page * 16, rows, row, head)
            address = sum(c * s for c, s in zip(coords, strides, strict=True)) % 2**64
            assert address == cache[page, row, head].data_ptr() - cache.data_ptr()
            assert (coords[2] < paged.shape[2]) == (row < rows)


def test_with_descriptors_replaces_only_the_named_positions():
    q, k, v = packed_qkv(40, 2, 64)
    args = (q, k, v, 7, 0.5)
    assert with_descriptors(args, ()) is args
    out = with_descriptors(args, (HostDescriptor(0, 64), HostDescriptor(2, 128, 32)))
    assert out[1] is k and out[3:] == (7, 0.5)
    assert out[0].base is q and list(out[0].block_shape) == [1, 1, 64, 1, 64]
    assert out[2].base is v and list(out[2].block_shape) == [1, 1, 1, 128, 32]
    assert descriptors.ragged_layout() is descriptors.ragged_layout()  # made once


def test_ragged_arguments_name_the_kernels_tensors():
    """The planners name the Gluon kernels' descriptor arguments (``ragged_arguments``); the
    positions are those of the kernels' signatures, in the order named."""
    from portattn.kernels import forward, ws_kernels

    fwd = descriptors.ragged_arguments(ws_kernels.attn_fwd_ws_kernel, q=64, k=128, v=128, o=64)
    assert fwd == ((0, 64, 0, 0), (1, 128, 0, 0), (2, 128, 0, 0), (3, 64, 0, 0))
    dkdv = descriptors.ragged_arguments(ws_kernels.attn_bwd_dkdv_ws_kernel, do=64, k=32)
    assert dkdv == ((3, 64, 0, 0), (1, 32, 0, 0))
    # the Gluon decode's copies of pages smaller than its key tile: 64 columns each
    paged = descriptors.ragged_arguments(ws_kernels.decode_ws.attn_decode_ws_kernel,
                                         gluon_cols=64, k=16, v=16)  # fmt: skip
    assert paged == ((1, 16, 0, 64), (2, 16, 0, 64))
    tl_fwd = descriptors.ragged_arguments(forward.attn_fwd_kernel, v=(64, 32), q=(128, 64))
    assert tl_fwd == (HostDescriptor(2, 64, 32), HostDescriptor(0, 128, 64))
    with pytest.raises(ValueError):  # no such argument: not silently another position
        descriptors.ragged_arguments(ws_kernels.attn_bwd_dq_ws_kernel, out=64)


@pytest.mark.parametrize("layout", ["gluon", "tl"])
def test_repeat_descriptors_equal_tritons_checked_ones(layout):
    """After the first descriptor of a block shape and dtype, ``descriptors`` copies it with
    the new tensor's address, shape and strides instead of running Triton's checks again: the
    copies equal what Triton's constructor makes, and a tensor that fails those checks (an
    address 2 bytes past a 16-byte boundary) still gets Triton's error."""
    make = (
        (lambda x: ragged_descriptor(x, 64))
        if layout == "gluon"
        else (lambda x: ragged_tl_descriptor(x, 64, 128))
    )
    cls = type(make(packed_qkv(8, 2, 64)[0]))
    for x in (*packed_qkv(300, 4, 64), torch.randn(50, 3, 64, dtype=torch.bfloat16)):
        desc = make(x)
        fresh = cls(desc.base, desc.shape, desc.strides, desc.block_shape,
                    *([desc.layout] if layout == "gluon" else []))  # fmt: skip
        assert type(desc) is cls and desc == fresh and desc.base is x
    # no tensor outlives its call in what is kept for the next ones
    first = torch.randn(40, 2, 64, dtype=torch.float16)  # a new dtype: the first of its kind
    gone = weakref.ref(first)
    make(first)
    del first
    assert gone() is None
    flat = torch.empty(3 * 4 * 64 + 1, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="16-byte"):
        make(flat[1:].view(3, 4, 64))
