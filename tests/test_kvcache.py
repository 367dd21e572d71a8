"""The rollout side: paged K/V (``varlen_attention(..., block_table=)``) and
``flash_attn_with_kvcache`` give every query row the bytes of the same row of the trainer's
packed prefill (design §3, invariances 2 and 4 across entry points), for both kernels, any page
size and page order, batches mixing lengths, decode (one row) and append (several rows).

The same claims run on the CPU (interpreter, float16, small sizes) and on the GPU (bfloat16,
page sizes 16 / 64 / 256, lengths up to 8192)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import DEVICE, HAS_GPU, KERNELS, cu_seqlens
from kvcache_sizes import APPENDS, DTYPE, HKV, HQ, LENS, PAGE_SIZES, D

import portattn
from portattn import accuracy, configs
from portattn.configs import INTERPRETER
from portattn.families import config_family
from portattn.reference import reference_varlen_attention


def _sequences(lens: list[int], seed: int, hq: int = HQ, hkv: int = HKV):
    """Random (never zero) q, k, v per sequence, on the CPU (moved per use)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DTYPE)

    return [(rand(n, hq, D), rand(n, hkv, D), rand(n, hkv, D)) for n in lens]


def _prefill(seqs, kernel: str):
    """The trainer's call: the packed causal forward of whole sequences, the one that also runs
    backward (q/k/v require grad). Returns per-sequence (out, lse)."""
    lens = [s[0].shape[0] for s in seqs]
    q, k, v = (torch.cat([s[i] for s in seqs]).to(DEVICE).requires_grad_() for i in range(3))
    cu = cu_seqlens(lens)
    out, lse = portattn.varlen_attention(
        q, k, v, cu, cu, causal=True, return_lse=True, kernel=kernel
    )
    bounds = cu.tolist()
    return [(out[a:b].detach(), lse[a:b].detach()) for a, b in zip(bounds, bounds[1:])]


