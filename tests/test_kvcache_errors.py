"""flash_attn_with_kvcache's refusals and host behaviour (issue 35): a rejected call writes
nothing, each appended element is written once, caches and new rows share no memory, host
copies once per tensor version, and errors name this function's arguments. The rows' bytes
are tests/test_kvcache.py's."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE
from kvcache_sizes import DTYPE, HKV, HQ, D

import portattn

# --- A rejected call writes nothing (issue 35) --------------------------------------------------


def _strided(*shape, width: int, gen) -> torch.Tensor:
    """A [..., D] view of [..., width] memory: token/head strides of ``width`` elements."""
    return torch.randn(*shape[:-1], width, generator=gen).to(DTYPE).to(DEVICE)[..., : shape[-1]]


def _append_call(q, k_cache, v_cache, gen, **kwargs):
    """flash_attn_with_kvcache appending one new key/value per sequence (the caches' dims)."""
    batch, hkv = q.shape[0], k_cache.shape[2]
    k_new = torch.randn(batch, 1, hkv, k_cache.shape[-1], generator=gen).to(DTYPE).to(DEVICE)
    v_new = torch.randn(batch, 1, hkv, v_cache.shape[-1], generator=gen).to(DTYPE).to(DEVICE)
    return portattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)


def _assert_rejected_unwritten(q, k_cache, v_cache, match, gen, **kwargs):
    before_k, before_v = k_cache.clone(), v_cache.clone()
    with pytest.raises(ValueError, match=match):
        _append_call(q, k_cache, v_cache, gen, **kwargs)
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


@pytest.mark.parametrize("strided", ["q", "caches"])
def test_kvcache_stride_error_writes_nothing(strided):
    """Head dim 40 (an odd multiple of 8) needs token/head strides that are multiples of 8
    (``buffers.check_row_strides``): that error comes before the append writes the caches."""
    gen, d = torch.Generator().manual_seed(2), 40
    width = 41 if strided == "q" else d
    q = _strided(2, 1, HQ, d, width=width, gen=gen)
    width = 41 if strided == "caches" else d
    k_cache = _strided(2, 16, HKV, d, width=width, gen=gen)
    v_cache = _strided(2, 16, HKV, d, width=width, gen=gen)
    seqlens = torch.tensor([3, 5], dtype=torch.int32, device=DEVICE)
    _assert_rejected_unwritten(q, k_cache, v_cache, "odd multiple of 8", gen, cache_seqlens=seqlens)


