"""The Gluon decode (``portattn/kernels/decode_ws.py``, issue 37; the sm90 d128 entries').

CPU: its sm90 compile (both kernels' key tiles, packed and paged K/V): no spills, wgmma, and one
TMA copy per page and 64 columns where a page is smaller than the key tile (the layout the
first version got wrong on the GPU: a copy into a row slice of a d128 tile put its second
64-column half at the slice's offset). GPU (sm90): its out and lse equal the Triton decode's
(``decode.py``) bit for bit, packed and paged (pages shuffled, 16 / 64 / 256 rows), odd
lengths, both kernels; its split decode's (``decode.GLUON_SPLIT``) equal the Triton split's.
"""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS, patch_key_chunk

import portattn
from ci.gluon_decode_ab import compile_variant, layout_probe, variants
from ci.gluon_split_ab import decode_kernels_planned
from ci.golden_dev.keys import in_compiler_process
from portattn.kernels import decode, plan
from portattn.kernels.decode_ws import copies_per_tile, launch_decode_ws, plan_decode_ws

LENS = (4, 17, 63, 113, 1000, 130)


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


@pytest.mark.parametrize(
    ("kernel", "head_dim", "page"),
    [("varlen", 128, 0), ("varlen", 128, 16), ("varlen", 64, 64)],
)
def test_sm90_compile_swapped(kernel, head_dim, page):
    """The swapped consumer (``decode_swap.py``) compiles without spills, with wgmma."""
    slots = variants(kernel, head_dim)[1][-1]
    got = in_compiler_process(compile_variant, kernel, head_dim, page, slots, True)
    assert got["spills"] == 0 and got["wgmma"] > 0


@pytest.mark.parametrize("block_n", [64, 128])
def test_swapped_row_sums_take_the_prefill_layout(block_n):
    """The swapped consumer sums P in ``prefill_rows_layout``: the prefill's score layout
    (``ws.acc_layout``) on 16 rows. With the 64-row layout's warp bases it is that layout: the
    conversion compiles as a trivial one (Triton raises otherwise) and moves nothing."""
    assert in_compiler_process(layout_probe, block_n) == 0


def _case(head_dim: int, page: int, rows: int, seed: int = 0, lens=LENS):
    """Odd lengths, GQA 32/8, ``rows`` query rows each (the last positions: a decode step, or
    an append); packed K/V, or the same keys in a paged cache whose pages are shuffled and
    whose unused rows hold NaN (no row may read them)."""
    gen = torch.Generator().manual_seed(seed)
    lens, hq, hk = list(lens), 32, 8
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


def _decoded(q, k, v, cu_q, cu_k, table, lens, rows: int, kernel: str):
    """The planned decode's (out [total_q, Hq, D], lse [total_q, Hq]) of a :func:`_case`."""
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
    return ref, ref_lse


def _on_sm90() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("decode_ws is a Hopper (sm90) kernel")


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "swap"), [
    ("varlen", False), ("fixed_order", False), pytest.param("varlen", True, id="varlen-swapped"),
])  # fmt: skip
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page", [0, 16, 64, 256])
@pytest.mark.parametrize("rows", [1, 4])
def test_gives_the_triton_decode_bits(monkeypatch, kernel, swap, head_dim, page, rows):
    """Launched directly, against the decode planned without it (``attn_decode_kernel``);
    ``swap``: its swapped consumer (``decode_swap.py``, 16-row tiles, varlen only)."""
    _on_sm90()
    q, k, v, cu_q, cu_k, table, lens = _case(head_dim, page, rows)
    with monkeypatch.context() as mp:
        mp.setattr(decode, "gluon_decode_applies", lambda *args, **kw: False)
        plan.forget_problems()
        ref, ref_lse = _decoded(q, k, v, cu_q, cu_k, table, lens, rows, kernel)
    plan.forget_problems()
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    block_n, slots = variants(kernel, head_dim)
    launch = plan_decode_ws(q, k, v, out, lse, cu_q, cu_k, rows, table, head_dim**-0.5, True,
                            kernel == "fixed_order", block_n, slots[-1], swap=swap)  # fmt: skip
    launch_decode_ws(launch)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page", [0, 16, 64, 256])
