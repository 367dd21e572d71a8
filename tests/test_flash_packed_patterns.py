"""flash-attn 2's own test call patterns for the packed entry points (issue 39, acceptance),
at small sizes: ``test_flash_attn_qkvpacked``, ``test_flash_attn_varlen_qkvpacked`` and the
``kvpacked=True`` branches of ``test_flash_attn_output`` / ``test_flash_attn_varlen_output``.
Each call is spelled as flash-attn's tests spell it (``dropout_p`` positional, a window drawn
with ``torch.randint`` as a tensor, ``alibi_slopes=None``, ``deterministic``,
``return_attn_probs=True`` unpacked into three values, padded batches through
``bert_padding.unpad_input`` / ``pad_input``, gradients with ``torch.autograd.grad``) and held
to portattn's accuracy rule against the float64 reference (flash-attn's: 2x PyTorch's error)."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE

from portattn import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from portattn.bert_padding import pad_input, unpad_input
from portattn.reference import reference_attention, reference_varlen_attention
from portattn.tools import harness

DT = torch.float16


def _assert_accurate(name: str, got: torch.Tensor, ref64: torch.Tensor, eager: torch.Tensor):
    assert not torch.isnan(got).any(), f"{name} has NaN"
    err, base, bound = harness.measure(name, got, ref64, eager)
    assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g} (2 x eager {base:.3g} + margin)"


def _window(local: bool, seqlen: int) -> torch.Tensor | tuple[int, int]:
    # flash-attn's tests: ``(-1, -1) if not local else torch.randint(0, seqlen, (2,))``
    return torch.randint(0, seqlen, (2,)) if local else (-1, -1)


def _references(q, k, v, g, reference, **kw):
    """(out, dq, dk, dv) of ``reference`` in float64 and eagerly in q's dtype."""
    results = []
    for dtype in (torch.float64, q.dtype):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out, _ = reference(*leaves, **kw)
        grads = torch.autograd.grad(out, leaves, g.to(dtype))
        results.append((out, *grads))
    return results


def _random_padding_mask(seqlen: int, batch: int, seed: int) -> torch.Tensor:
    # flash-attn's generate_random_padding_mask(mode="random"): lengths in [max(1, S - 20), S]
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, seqlen - 20), seqlen + 1, (batch, 1), generator=gen)
    return (torch.arange(seqlen)[None, :] < lengths).to(DEVICE)


@pytest.mark.parametrize(("seqlen", "d", "causal", "local"), [
    (17, 32, False, False), (33, 40, True, False), (33, 64, False, True), (17, 40, True, True),
])  # fmt: skip
def test_flash_attn_qkvpacked_pattern(seqlen, d, causal, local):
    torch.random.manual_seed(0)
    batch_size, nheads, dropout_p, deterministic = 2, 3, 0.0, True
    window_size = _window(local, seqlen)
    qkv = torch.randn(batch_size, seqlen, 3, nheads, d, dtype=DT).to(DEVICE).requires_grad_()
    out, lse, S_dmask = flash_attn_qkvpacked_func(
        qkv,
        dropout_p,
        causal=causal,
        window_size=window_size,
        alibi_slopes=None,
        deterministic=deterministic,
        return_attn_probs=True,
    )
    g = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, g)
    window = tuple(int(w) for w in window_size)
    ref64, eager = _references(
        *qkv.unbind(2), g, reference_attention, causal=causal, window_size=window
    )
    for i, (name, got) in enumerate(zip(("out", "dq", "dk", "dv"), (out, *dqkv.unbind(2)))):
        _assert_accurate(name, got, ref64[i], eager[i])
    assert lse.shape == (batch_size, nheads, seqlen) and lse.dtype == torch.float32