def test_kvcache_inference_cache_error_writes_nothing():
    """PyTorch refuses in-place writes to an inference tensor outside inference mode: a
    v_cache made under torch.inference_mode is refused before k_cache is written."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    k_cache = torch.randn(2, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    with torch.inference_mode():
        v_cache = k_cache.clone()
    match = "v_cache is an inference tensor"
    _assert_rejected_unwritten(q, k_cache, v_cache, match, gen, cache_seqlens=3)


# --- Each appended element is written once (issue 35) -------------------------------------------


def _paged_append_case(table: list[list[int]], lens: list[int], n_pages: int = 3):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(len(lens), 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    k_cache = torch.randn(n_pages, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    v_cache = torch.randn(n_pages, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    kwargs = dict(
        block_table=torch.tensor(table, dtype=torch.int32, device=DEVICE),
        cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
    )
    return q, k_cache, v_cache, gen, kwargs


@pytest.mark.parametrize(
    ("table", "lens"),
    [([[0], [0]], [5, 5]), ([[0, 1], [1, 2]], [16, 0]), ([[0, 0]], [0])],
    ids=["two-sequences", "across-pages", "one-sequence"],
)
def test_kvcache_paged_slot_written_twice_raises(table, lens):
    """Two appended positions that the block table maps to one (page, slot) would lose a
    write: refused before anything is written."""
    q, k_cache, v_cache, gen, kwargs = _paged_append_case(table, lens)
    new = 17 if len(lens) == 1 else 1  # one sequence: position 16 is position 0's slot
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k_new = torch.randn(len(lens), new, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    with pytest.raises(ValueError, match="to one cache slot"):
        portattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new.clone(), **kwargs)
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_kvcache_shared_prefix_page_is_allowed():
    """Two sequences that share a prefix page they only read, each appending to its own."""
    q, k_cache, v_cache, gen, kwargs = _paged_append_case([[0, 1], [0, 2]], [16, 16])
    k_new = torch.randn(2, 1, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    v_new = torch.randn(2, 1, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
    portattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
    assert torch.equal(k_cache[1:, 0], k_new[:, 0]) and torch.equal(v_cache[1:, 0], v_new[:, 0])


def _shared_memory_cases():
    """(name, make) -> (k_cache, v_cache, k_new, v_new) sharing memory where they must not."""

    def fresh(*shape):
        return torch.zeros(*shape, dtype=DTYPE, device=DEVICE)

    def same(kc, vc, k, v):
        return kc, kc, k, v

    def view(kc, vc, k, v):
        return kc, kc[:], k, v

    def halves(kc, vc, k, v):  # v_cache: columns D/2.. of a [.., 2D] buffer whose first D is k's
        buf = fresh(*kc.shape[:-1], 2 * D)
        return buf[..., :D], buf[..., D // 2 : D // 2 + D], k, v

    def new_in_cache(kc, vc, k, v):
        return kc, vc, kc[:, 3:4], v

    def new_in_other_cache(kc, vc, k, v):
        return kc, vc, k, kc[:, 5:6]

    def broadcast(kc, vc, k, v):
        return kc, vc[:1].expand(vc.shape), k, v

    return dict(
        same=same,
        view=view,
        halves=halves,
        new_in_cache=new_in_cache,
        new_in_other_cache=new_in_other_cache,
        broadcast=broadcast,
    )


@pytest.mark.parametrize("case", list(_shared_memory_cases()))
def test_kvcache_append_shared_memory_raises(case):
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    kc, vc = (torch.randn(2, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE) for _ in "kv")
    k, v = (torch.randn(2, 1, HKV, D, generator=gen).to(DTYPE).to(DEVICE) for _ in "kv")
    kc, vc, k, v = _shared_memory_cases()[case](kc, vc, k, v)
    before = [x.clone() for x in (kc, vc, k, v)]
    with pytest.raises(ValueError, match="share memory|broadcast"):
        portattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=3)
    assert all(torch.equal(x, b) for x, b in zip((kc, vc, k, v), before))


@pytest.mark.parametrize("layout", ["token-interleaved", "split-last-dim"])
def test_kvcache_interleaved_caches_append(layout):
    """k and v caches in one buffer that share no element (interleaved per token, or the two
    halves of one last dim) are appended to as separate caches."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    if layout == "token-interleaved":
        kv = torch.randn(2, 16, 2, HKV, D, generator=gen).to(DTYPE).to(DEVICE)
        k_cache, v_cache = kv[:, :, 0], kv[:, :, 1]
    else:
        kv = torch.randn(2, 16, HKV, 2 * D, generator=gen).to(DTYPE).to(DEVICE)
        k_cache, v_cache = kv[..., :D], kv[..., D:]
    k, v = (torch.randn(2, 1, HKV, D, generator=gen).to(DTYPE).to(DEVICE) for _ in "kv")
    out = portattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3)
    assert torch.equal(k_cache[:, 3], k[:, 0]) and torch.equal(v_cache[:, 3], v[:, 0])
    expect = portattn.flash_attn_with_kvcache(
        q, k_cache.contiguous(), v_cache.contiguous(), cache_seqlens=4
    )
    assert torch.equal(out, expect)


