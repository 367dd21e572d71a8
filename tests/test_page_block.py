"""The paged key loop's page lookup (``addressing.page_block`` and ``tile_pages``): the block
table read a block of key tiles at a time into registers (16, 4 or 1 tiles: the
``KernelConfig.page_block`` values), then each tile's per-key pages and slots taken from them,
against ``block_table[j // page_size]`` and ``j % page_size`` for every key ``j``, at tiles
that span several pages, one page, or part of one, and at a sequence's end."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from helpers import DEVICE

from portattn.kernels.addressing import page_block, tile_pages


@triton.jit
def _tile_pages_kernel(table, out, slots, n_start, seqlen_k, BLOCK_N: tl.constexpr,
                       PAGE_SIZE: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
    b_start = n_start - n_start % (TILES * BLOCK_N)
    b_pages = page_block(table, b_start, seqlen_k, BLOCK_N, PAGE_SIZE, TILES)
    o_k = n_start + tl.arange(0, BLOCK_N)
    o_page, o_slot = tile_pages(b_pages, (n_start - b_start) // BLOCK_N, o_k, BLOCK_N, PAGE_SIZE,
                                TILES)  # fmt: skip
    tl.store(out + tl.arange(0, BLOCK_N), o_page)
    tl.store(slots + tl.arange(0, BLOCK_N), o_slot)


@pytest.mark.parametrize("tiles", [16, 4, 1])
@pytest.mark.parametrize(
    ("block_n", "page_size"), [(64, 16), (128, 64), (16, 16), (16, 64), (128, 256), (64, 32)]
)
def test_tile_pages_are_the_block_tables(block_n, page_size, tiles):
    gen = torch.Generator().manual_seed(block_n + page_size)
    pages = 40
    table = torch.randperm(1000, generator=gen)[:pages].to(torch.int32).to(DEVICE)
    seqlen_k = pages * page_size - 5  # the last page partly used
    for n_start in range(0, seqlen_k, block_n):
        out = torch.full((block_n,), -1, dtype=torch.int64, device=DEVICE)
        slots = torch.full_like(out, -1)
        _tile_pages_kernel[(1,)](table, out, slots, n_start, seqlen_k, block_n, page_size, tiles)
        keys = torch.arange(n_start, n_start + block_n, device=DEVICE)
        assert torch.equal(slots, keys % page_size), f"tile at key {n_start}: slots"
        # an entry is read where its first key (of the tile, or of the page within it) is
        # inside the sequence; keys past the end in a read entry get its page (masked later)
        first = n_start if page_size >= block_n else keys - keys % page_size
        read = torch.as_tensor(first, device=DEVICE) < seqlen_k
        want = torch.where(read, table[(keys // page_size).clamp(max=pages - 1)].long(), 0)
        assert torch.equal(out, want), f"tile at key {n_start}"
