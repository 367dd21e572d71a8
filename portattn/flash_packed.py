"""flash-attn 2's packed entry points: ``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func`` and their varlen forms, computed by portattn.

Same argument order, defaults and return conventions as ``flash_attn.flash_attn_interface``
(flash-attn 2.6 to 2.8). Each takes views of its packed tensor (``qkv[:, :, 0]``, ...: no copy;
the kernels read strided rows) and calls :func:`portattn.flash_attn_func` /
:func:`portattn.flash_attn_varlen_func`, so errors, features and returns are theirs. The
gradient of the packed tensor is the packed gradients, as in flash-attn.
"""

from __future__ import annotations

import torch

from portattn.flash_compat import flash_attn_func, flash_attn_varlen_func
from portattn.validation import type_name

__all__ = [
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]


def _unpack(name: str, x, parts: int, dim: int, layout: str) -> tuple[torch.Tensor, ...]:
    """Views of the ``parts`` tensors packed along ``dim`` of ``x`` (ValueError / TypeError
    naming ``layout`` where ``x`` is not such a tensor)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
    if x.dim() != dim + 3 or x.shape[dim] != parts:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")
    return x.unbind(dim)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_qkvpacked_func``: ``qkv`` [B, S, 3, H, D]; the rest as
    :func:`portattn.flash_attn_func`. Returns out [B, S, H, D] (and with
    ``return_attn_probs`` the lse [B, H, S] and an empty ``S_dmask``)."""
    q, k, v = _unpack("qkv", qkv, 3, 2, "[B, S, 3, H, D]")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, kernel=kernel,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_kvpacked_func``: ``q`` [B, Sq, Hq, D], ``kv`` [B, Sk, 2,
    Hkv, D]; the rest as :func:`portattn.flash_attn_func`."""
    k, v = _unpack("kv", kv, 2, 2, "[B, Sk, 2, Hkv, D]")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, kernel=kernel,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_varlen_qkvpacked_func``: ``qkv`` [total, 3, H, D] with one
    ``cu_seqlens`` / ``max_seqlen`` for queries and keys; the rest as
    :func:`portattn.flash_attn_varlen_func`. Returns out [total, H, D] (and with
    ``return_attn_probs`` the lse [H, total] and an empty ``S_dmask``)."""
    q, k, v = _unpack("qkv", qkv, 3, 1, "[total, 3, H, D]")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        kernel=kernel,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_varlen_kvpacked_func``: ``q`` [total_q, Hq, D], ``kv``
    [total_k, 2, Hkv, D]; the rest as :func:`portattn.flash_attn_varlen_func`."""
    k, v = _unpack("kv", kv, 2, 1, "[total_k, 2, Hkv, D]")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, kernel=kernel,
    )  # fmt: skip