def _paged_cache(seqs, page_size: int, seed: int, spare: int = 3):
    """The sequences' keys and values in a paged cache with shuffled pages (unused pages and
    slots random, block-table entries past a sequence's pages -1): (k_cache, v_cache,
    block_table)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-s[1].shape[0] // page_size) for s in seqs]
    n_pages = sum(pages) + spare
    order = torch.randperm(n_pages, generator=gen).tolist()
    k_cache = torch.randn(n_pages, page_size, HKV, D, generator=gen).to(DTYPE)
    v_cache = torch.randn(n_pages, page_size, HKV, D, generator=gen).to(DTYPE)
    table = torch.full((len(seqs), max(pages) + 1), -1, dtype=torch.int32)
    used = 0
    for b, (_, k, v) in enumerate(seqs):
        for j in range(pages[b]):
            page = order[used]
            used += 1
            table[b, j] = page
            rows = slice(j * page_size, min((j + 1) * page_size, k.shape[0]))
            k_cache[page, : rows.stop - rows.start] = k[rows]
            v_cache[page, : rows.stop - rows.start] = v[rows]
    return k_cache.to(DEVICE), v_cache.to(DEVICE), table.to(DEVICE)


def _last_rows(seqs, rows: list[int]):
    """The last ``rows[b]`` query rows of each sequence, packed, and their cu_seqlens."""
    q = torch.cat([s[0][s[0].shape[0] - r :] for s, r in zip(seqs, rows)]).to(DEVICE)
    return q, cu_seqlens(rows)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("append", APPENDS)
def test_paged_rows_equal_prefill_rows(kernel, page_size, append):
    seqs = _sequences(LENS, seed=page_size + append)
    trainer = _prefill(seqs, kernel)
    k_cache, v_cache, table = _paged_cache(seqs, page_size, seed=append)
    rows = [min(append, s[0].shape[0]) for s in seqs]
    q, cu_q = _last_rows(seqs, rows)
    cu_k = cu_seqlens(LENS)
    with torch.no_grad():
        out, lse = portattn.varlen_attention(
            q,
            k_cache,
            v_cache,
            cu_q,
            cu_k,
            causal=True,
            return_lse=True,
            kernel=kernel,
            block_table=table,
        )
    bounds = cu_q.tolist()
    for b, (t_out, t_lse) in enumerate(trainer):
        got = slice(bounds[b], bounds[b + 1])
        assert torch.equal(out[got], t_out[-rows[b] :]), f"sequence {b}: out differs"
        assert torch.equal(lse[got], t_lse[-rows[b] :]), f"sequence {b}: lse differs"


@pytest.fixture
def page_block_entry(monkeypatch):
    """``apply(kernel, tiles)``: the running family's entry of these tests' head dim and dtype
    reads a paged cache's block table ``tiles`` key tiles at a time (``KernelConfig.page_block``;
    0: once per key tile), for the test's duration."""
    table = configs.config_table()
    family = INTERPRETER if not HAS_GPU else config_family(torch.device("cuda"))

    def apply(kernel: str, tiles: int) -> None:
        key = (family, kernel, configs.table_head_dim(D), DTYPE)
        monkeypatch.setitem(table, key, dataclasses.replace(table[key], page_block=tiles))

    return apply


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_block", [0, 2, 16])
def test_paged_rows_past_one_page_block(kernel, page_block, page_block_entry):
    """The paged key loop reads the block table once per key tile (``page_block`` 0, the loop
    of the families without ``rows.PAGE_BLOCK``) or a block of key tiles at a time, over
    sequences that span several blocks (38 of the interpreter's 16-key tiles: 19 blocks of 2,
    three of 16): decode rows are the prefill's either way, at every page size."""
    lens = [37 * 16 + 5, 17]
    seqs = _sequences(lens, seed=11)
    trainer = _prefill(seqs, kernel)
    page_block_entry(kernel, page_block)
    for page_size in PAGE_SIZES:
        k_cache, v_cache, table = _paged_cache(seqs, page_size, seed=5)
        q, cu_q = _last_rows(seqs, [1, 1])
        with torch.no_grad():
            out, lse = portattn.varlen_attention(
                q,
                k_cache,
                v_cache,
                cu_q,
                cu_seqlens(lens),
                causal=True,
                return_lse=True,
                kernel=kernel,
                block_table=table,
            )
        for b, (t_out, t_lse) in enumerate(trainer):
            assert torch.equal(out[b : b + 1], t_out[-1:]), f"page {page_size}, {b}: out"
            assert torch.equal(lse[b : b + 1], t_lse[-1:]), f"page {page_size}, {b}: lse"


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_rows_in_any_batch_composition(kernel):
    """A decode row's bytes do not depend on the batch around it (order, neighbours, size)."""
    seqs = _sequences(LENS, seed=7)
    trainer = _prefill(seqs, kernel)
    for perm_seed in (0, 1):
        order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(perm_seed))
        order = order.tolist()[: len(seqs) - perm_seed]  # the second batch drops one sequence
        chosen = [seqs[i] for i in order]
        k_cache, v_cache, table = _paged_cache(chosen, PAGE_SIZES[-1], seed=perm_seed)
        q, cu_q = _last_rows(chosen, [1] * len(chosen))
        with torch.no_grad():
            out, lse = portattn.varlen_attention(
                q,
                k_cache,
                v_cache,
                cu_q,
                cu_seqlens([s[1].shape[0] for s in chosen]),
                causal=True,
                return_lse=True,
                kernel=kernel,
                block_table=table,
            )
        for row, i in enumerate(order):
            assert torch.equal(out[row], trainer[i][0][-1]), f"sequence {i}: out differs"
            assert torch.equal(lse[row], trainer[i][1][-1]), f"sequence {i}: lse differs"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_kvcache_append_equals_prefill_and_writes_cache(kernel, layout):
    """flash_attn_with_kvcache: cache_seqlens keys in the cache, ``new`` rows appended in place,
    the last ``new`` query rows attend: their bytes are the prefill's, and the cache holds the
    appended rows afterwards."""
    lens, new = LENS[:4], 4
    lens = [max(n, new) for n in lens]
    seqs = _sequences(lens, seed=11)
    trainer = _prefill(seqs, kernel)
    prefix = [(q[:-new], k[:-new], v[:-new]) for q, k, v in seqs]
    cache_seqlens = torch.tensor([n - new for n in lens], dtype=torch.int32, device=DEVICE)
    if layout == "paged":
        # Pages for the full lengths, filled with the prefixes only.
        k_cache, v_cache, table = _paged_cache(seqs, PAGE_SIZES[0], seed=3)
        full_k, full_v = k_cache.clone(), v_cache.clone()
        for b, n in enumerate(lens):  # scribble over the slots the append must write
            for j in range(n - new, n):
                page, slot = table[b, j // PAGE_SIZES[0]], j % PAGE_SIZES[0]
                k_cache[page, slot] = 7.0
                v_cache[page, slot] = -7.0
        kwargs = dict(block_table=table)
    else:
        capacity = max(lens) + 5
        rows = torch.tensor([3, 0, 4, 1], dtype=torch.int32, device=DEVICE)
        k_cache = torch.randn(5, capacity, HKV, D, device=DEVICE).to(DTYPE)
        v_cache = torch.randn(5, capacity, HKV, D, device=DEVICE).to(DTYPE)
        for b, (_, k, v) in enumerate(prefix):
            k_cache[rows[b], : k.shape[0]] = k.to(DEVICE)
            v_cache[rows[b], : v.shape[0]] = v.to(DEVICE)
        kwargs = dict(cache_batch_idx=rows)
    q = torch.stack([s[0][-new:] for s in seqs]).to(DEVICE)
    k_new = torch.stack([s[1][-new:] for s in seqs]).to(DEVICE)
    v_new = torch.stack([s[2][-new:] for s in seqs]).to(DEVICE)
    out, lse = portattn.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        cache_seqlens=cache_seqlens,
        causal=True,
        return_softmax_lse=True,
        kernel=kernel,
        **kwargs,
    )
    assert out.shape == (len(lens), new, HQ, D) and lse.shape == (len(lens), HQ, new)
    for b, (t_out, t_lse) in enumerate(trainer):
        assert torch.equal(out[b], t_out[-new:]), f"sequence {b}: out differs"
        assert torch.equal(lse[b], t_lse[-new:].transpose(0, 1)), f"sequence {b}: lse differs"
    if layout == "paged":
        assert torch.equal(k_cache, full_k) and torch.equal(v_cache, full_v)
    else:
        for b, n in enumerate(lens):
            assert torch.equal(k_cache[rows[b], n - new : n], k_new[b])
            assert torch.equal(v_cache[rows[b], n - new : n], v_new[b])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_accuracy(kernel, causal):
    """Against the float64 reference, under the accuracy rule (error at most 2x eager's in the
    input dtype plus a margin); rows with an empty cache see no key (out 0, lse -inf)."""
    lens = [0, *LENS[1:4]]
    sq = 3
    gen = torch.Generator().manual_seed(5)
    batch, capacity = len(lens), max(lens) + 8
    q = torch.randn(batch, sq, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    k_cache = torch.randn(batch, capacity, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    v_cache = torch.randn(batch, capacity, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out, lse = portattn.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens=seqlens,
        causal=causal,
        return_softmax_lse=True,
        kernel=kernel,
    )
    k = torch.cat([k_cache[b, :n] for b, n in enumerate(lens)])
    v = torch.cat([v_cache[b, :n] for b, n in enumerate(lens)])
    args = (q.reshape(-1, HQ, D), k, v, cu_seqlens([sq] * batch), cu_seqlens(lens))
    ref_out, ref_lse = reference_varlen_attention(*args, causal=causal)
    eager_out, _ = reference_varlen_attention(*args, causal=causal, compute_dtype=DTYPE)
    got = out.reshape(-1, HQ, D)
    assert not torch.isnan(got).any()
    err, base = accuracy.rel_err(got, ref_out), accuracy.rel_err(eager_out.to(DTYPE), ref_out)
    assert err <= accuracy.limit("out", base), (err, base)
    lse_rows = lse.permute(0, 2, 1).reshape(-1, HQ)
    assert accuracy.lse_err(lse_rows, ref_lse) <= accuracy.limit("lse", 0.0)
    assert torch.equal(got[:sq], torch.zeros_like(got[:sq]))  # lens[0] == 0: no key


def _small_paged():
    seqs = _sequences([5, 3], seed=1)
    k_cache, v_cache, table = _paged_cache(seqs, 16, seed=1)
    q, cu_q = _last_rows(seqs, [1, 1])
    return q, k_cache, v_cache, cu_q, cu_seqlens([5, 3]), table


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(table=a["table"].to(torch.int64)), "block_table must have dtype"),
        (lambda a: a.update(table=a["table"][:1]), r"block_table must be \[B, pages_per_seq\]"),
        (lambda a: a["table"].__setitem__((0, 0), 99), "outside the cache's"),
        (lambda a: a.update(cu_k=cu_seqlens([5, 40])), "more than its cache holds"),
        (lambda a: a.update(k=a["k"][:, :15], v=a["v"][:, :15]), "page_size one of"),
    ],
)
def test_paged_bad_input_raises(change, match):
    q, k, v, cu_q, cu_k, table = _small_paged()
    args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, table=table)
    change(args)
    with pytest.raises(ValueError, match=match), torch.no_grad():
        portattn.varlen_attention(
            args["q"],
            args["k"],
            args["v"],
            args["cu_q"],
            args["cu_k"],
            causal=True,
            block_table=args["table"],
        )