# --- Host syncs (issue 35) ------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("seqlens", [None, 16, "tensor"])
def test_kvcache_host_copies(monkeypatch, layout, seqlens):
    """An int or None cache_seqlens is checked from the host value it is, with no device
    round trip; a tensor is copied once per version. Other index tensors (a block table)
    are copied once per version too, so repeated calls copy nothing."""
    from portattn import validation

    gen = torch.Generator().manual_seed(10)
    batch = 2
    q = torch.randn(batch, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE)
    k_cache, v_cache = (
        torch.randn(4, 32, HKV, D, generator=gen).to(DTYPE).to(DEVICE) for _ in "kv"
    )
    kwargs = {}
    if layout == "paged":
        kwargs["block_table"] = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
        k_cache, v_cache = k_cache.view(-1, 16, HKV, D)[:4], v_cache.view(-1, 16, HKV, D)[:4]
    if seqlens == "tensor":
        seqlens = torch.tensor([16, 16], dtype=torch.int32, device=DEVICE)
    validation.forget_host_values()
    copies = []

    def spy(name: str):
        real = getattr(torch.Tensor, name)
        return lambda t, *args, **kwargs: copies.append(name) or real(t, *args, **kwargs)

    for name in ("tolist", "item", "cpu"):  # the ways a tensor's values reach the host
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    first = portattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs)
    # tolist: a block table's and a tensor cache_seqlens' values, once; nothing else
    expect = (layout == "paged") + isinstance(seqlens, torch.Tensor)
    assert copies == ["tolist"] * expect
    for _ in range(3):
        again = portattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs
        )
        assert torch.equal(again, first)
    assert len(copies) == expect


@pytest.mark.parametrize("seqlens", [None, "tensor"])
def test_kvcache_key_total_beyond_int32_raises(seqlens):
    """cu_seqlens_k, the running sum of the keys, is int32: a batch whose keys add up to more
    than 2**31 - 1 is refused (two broadcast rows of 2**30 + 8 keys stand in for a cache)."""
    capacity = 2**30 + 8
    cache = torch.zeros(1, 1, HKV, D, dtype=DTYPE, device=DEVICE).expand(2, capacity, HKV, D)
    q = torch.zeros(2, 1, HQ, D, dtype=DTYPE, device=DEVICE)
    if seqlens == "tensor":
        seqlens = torch.tensor([capacity, capacity], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"add up to 2147483664, more than 2\*\*31 - 1"):
        portattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens)


# --- Errors name this function's arguments (issue 35) --------------------------------------------


def _named_case(change):
    gen = torch.Generator().manual_seed(12)
    args = dict(
        q=torch.randn(2, 1, HQ, D, generator=gen).to(DTYPE).to(DEVICE),
        k_cache=torch.randn(2, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE),
        v_cache=torch.randn(2, 16, HKV, D, generator=gen).to(DTYPE).to(DEVICE),
        cache_seqlens=3,
    )
    change(args)
    return args


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(k_cache=a["k_cache"].float()), r"^k_cache must have the dtype of q"),
        (lambda a: a.update(v_cache=a["v_cache"][0]), r"^v_cache must be 4-D"),
        (lambda a: a.update(v_cache=a["v_cache"][..., :24]), r"^v_cache head dim must equal q's"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :8]), r"^k_cache and v_cache must have the"),
        (lambda a: a.update(return_softmax_lse=1), r"^return_softmax_lse must be a bool, got int"),
        (lambda a: a.update(kernel="k"), r"^kernel must be one of .*, got 'k'$"),
        (
            lambda a: a.update(
                k_cache=a["k_cache"][:, :8],
                v_cache=a["v_cache"][:, :8],
                block_table=torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
            ),
            r"^with a block_table, k_cache and v_cache are paged caches .* got k_cache of shape",
        ),
        (
            lambda a: a.update(block_table=torch.zeros(3, 1, dtype=torch.int32, device=DEVICE)),
            r"with B = 2 \(the batch of q\)",
        ),
    ],
)
def test_kvcache_errors_name_its_arguments(change, match):
    """The checks shared with varlen_attention name k_cache / v_cache / return_softmax_lse,
    as this function's caller knows them."""
    args = _named_case(change)
    with pytest.raises((TypeError, ValueError), match=match):
        portattn.flash_attn_with_kvcache(**args)
