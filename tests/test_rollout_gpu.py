"""Rollout rows equal trainer rows on the device, with softcap (issue 35, item 1).

A decode / append step of ``flash_attn_with_kvcache`` against a paged cache (pages in shuffled
order) gives each new row the bytes of the same row of the trainer's packed prefill of the whole
sequences: out and lse, both kernels, pages of 16, 64 and 256, 1, 4 and 16 new rows, softcap
alone and with a sliding window. On sm90 the capped scores were rounded before the mask and
contracted into an fma after it in unmasked tiles, so a row's lse moved by an ulp with the tiles
that took the mask (decode and prefill mask different tiles).
"""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS

import portattn

pytestmark = pytest.mark.gpu

HQ, HKV, D, DTYPE = 32, 8, 128, torch.bfloat16


def _sequences(batch: int, new: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lens = (torch.randint(1, 1500, (batch,), generator=gen) + new).tolist()
    total = sum(lens)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DTYPE).cuda()

    return lens, rand(total, HQ, D), rand(total, HKV, D), rand(total, HKV, D), gen


def _paged(lens, new, k, v, page_size, gen):
    """The first ``len - new`` keys of each sequence in a paged cache, pages shuffled; room
    for the ``new`` appended keys."""
    pages = [-(-n // page_size) for n in lens]
    per_seq = max(pages)
    n_pages = sum(pages) + 3
    order = torch.randperm(n_pages, generator=gen).tolist()
    k_cache = torch.randn(n_pages, page_size, HKV, D, generator=gen).to(DTYPE).cuda()
    v_cache = torch.randn(n_pages, page_size, HKV, D, generator=gen).to(DTYPE).cuda()
    table = torch.zeros(len(lens), per_seq, dtype=torch.int32)
    start, used = 0, 0
    for b, n in enumerate(lens):
        for j in range(pages[b]):
            table[b, j] = order[used]
            used += 1
        old = n - new
        for pos in range(0, old, page_size):
            rows = min(page_size, old - pos)
            page = int(table[b, pos // page_size])
            k_cache[page, :rows] = k[start + pos : start + pos + rows]
            v_cache[page, :rows] = v[start + pos : start + pos + rows]
        start += n
    return k_cache, v_cache, table.cuda()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("new", [1, 4, 16])
@pytest.mark.parametrize("window", [(-1, -1), (100, 0)])
def test_softcap_append_rows_equal_prefill(kernel, page_size, new, window):
    batch = 64
    lens, q, k, v, gen = _sequences(batch, new, seed=page_size + 7 * new + window[0])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()
    features = dict(causal=True, window_size=window, softcap=5.0)
    with torch.no_grad():
        t_out, t_lse = portattn.varlen_attention(
            q, k, v, cu, cu, return_lse=True, kernel=kernel, **features
        )
        k_cache, v_cache, table = _paged(lens, new, k, v, page_size, gen)
        last = torch.cat([torch.arange(int(cu[b + 1]) - new, int(cu[b + 1])) for b in range(batch)])
        last = last.cuda()
        out, lse = portattn.flash_attn_with_kvcache(
            q[last].view(batch, new, HQ, D),
            k_cache,
            v_cache,
            k[last].view(batch, new, HKV, D),
            v[last].view(batch, new, HKV, D),
            cache_seqlens=torch.tensor([n - new for n in lens], dtype=torch.int32).cuda(),
            block_table=table,
            return_softmax_lse=True,
            kernel=kernel,
            **features,
        )
    want_out = t_out[last].view(batch, new, HQ, D)
    want_lse = t_lse[last].view(batch, new, HQ).permute(0, 2, 1)
    bad = [b for b in range(batch) if not torch.equal(out[b], want_out[b])]
    assert not bad, f"out differs in sequences {bad[:8]} (of {len(bad)})"
    bad = [b for b in range(batch) if not torch.equal(lse[b], want_lse[b])]
    assert not bad, f"lse differs in sequences {bad[:8]} (of {len(bad)})"