def test_paged_needs_no_grad():
    q, k, v, cu_q, cu_k, table = _small_paged()
    with pytest.raises(ValueError, match="inference-only"):
        portattn.varlen_attention(q.requires_grad_(), k, v, cu_q, cu_k, block_table=table)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rotary_cos="x"), "rotary"),
        (dict(cache_leftpad="x"), "left-padded"),
        (dict(alibi_slopes="x"), "ALiBi"),
        (dict(num_splits=4), "split only at the table entry's fixed key chunk"),
        (dict(cache_seqlens=40), r"cache_seqlens must be in \[0, 16\]"),
        (dict(cache_batch_idx=torch.tensor([0, 9], dtype=torch.int32)), "outside the cache"),
    ],
)
def test_kvcache_bad_input_raises(kwargs, match):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    cache = torch.randn(2, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    if "cache_batch_idx" in kwargs:
        kwargs = dict(kwargs, cache_batch_idx=kwargs["cache_batch_idx"].to(DEVICE))
    with pytest.raises(ValueError, match=match):
        portattn.flash_attn_with_kvcache(q, cache, cache.clone(), **kwargs)


def test_host_values_copied_once_per_version(monkeypatch):
    """Layers sharing one cu_seqlens tensor: its values reach the host once, until it is
    written (version counter)."""
    from portattn import validation

    validation.forget_host_values()
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or real(t))
    cu = cu_seqlens([3, 4])
    for _ in range(3):
        validation.host_values(cu)
    assert len(calls) == 1
    cu.add_(0)  # an in-place op: a new version
    assert validation.host_values(cu) == [0, 3, 7] and len(calls) == 2