@pytest.mark.parametrize(("seqlen", "d", "causal", "local"), [
    (33, 32, True, False), (47, 40, False, True),
])  # fmt: skip
def test_flash_attn_varlen_qkvpacked_pattern(seqlen, d, causal, local):
    torch.random.manual_seed(0)
    batch_size, nheads, dropout_p, deterministic = 3, 2, 0.0, True
    window_size = _window(local, seqlen)
    qkv = torch.randn(batch_size, seqlen, 3, nheads, d, dtype=DT).to(DEVICE)
    key_padding_mask = _random_padding_mask(seqlen, batch_size, seed=1)
    # flash-attn's generate_qkv(..., qkvpacked=True): unpad q, k, v by one mask, stack them
    q_unpad, indices, cu_seqlens, max_seqlen, *_ = unpad_input(qkv[:, :, 0], key_padding_mask)
    k_unpad = unpad_input(qkv[:, :, 1], key_padding_mask)[0]
    v_unpad = unpad_input(qkv[:, :, 2], key_padding_mask)[0]
    qkv_unpad = torch.stack([q_unpad, k_unpad, v_unpad], dim=1).detach().requires_grad_()
    out_unpad, sm_lse, S_dmask = flash_attn_varlen_qkvpacked_func(
        qkv_unpad,
        cu_seqlens,
        max_seqlen,
        dropout_p,
        causal=causal,
        window_size=window_size,
        alibi_slopes=None,
        deterministic=deterministic,
        return_attn_probs=True,
    )
    out = pad_input(out_unpad, indices, batch_size, seqlen)
    assert torch.equal(out[~key_padding_mask], torch.zeros_like(out[~key_padding_mask]))
    g = torch.randn_like(out)
    (dqkv_unpad,) = torch.autograd.grad(out, qkv_unpad, g)
    window = tuple(int(w) for w in window_size)
    ref64, eager = _references(
        *qkv_unpad.unbind(1), g[key_padding_mask], reference_varlen_attention,
        cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, causal=causal, window_size=window,
    )  # fmt: skip
    for i, (name, got) in enumerate(
        zip(("out", "dq", "dk", "dv"), (out_unpad, *dqkv_unpad.unbind(1)))
    ):
        _assert_accurate(name, got, ref64[i], eager[i])
    assert sm_lse.shape == (nheads, int(cu_seqlens[-1]))


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "d", "causal", "local", "softcap"), [
    (17, 33, 32, True, False, 0.0), (33, 17, 40, False, True, 0.0), (23, 23, 64, True, True, 5.0),
])  # fmt: skip
def test_flash_attn_kvpacked_pattern(seqlen_q, seqlen_k, d, causal, local, softcap):
    torch.random.manual_seed(0)
    batch_size, nheads, nheads_k, dropout_p, deterministic = 2, 4, 2, 0.0, True
    window_size = _window(local, seqlen_k)
    q = torch.randn(batch_size, seqlen_q, nheads, d, dtype=DT).to(DEVICE).requires_grad_()
    kv = torch.randn(batch_size, seqlen_k, 2, nheads_k, d, dtype=DT).to(DEVICE)
    kv.requires_grad_()
    out, lse, S_dmask = flash_attn_kvpacked_func(
        q,
        kv,
        dropout_p,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=None,
        deterministic=deterministic,
        return_attn_probs=True,
    )
    g = torch.randn_like(out)
    dq, dkv = torch.autograd.grad(out, (q, kv), g)
    window = tuple(int(w) for w in window_size)
    ref64, eager = _references(
        q, *kv.unbind(2), g, reference_attention, causal=causal, window_size=window,
        softcap=softcap,
    )  # fmt: skip
    for i, (name, got) in enumerate(zip(("out", "dq", "dk", "dv"), (out, dq, *dkv.unbind(2)))):
        _assert_accurate(name, got, ref64[i], eager[i])


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "causal", "local"), [
    (33, 47, True, False), (47, 33, False, True),
])  # fmt: skip
def test_flash_attn_varlen_kvpacked_pattern(seqlen_q, seqlen_k, causal, local):
    torch.random.manual_seed(0)
    batch_size, nheads, nheads_k, d, dropout_p, deterministic = 3, 4, 1, 40, 0.0, True
    window_size = _window(local, seqlen_k)
    q = torch.randn(batch_size, seqlen_q, nheads, d, dtype=DT).to(DEVICE)
    kv = torch.randn(batch_size, seqlen_k, 2, nheads_k, d, dtype=DT).to(DEVICE)
    query_padding_mask = _random_padding_mask(seqlen_q, batch_size, seed=2)
    key_padding_mask = _random_padding_mask(seqlen_k, batch_size, seed=3)
    q_unpad, indices_q, cu_seqlens_q, max_seqlen_q, *_ = unpad_input(q, query_padding_mask)
    kv_unpad, _, cu_seqlens_k, max_seqlen_k, *_ = unpad_input(kv, key_padding_mask)
    q_unpad = q_unpad.detach().requires_grad_()
    kv_unpad = kv_unpad.detach().requires_grad_()
    out_unpad, sm_lse, S_dmask = flash_attn_varlen_kvpacked_func(
        q_unpad,
        kv_unpad,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p,
        causal=causal,
        window_size=window_size,
        alibi_slopes=None,
        deterministic=deterministic,
        return_attn_probs=True,
    )
    out = pad_input(out_unpad, indices_q, batch_size, seqlen_q)
    g = torch.randn_like(out)
    dq_unpad, dkv_unpad = torch.autograd.grad(out, (q_unpad, kv_unpad), g)
    window = tuple(int(w) for w in window_size)
    ref64, eager = _references(
        q_unpad, *kv_unpad.unbind(1), g[query_padding_mask], reference_varlen_attention,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal, window_size=window,
    )  # fmt: skip
    for i, (name, got) in enumerate(
        zip(("out", "dq", "dk", "dv"), (out_unpad, dq_unpad, *dkv_unpad.unbind(1)))
    ):
        _assert_accurate(name, got, ref64[i], eager[i])
