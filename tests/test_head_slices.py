"""A small decode batch spreads each kv head's query heads over programs
(``decode.heads_per_tile``: the group halved while the grid stays below
``decode.SLICE_BELOW_PROGRAMS``). Which rows share a tile does not enter a row's bits, so the
sliced decode gives the grouped decode's bytes and the prefill's rows (design §3, 2 and 4),
packed and paged, with windows, softcap and sinks, both kernels; on a GPU too (other machine
code: HEADS is a constexpr)."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, make_pack, patch_key_chunk, spy_decode_stages

import portattn
from portattn.kernels import decode, plan
from portattn.options import AttentionOptions

F16 = torch.float16
D = 32
HEADS_Q, HEADS_K = 8, 2  # a group of 4 query heads
LENS = [45, 7, 130]  # keys of the three decoded sequences (a row each, their last)
# decode.SLICE_BELOW_PROGRAMS -> the heads a tile packs (the grid: 3 sequences x 2 kv heads x
# the group's slices = 6, 12 or 24 programs)
THRESHOLDS = {0: 4, 12: 2, 1 << 30: 1}


@pytest.fixture
def heads_seen(monkeypatch) -> list[int]:
    """The heads per tile of every decode planned from here on."""
    seen: list[int] = []
    real = decode.heads_per_tile

    def spy(problem):
        seen.append(real(problem))
        return seen[-1]

    monkeypatch.setattr(decode, "heads_per_tile", spy)
    plan.forget_problems()
    yield seen
    plan.forget_problems()


FEATURES = {
    "plain": {},
    "window": {"window_size": (20, 0)},
    "softcap": {"softcap": 5.0},
    "sinks": {"sinks": torch.tensor([0.5, -1.0, 2.0, -30.0, 0.0, 1.0, -2.0, 3.0], device=DEVICE)},
}


def _decode_rows(p, paged: bool, kernel: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's last query row against its keys: the packed decode (``varlen_attention``
    with one row a sequence) or ``flash_attn_with_kvcache`` on a paged cache of 16-key pages;
    (out [B, Hq, D], lse [B, Hq])."""
    starts = [0, *torch.tensor(LENS).cumsum(0).tolist()]
    last = torch.tensor([s - 1 for s in starts[1:]], device=DEVICE)
    q = p.q[last]
    with torch.no_grad():
        if not paged:
            cu_q = torch.arange(len(LENS) + 1, dtype=torch.int32, device=DEVICE)
            return portattn.varlen_attention(
                q,
                p.k,
                p.v,
                cu_q,
                p.cu_k,
                1,
                max(LENS),
                causal=True,
                kernel=kernel,
                return_lse=True,
                **kw,
            )
        page, n_pages = 16, [-(-n // 16) for n in LENS]
        k_cache = torch.randn(sum(n_pages) + 1, page, HEADS_K, D, dtype=F16, device=DEVICE)
        v_cache = torch.randn_like(k_cache)
        table = torch.zeros(len(LENS), max(n_pages), dtype=torch.int32, device=DEVICE)
        first = 1  # page 0 stays unused: the table's rows point past it
        for b, n in enumerate(LENS):
            ids = torch.arange(first, first + n_pages[b], device=DEVICE)
            table[b, : n_pages[b]] = ids.int()
            k_cache.view(-1, HEADS_K, D)[first * page : first * page + n] = p.k[
                starts[b] : starts[b + 1]
            ]
            v_cache.view(-1, HEADS_K, D)[first * page : first * page + n] = p.v[
                starts[b] : starts[b + 1]
            ]
            first += n_pages[b]
        seqlens = torch.tensor(LENS, dtype=torch.int32, device=DEVICE)
        out, lse = portattn.flash_attn_with_kvcache(
            q[:, None], k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True,
            return_softmax_lse=True, kernel=kernel, **kw,
        )  # fmt: skip
        return out[:, 0], lse[:, :, 0]


# (kernel, paged, features): flash_attn_with_kvcache takes no sinks (flash-attn's signature)
CASES = [("varlen", False, f) for f in FEATURES] + [
    ("fixed_order", False, "sinks"), ("varlen", True, "plain"), ("varlen", True, "window"),
    ("fixed_order", True, "softcap"),
]  # fmt: skip


@pytest.mark.parametrize(("kernel", "paged", "features"), CASES)
def test_sliced_decode_is_the_grouped_decode_and_the_prefill(
    heads_seen, monkeypatch, kernel, paged, features
):
    kw = FEATURES[features]
    p = make_pack(LENS, LENS, HEADS_Q, HEADS_K, D, F16, seed=46)
    with torch.no_grad():
        full, full_lse = portattn.varlen_attention(
            p.q, p.k, p.v, p.cu_q, p.cu_k, max(LENS), max(LENS), causal=True, kernel=kernel,
            return_lse=True, **kw,
        )  # fmt: skip
    last = (p.cu_q[1:] - 1).long()
    results = {}
    for threshold, heads in THRESHOLDS.items():
        monkeypatch.setattr(decode, "SLICE_BELOW_PROGRAMS", threshold)
        plan.forget_problems()
        heads_seen.clear()
        results[heads] = _decode_rows(p, paged, kernel, **kw)
        assert heads_seen and set(heads_seen) == {heads}, (threshold, heads_seen)
    for heads, (out, lse) in results.items():
        assert torch.equal(out, results[4][0]) and torch.equal(lse, results[4][1]), heads
        assert torch.equal(out, full[last]), heads
        assert torch.equal(lse, full_lse[last]), heads


def test_a_grid_that_fills_the_gpu_keeps_the_group(monkeypatch):
    """B sequences x 2 kv heads: 2B programs at the whole group (4 heads), 4B at 2, 8B at 1;
    halved only while below ``SLICE_BELOW_PROGRAMS`` (here 264, two waves of 132 SMs).
    Planning only, no launch."""
    monkeypatch.setattr(decode, "SLICE_BELOW_PROGRAMS", 264)
    options = AttentionOptions(causal=True, softmax_scale=D**-0.5, kernel="varlen")
    for batch, expected in ((64, 1), (100, 2), (132, 4)):
        q = torch.ones(batch, HEADS_Q, D, dtype=F16, device=DEVICE)
        k = torch.ones(9 * batch, HEADS_K, D, dtype=F16, device=DEVICE)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
        problem = plan.plan_problem(q, k, cu_q, 1, 9, options)
        assert decode.heads_per_tile(problem) == expected, batch


@pytest.fixture
def split_entries(monkeypatch):
    """The entries of the family in use with a key chunk of two key tiles (fwd_ws off:
    ``helpers.patch_key_chunk``) and every decode split (``SPLIT_BELOW_PROGRAMS``);
    the stages of the decode launches planned from here on."""
    patch_key_chunk(monkeypatch, True)
    monkeypatch.setattr(decode, "SPLIT_BELOW_PROGRAMS", 1 << 30)
    stages = spy_decode_stages(monkeypatch)
    plan.forget_problems()
    yield stages
    plan.forget_problems()


@pytest.mark.parametrize("kernel", ["varlen", "fixed_order"])
def test_sliced_split_decode_is_the_grouped_one(split_entries, heads_seen, monkeypatch, kernel):
    """With the key split (design §3.1) the chunks' partials and their combine address the
    sliced tiles' rows as the grouped ones': the same bits, and the prefill's."""
    p = make_pack(LENS, LENS, HEADS_Q, HEADS_K, D, F16, seed=47)
    with torch.no_grad():
        full, full_lse = portattn.varlen_attention(
            p.q, p.k, p.v, p.cu_q, p.cu_k, max(LENS), max(LENS), causal=True, kernel=kernel,
            return_lse=True,
        )  # fmt: skip
    last = (p.cu_q[1:] - 1).long()
    results = {}
    for threshold, heads in ((0, 4), (1 << 30, 1)):
        monkeypatch.setattr(decode, "SLICE_BELOW_PROGRAMS", threshold)
        plan.forget_problems()
        heads_seen.clear()
        split_entries.clear()
        results[heads] = _decode_rows(p, True, kernel)
        assert set(heads_seen) == {heads}
        assert "decode_split" in split_entries and "decode_combine" in split_entries
    assert torch.equal(results[1][0], results[4][0]) and torch.equal(results[1][1], results[4][1])
    assert torch.equal(results[1][0], full[last]) and torch.equal(results[1][1], full_lse[last])