@pytest.mark.parametrize("rows", [1, 4])
def test_split_decode_gives_the_triton_split_bits(monkeypatch, kernel, page, rows):
    """``decode.GLUON_SPLIT``: a split decode's partials from the Gluon kernel (merged by the
    Triton combine) against the Triton split's, the entries' key chunk patched to 2048 keys:
    sequences of 3, 2 and 1 chunks (odd ends), every decode split; d128 (decode_ws' entries)."""
    _on_sm90()
    patch_key_chunk(monkeypatch, True, 2048, ws=True)
    monkeypatch.setattr(decode, "SPLIT_BELOW_PROGRAMS", 1 << 30)
    monkeypatch.setattr(decode, "GLUON_SPLIT", False)  # the reference: the Triton split
    case = _case(128, page, rows, seed=3, lens=(5000, 2049, 777, 4096, 4))
    with decode_kernels_planned() as seen:
        ref = _decoded(*case, rows, kernel)
    assert ("decode_split", "attn_decode_kernel") in seen
    monkeypatch.setattr(decode, "GLUON_SPLIT", True)
    plan.forget_problems()
    with decode_kernels_planned() as seen:
        got = _decoded(*case, rows, kernel)
    plan.forget_problems()
    assert seen[:2] == [("decode_split", "attn_decode_ws_kernel"),
                        ("decode_combine", "attn_decode_kernel")]  # fmt: skip
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 64])
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("split", [False, True])
def test_swapped_decode_as_planned(monkeypatch, page, rows, split):
    """``decode.SWAP_DECODE`` on: the planned decode (``split``: its partials, the entries' key
    chunk patched to 2048 keys) runs the swapped consumer, with the bits it has off."""
    _on_sm90()
    lens = (5000, 2049, 777, 4096, 4) if split else LENS
    if split:
        patch_key_chunk(monkeypatch, True, 2048, ws=True)
        monkeypatch.setattr(decode, "SPLIT_BELOW_PROGRAMS", 1 << 30)
    case = _case(128, page, rows, seed=5, lens=lens)
    plan.forget_problems()
    ref = _decoded(*case, rows, "varlen")
    swapped, chosen = decode.swapped_decode, []
    monkeypatch.setattr(decode, "swapped_decode", lambda p: chosen.append(swapped(p)) or chosen[-1])
    monkeypatch.setattr(decode, "SWAP_DECODE", True)
    plan.forget_problems()
    got = _decoded(*case, rows, "varlen")
    plan.forget_problems()
    assert chosen and all(chosen)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize(
    ("kernel", "hq", "rows", "swaps"),
    [("varlen", 32, 1, True), ("varlen", 32, 4, True), ("varlen", 32, 5, False),
     ("varlen", 128, 1, True), ("varlen", 256, 1, False), ("fixed_order", 32, 1, False)],
)  # fmt: skip
def test_swapped_decode_rule(monkeypatch, kernel, hq, rows, swaps):
    """``decode.swapped_decode``: with ``SWAP_DECODE`` on, varlen only, and a sequence's rows
    (its GQA group times its positions; 8 kv heads here) within one 16-row tile; off, never."""
    from portattn.options import AttentionOptions

    q = torch.randn(2 * rows, hq, 128, dtype=torch.bfloat16)
    k = torch.randn(64, 8, 128, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, rows, 2 * rows], dtype=torch.int32)
    problem = plan.plan_problem(q, k, cu_q, rows, 32, AttentionOptions(True, 0.125, kernel))
    monkeypatch.setattr(decode, "SWAP_DECODE", False)
    assert not decode.swapped_decode(problem)
    monkeypatch.setattr(decode, "SWAP_DECODE", True)
    assert decode.swapped_decode(problem) is swaps
