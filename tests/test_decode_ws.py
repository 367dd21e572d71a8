"""The Gluon decode (``portattn/kernels/decode_ws.py``, issue 37; not planned yet).

CPU: its sm90 compile (both kernels' key tiles, packed and paged K/V): no spills, wgmma, and one
TMA copy per page and 64 columns where a page is smaller than the key tile (the layout the
first version got wrong on the GPU: a copy into a row slice of a d128 tile put its second
64-column half at the slice's offset). GPU (sm90): its out and lse equal the shipped decode's
bit for bit, packed and paged (pages shuffled, 16 / 64 / 256 rows), odd lengths, both kernels.
"""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS

import portattn
from ci.gluon_decode_ab import compile_variant, variants
from ci.golden_dev.keys import in_compiler_process
from portattn.kernels.decode_ws import copies_per_tile, launch_decode_ws, plan_decode_ws


@pytest.mark.parametrize(
    ("kernel", "head_dim", "page", "slots"),
    [("varlen", 128, 0, 3), ("varlen", 128, 16, 3), ("fixed_order", 64, 16, 2)],
)
def test_sm90_compile(kernel, head_dim, page, slots):
    got = in_compiler_process(compile_variant, kernel, head_dim, page, slots)
    block_n = variants(kernel, head_dim)[0]
    per_tile = copies_per_tile(block_n, page, head_dim)
    if per_tile == 1:  # one copy of the whole tile, which Triton issues per 64 columns
        per_tile = head_dim // 64
    assert got["spills"] == 0 and got["wgmma"] > 0
    assert got["tma_copies"] == 2 * per_tile  # K and V


def _case(head_dim: int, page: int, rows: int, seed: int = 0):
    """Odd lengths, GQA 32/8, ``rows`` query rows each (the last positions: a decode step, or
    an append); packed K/V, or the same keys in a paged cache whose pages are shuffled and
    whose unused rows hold NaN (no row may read them)."""
    gen = torch.Generator().manual_seed(seed)
    lens, hq, hk = [4, 17, 63, 113, 1000, 130], 32, 8
    total = sum(lens)
    q = torch.randn(len(lens) * rows, hq, head_dim, generator=gen).bfloat16().cuda()
    k, v = (torch.randn(total, hk, head_dim, generator=gen).bfloat16().cuda() for _ in range(2))
    cu_k = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()
    cu_q = (torch.arange(len(lens) + 1, dtype=torch.int32) * rows).cuda()
    if not page:
        return q, k, v, cu_q, cu_k, None, lens
    pages = [-(-n // page) for n in lens]
    order = torch.randperm(sum(pages) + 2, generator=gen).tolist()
    caches = [torch.full((len(order), page, hk, head_dim), float("nan")).bfloat16().cuda()
              for _ in range(2)]  # fmt: skip
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        for j in range(pages[b]):
            table[b, j], used = order[used], used + 1
            rows = slice(cu_k[b].item() + j * page, cu_k[b].item() + min(n, (j + 1) * page))
            for cache, x in zip(caches, (k, v)):
                cache[int(table[b, j]), : rows.stop - rows.start] = x[rows]
    return q, *caches, cu_q, cu_k, table.cuda(), lens


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page", [0, 16, 64, 256])
@pytest.mark.parametrize("rows", [1, 4])
def test_gives_the_shipped_decode_bits(kernel, head_dim, page, rows):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("decode_ws is a Hopper (sm90) kernel")
    q, k, v, cu_q, cu_k, table, lens = _case(head_dim, page, rows)
    if table is None:
        ref, ref_lse = portattn.varlen_attention(q, k, v, cu_q, cu_k, rows, max(lens),
                                                 causal=True, return_lse=True,
                                                 kernel=kernel)  # fmt: skip
    else:
        seqlens = torch.tensor(lens, dtype=torch.int32).cuda()
        ref, ref_lse = portattn.flash_attn_with_kvcache(
            q.view(len(lens), rows, *q.shape[1:]), k, v, cache_seqlens=seqlens,
            block_table=table, causal=True, return_softmax_lse=True, kernel=kernel,
        )  # fmt: skip
        ref, ref_lse = ref.flatten(0, 1), ref_lse.transpose(1, 2).flatten(0, 1)  # [B Sq, Hq]
    if ref_lse.shape != q.shape[:2]:
        ref_lse = ref_lse.transpose(0, 1)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    block_n, slots = variants(kernel, head_dim)
    plan = plan_decode_ws(q, k, v, out, lse, cu_q, cu_k, rows, table, head_dim**-0.5, True,
                          kernel == "fixed_order", block_n, slots[-1])  # fmt: skip
    launch_decode_ws(plan)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