@pytest.mark.parametrize("kernel", ("varlen", "fixed_order"))
def test_kvcache_window_and_softcap_rows_equal_prefill(kernel):
    """flash_attn_with_kvcache with a sliding window and a cap: the appended rows are the
    byte-equal rows of the prefill of the whole sequences with them (dense cache)."""
    gen = torch.Generator().manual_seed(5)
    lens, new = [9, 30], 3
    total = sum(lens)
    q = torch.randn(total, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    k = torch.randn(total, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    v = torch.randn(total, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    cu = torch.tensor([0, lens[0], total], dtype=torch.int32, device=DEVICE)
    features = dict(window_size=(7, -1), softcap=2.0)
    with torch.no_grad():
        out, lse = portattn.varlen_attention(
            q, k, v, cu, cu, causal=True, return_lse=True, kernel=kernel, **features
        )
        k_cache = torch.zeros(2, 32, HKV, D, dtype=DTYPE, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        rows, k_new, v_new, q_new = [], [], [], []
        for b, n in enumerate(lens):
            start = int(cu[b])
            k_cache[b, : n - new] = k[start : start + n - new]
            v_cache[b, : n - new] = v[start : start + n - new]
            rows.append(torch.arange(start + n - new, start + n))
            k_new.append(k[start + n - new : start + n])
            v_new.append(v[start + n - new : start + n])
            q_new.append(q[start + n - new : start + n])
        seqlens = torch.tensor([n - new for n in lens], dtype=torch.int32, device=DEVICE)
        got, got_lse = portattn.flash_attn_with_kvcache(
            torch.stack(q_new),
            k_cache,
            v_cache,
            torch.stack(k_new),
            torch.stack(v_new),
            cache_seqlens=seqlens,
            causal=True,
            return_softmax_lse=True,
            kernel=kernel,
            **features,
        )
    sel = torch.cat(rows).to(DEVICE)
    assert torch.equal(got.reshape(-1, HQ, D), out[sel])
    assert torch.equal(got_lse.permute(0, 2, 1).reshape(-1, HQ), lse[sel])
