"""attention() on [B, S, H, D] tensors laid out as transformers hands them over: the KV cache
grown along S in [B, H, S, D] memory and a decode step's q are read in place (batch folded into
the heads), with the bits of the contiguous call (batch folded into the tokens); which fold
runs and what it copies (portattn.dense_layout)."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE

import portattn
from portattn.dense_layout import MAX_GRID_HEADS, dense_layout
from portattn.reference import reference_attention

KERNELS = ("varlen", "fixed_order")
NAMES = ("out", "lse", "dq", "dk", "dv")


def _bhsd(batch: int, seqlen: int, heads: int, dim: int, gen, capacity: int = 0):
    """[B, S, H, D] view of [B, H, S, D] memory (a cache of ``capacity`` >= S slots: the view is
    its first S, as a static cache's slice)."""
    full = torch.randn(batch, heads, max(capacity, seqlen), dim, generator=gen)
    return full.half().to(DEVICE)[:, :, :seqlen].transpose(1, 2)


def _bshd(batch: int, seqlen: int, heads: int, dim: int, gen):
    return torch.randn(batch, seqlen, heads, dim, generator=gen).half().to(DEVICE)


def _run(q, k, v, kernel: str, causal: bool) -> dict[str, torch.Tensor]:
    """out, lse and the gradients of (out * do).sum() + (lse * dlse).sum() of ``attention``."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out, lse = portattn.attention(*leaves, causal=causal, return_lse=True, kernel=kernel)
    gen = torch.Generator().manual_seed(5)
    do = torch.randn(out.shape, generator=gen).to(out)
    dlse = torch.randn(lse.shape, generator=gen).to(lse)
    torch.autograd.backward((out, lse), (do, dlse))
    return dict(zip(NAMES, (out, lse, *(x.grad for x in leaves)), strict=True))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seqlen_q", [1, 17])
def test_heads_fold_gives_the_bits_of_the_contiguous_call(kernel, causal, seqlen_q):
    """A KV cache in [B, H, S, D] memory (a static cache's first 33 of 40 slots), GQA 4/2, with
    q of a decode step or a prefill chunk in the same memory layout: out, lse, dq, dk and dv
    equal those of contiguous copies bitwise, and out is accurate (float64 reference)."""
    gen = torch.Generator().manual_seed(3)
    batch, seqlen_k, hq, hk, d = 3, 33, 4, 2, 64
    q = _bhsd(batch, seqlen_q, hq, d, gen)
    k, v = (_bhsd(batch, seqlen_k, hk, d, gen, capacity=40) for _ in range(2))
    layout = dense_layout(q, k, v, None)
    assert layout.heads
    for x in (q, k, v):
        assert _same_storage(layout.packed(x), x)  # read in place
    folded = _run(q, k, v, kernel, causal)
    plain = _run(*(x.contiguous() for x in (q, k, v)), kernel, causal)
    assert not dense_layout(*(x.contiguous() for x in (q, k, v)), None).heads
    for name in NAMES:
        assert folded[name].shape == plain[name].shape, name
        assert torch.equal(folded[name], plain[name]), name
    assert not folded["out"].isnan().any()
    ref, _ = reference_attention(q, k, v, causal=causal)
    assert (folded["out"].double() - ref).norm() / ref.norm() < 2e-3
    assert folded["out"].is_contiguous() == (seqlen_q == 1)


@pytest.mark.parametrize("kernel", KERNELS)
def test_mixed_layouts_copy_the_smaller_side(kernel):
    """A prefill chunk's q in BSHD memory (tokens fold) against a KV cache in BHSD memory
    (heads fold): the heads fold runs, q alone is copied (fewer elements than k and v), the
    bits are those of the contiguous call."""
    gen = torch.Generator().manual_seed(4)
    q = _bshd(2, 9, 4, 32, gen)
    k, v = (_bhsd(2, 30, 2, 32, gen) for _ in range(2))
    layout = dense_layout(q, k, v, None)
    assert layout.heads
    assert not _same_storage(layout.packed(q), q)
    assert _same_storage(layout.packed(k), k) and _same_storage(layout.packed(v), v)
    folded = _run(q, k, v, kernel, True)
    plain = _run(*(x.contiguous() for x in (q, k, v)), kernel, True)
    for name in NAMES:
        assert torch.equal(folded[name], plain[name]), name


def test_fold_choice():
    """Tokens where all three merge batch and sequence (contiguous input, batches of one);
    heads where all three merge batch and heads; otherwise the one copying fewer elements; never
    heads with sinks or past the grid's head limit (shapes only: meta tensors)."""

    def bshd(b, s, h, d=8):
        return torch.empty(b, s, h, d, device="meta")

    def bhsd(b, s, h, d=8):
        return torch.empty(b, h, s, d, device="meta").transpose(1, 2)

    assert not dense_layout(bshd(2, 5, 4), bshd(2, 7, 2), bshd(2, 7, 2), None).heads
    assert not dense_layout(bhsd(1, 5, 4), bhsd(1, 7, 2), bhsd(1, 7, 2), None).heads  # B == 1
    assert dense_layout(bhsd(2, 5, 4), bhsd(2, 7, 2), bhsd(2, 7, 2), None).heads
    assert dense_layout(bshd(2, 1, 4), bhsd(2, 7, 2), bhsd(2, 7, 2), None).heads  # decode q
    # k, v copied by tokens (2 * 2 * 7 * 2 * 8) vs q by heads (2 * 50 * 4 * 8): tokens
    assert not dense_layout(bshd(2, 50, 4), bhsd(2, 7, 2), bhsd(2, 7, 2), None).heads
    sinks = torch.zeros(4, device="meta")
    assert not dense_layout(bhsd(2, 5, 4), bhsd(2, 7, 2), bhsd(2, 7, 2), sinks).heads
    wide = MAX_GRID_HEADS // 2 + 1  # B * Hq past the limit with B = 2
    assert not dense_layout(bhsd(2, 1, wide), bhsd(2, 7, 2), bhsd(2, 7, 2), None).heads
    assert not dense_layout(bhsd(2, 0, 4), bhsd(2, 7, 2), bhsd(2, 7, 2), None).heads  # Sq 0


def test_kept_signature_folds_once(monkeypatch):
    """No-grad calls of one call signature (a decode step's layers) fold once: the fold and its
    views are functions of the shapes and strides, kept with the signature (``FoldViews``: the
    tensors that fit the fold viewed in place, the others copied). Three signatures, each
    called twice with new tensors: transformers' decode layout (heads fold, all in place), a
    contiguous call (tokens fold) and a prefill chunk's BSHD q against the BHSD cache (heads
    fold, q copied), then the first's again with k and v at an offset into their memory;
    every call gives the bits of the contiguous call."""
    from portattn import api

    folds = []
    real = api.FoldViews.record
    monkeypatch.setattr(api.FoldViews, "record", lambda *a: folds.append(real(*a)) or folds[-1])
    gen = torch.Generator().manual_seed(6)
    makers = [
        lambda: (_bhsd(2, 1, 4, 32, gen), *(_bhsd(2, 21, 2, 32, gen, capacity=30) for _ in "kv")),
        lambda: (_bshd(2, 1, 4, 32, gen), _bshd(2, 21, 2, 32, gen), _bshd(2, 21, 2, 32, gen)),
        lambda: (_bshd(2, 5, 4, 32, gen), *(_bhsd(2, 21, 2, 32, gen) for _ in "kv")),
        lambda: (_bhsd(2, 1, 4, 32, gen), *(_bhsd(2, 30, 2, 32, gen)[:, 9:] for _ in "kv")),
    ]
    for make in makers:
        for _ in range(2):
            q, k, v = make()
            with torch.no_grad():
                out = portattn.attention(q, k, v, causal=True)
            # with grad: the unkept path, which folds every call and keeps no views
            contiguous = (x.contiguous().requires_grad_() for x in (q, k, v))
            assert torch.equal(out, portattn.attention(*contiguous, causal=True))
    by_signature = [(f.layout.heads, [view is not None for view in f.inputs]) for f in folds]
    assert by_signature == [
        (True, [True, True, True]),  # transformers' decode layout, read in place
        (False, [True, True, True]),  # contiguous
        (True, [False, True, True]),  # q copied into the heads fold
    ]  # the fourth: the first's signature, its views made at another storage offset
