"""flash-attn 2's packed entry points and ``bert_padding`` (issue 39, item 8): the packed forms
give the bits of the unpacked calls on views of the packed tensor (no copy), with flash-attn's
signatures; ``unpad_input`` / ``pad_input`` follow flash-attn 2.7's conventions."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import DEVICE, cu_seqlens

import portattn
from portattn.bert_padding import pad_input, unpad_input
from portattn.validation import DTypeError

DT = torch.float16
FLASH_ATTN_ARGS = [  # flash-attn 2.8's parameters after the tensors (kernel is portattn's)
    "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
    "deterministic", "return_attn_probs", "kernel",
]  # fmt: skip


def _rand(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DT).to(DEVICE)


@pytest.mark.parametrize(
    ("func", "lead"),
    [
        (portattn.flash_attn_qkvpacked_func, ["qkv"]),
        (portattn.flash_attn_kvpacked_func, ["q", "kv"]),
        (portattn.flash_attn_varlen_qkvpacked_func, ["qkv", "cu_seqlens", "max_seqlen"]),
        (
            portattn.flash_attn_varlen_kvpacked_func,
            ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
        ),
    ],
)
def test_signatures_are_flash_attns(func, lead):
    assert list(inspect.signature(func).parameters) == lead + FLASH_ATTN_ARGS


def _grads(out, leaves, seed=9):
    out.backward(_rand(*out.shape, seed=seed))
    grads = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    return grads


def test_qkvpacked_equals_unpacked_calls():
    qkv = _rand(2, 37, 3, 2, 64).requires_grad_()
    out, lse, _ = portattn.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    (d_qkv,) = _grads(out, [qkv])
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    want, want_lse, _ = portattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    d_q, d_k, d_v = _grads(want, [q, k, v])
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(d_qkv, torch.stack([d_q, d_k, d_v], dim=2))


def test_kvpacked_equals_unpacked_call():
    q, kv = _rand(2, 5, 4, 64, seed=1), _rand(2, 40, 2, 2, 64, seed=2)
    out = portattn.flash_attn_kvpacked_func(q, kv, causal=True, softcap=3.0)
    k, v = kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous()
    assert torch.equal(out, portattn.flash_attn_func(q, k, v, causal=True, softcap=3.0))


def test_varlen_packed_equal_unpacked_calls():
    lens = [17, 1, 40]
    cu = cu_seqlens(lens)
    qkv = _rand(sum(lens), 3, 2, 64, seed=3).requires_grad_()
    out = portattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    (d_qkv,) = _grads(out, [qkv])
    q, k, v = (qkv.detach()[:, i].clone().requires_grad_() for i in range(3))
    want = portattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert torch.equal(out, want)
    assert torch.equal(d_qkv, torch.stack(_grads(want, [q, k, v]), dim=1))
    kv = qkv.detach()[:, 1:]
    out = portattn.flash_attn_varlen_kvpacked_func(
        q.detach(), kv, cu, cu, max(lens), max(lens), window_size=(5, 0)
    )
    want = portattn.flash_attn_varlen_func(
        q.detach(), k.detach(), v.detach(), cu, cu, max(lens), max(lens), window_size=(5, 0)
    )
    assert torch.equal(out, want)


def test_packed_views_share_the_packed_storage():
    qkv = _rand(2, 8, 3, 2, 64)
    for part in qkv.unbind(2):  # what the packed functions pass on
        assert part.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: portattn.flash_attn_qkvpacked_func(_rand(2, 8, 2, 2, 64)), ValueError),
        (lambda: portattn.flash_attn_qkvpacked_func(_rand(2, 8, 3, 64)), ValueError),
        (lambda: portattn.flash_attn_kvpacked_func(_rand(2, 8, 2, 64), [1]), TypeError),
        (
            lambda: portattn.flash_attn_varlen_kvpacked_func(
                _rand(8, 2, 64), _rand(8, 3, 2, 64), cu_seqlens([8]), cu_seqlens([8]), 8, 8
            ),
            ValueError,
        ),
    ],
)
def test_bad_packed_tensors_are_rejected(call, error):
    with pytest.raises(error, match="must be"):
        call()


def test_unpad_pad_round_trip():
    x = _rand(3, 6, 2, 4)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], device=DEVICE
    ).bool()
    packed, indices, cu, max_seqlen, used = unpad_input(x, mask)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 9, 9]
    assert max_seqlen == 6 and used.tolist() == [3, 6, 0]
    assert torch.equal(packed, x[mask])
    back = pad_input(packed, indices, 3, 6)
    assert torch.equal(back, torch.where(mask[:, :, None, None], x, torch.zeros_like(x)))
    unused = torch.zeros_like(mask)
    unused[0, 3] = True
    _, _, cu, _, used = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 4, 10, 10] and used.tolist() == [3, 6, 0]


def test_unpad_input_rejects_a_mask_of_another_shape():
    with pytest.raises(ValueError, match="attention_mask must be"):
        unpad_input(_rand(2, 6, 4), torch.ones(2, 5, dtype=torch.bool, device=DEVICE))


def test_float32_error_says_how_to_run():
    q = _rand(1, 4, 2, 64).float()
    with pytest.raises(DTypeError, match="torch.autocast"):
        portattn.flash_attn_func(q, q, q)
