"""Drop-in replacements for flash-attn 2's ``flash_attn_varlen_func`` and ``flash_attn_func``.

Same argument order, defaults and return conventions as ``flash_attn.flash_attn_interface``
(flash-attn 2.6 to 2.8), computed by portattn's kernels, so that::

    from flash_attn import flash_attn_varlen_func      # becomes
    from portattn import flash_attn_varlen_func

is the only change a caller needs, as long as it uses the supported features. Features portattn
does not implement (dropout, ALiBi) raise a ValueError naming
the feature; nothing is silently ignored except ``deterministic``, which portattn always is.
"""

from __future__ import annotations

import numbers

import torch

from portattn.api import attention, varlen_attention
from portattn.validation import check_bool, type_name

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]  # flash_attn_with_kvcache: kvcache.py


def max_seqlen_arg(name: str, value):
    """A ``max_seqlen_q`` / ``max_seqlen_k`` as callers of flash-attn pass it: an int, a numpy
    integer, ``None`` (portattn derives it), a symbolic int under ``torch.compile``, or a 0-d
    integer tensor (what transformers' ``prepare_fa_kwargs_from_position_ids`` returns), which
    is read to a Python int: ``int(value)`` in eager mode (a device-to-host copy for a GPU
    tensor), ``value.item()`` while ``torch.compile`` traces (a graph break unless
    ``torch._dynamo.config.capture_scalar_outputs`` is on, then an unbacked symbolic int).
    Anything else is left to portattn's own check, which raises a TypeError for bools, floats
    and other types. A tensor of a bool or floating dtype is a TypeError, a tensor with
    dimensions a ValueError."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex:
        raise TypeError(
            f"{name} must be an int or a 0-d integer tensor, got a tensor of dtype {value.dtype}"
        )
    if value.dim() != 0:
        raise ValueError(
            f"{name} must be an int or a 0-d integer tensor, got a tensor of shape "
            f"{tuple(value.shape)}"
        )
    return value.item() if torch.compiler.is_compiling() else int(value)


def _unsupported(feature: str, arg: str, value) -> ValueError:
    return ValueError(
        f"{feature} is not supported by portattn ({arg}={value!r}); portattn implements plain "
        "softmax attention with an optional bottom-right causal mask"
    )


def _resolve_features(
    dropout_p, causal, alibi_slopes, deterministic, return_attn_probs
) -> tuple[bool, bool]:
    """Reject what portattn does not implement and check the flags (bools or numpy bools);
    returns ``causal`` and ``return_attn_probs`` as Python bools. The other options go on to
    ``varlen_attention`` / ``attention``, whose ``check_options`` checks them (and makes
    ``(-1, 0)`` causal, as flash-attn does) before any launch."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type_name(dropout_p)}")
    if dropout_p != 0:
        raise _unsupported("attention dropout (dropout_p > 0)", "dropout_p", dropout_p)
    if alibi_slopes is not None:
        raise _unsupported("ALiBi (alibi_slopes)", "alibi_slopes", type_name(alibi_slopes))
    causal = check_bool("causal", causal)
    check_bool("deterministic", deterministic)  # ignored, but a flag all the same
    return causal, check_bool("return_attn_probs", return_attn_probs)


def _no_attn_probs(q: torch.Tensor) -> torch.Tensor:
    # flash-attn returns an empty tensor for S_dmask when dropout is off.
    return torch.empty((0,), dtype=q.dtype, device=q.device)


def flash_attn_varlen_func(
    q,
    k,
    v,
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
    block_table=None,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_varlen_func``, computed by portattn.

    Args:
        q: [total_q, Hq, D] float16 or bfloat16, ``stride(-1) == 1``.
        k, v: [total_k, Hkv, D] and [total_k, Hkv, Dv], ``Hq % Hkv == 0`` (GQA/MQA as in
            flash-attn; Dv: D, or v's own head dim as flash-attn 3/4 take it, e.g. 128 with
            D 192).
        cu_seqlens_q, cu_seqlens_k: int32 [B + 1] cumulative sequence lengths.
        max_seqlen_q, max_seqlen_k: ints, at least the longest query / key sequence. Numpy
            integers and 0-d integer tensors are accepted too (a tensor is read with ``int()``,
            a host copy; under ``torch.compile`` with ``.item()``, a graph break unless
            ``torch._dynamo.config.capture_scalar_outputs`` is on); bools and floats, as
            Python values or tensors, are a TypeError.
        dropout_p: must be 0.0 (dropout is not supported: ValueError).
        softmax_scale: default ``1 / sqrt(D)``; at most 2**16 (see
            :func:`portattn.varlen_attention`).
        causal: bottom-right aligned causal mask (flash-attn >= 2.1 convention).
        window_size: ``(left, right)`` sliding window, -1 unbounded (flash-attn's
            convention; ``(-1, 0)`` is causal): see :func:`portattn.varlen_attention`. As in
            flash-attn, also a 1-D integer tensor of two elements or a pair of 0-d integer
            tensors (read to the host: for a GPU tensor a device-to-host copy that waits for
            the GPU, as flash-attn's conversion to ints does) or numpy integers.
        softcap: 0.0 (off) or the cap ``c`` of the scores ``c * tanh(scale * q.k / c)``, from
            2**-16 to 2**10 (``validation_params.SOFTCAP_MAX``: the float32 tanh's error grows
            with the cap).
        alibi_slopes: must be None (ValueError otherwise).
        deterministic: accepted and ignored: portattn's forward and backward are always
            deterministic (atomic-free, fixed order).
        return_attn_probs: also return ``softmax_lse`` and ``S_dmask`` (a bool, as
            ``causal`` and ``deterministic``; numpy bools are accepted).
        block_table: None, or int32 [B, pages_per_seq]: k and v are then paged caches
            [num_pages, page_size, Hkv, D] and cu_seqlens_k counts each sequence's keys, as
            in flash-attn (see :func:`portattn.varlen_attention`; inference only).
        kernel: portattn's kernel, ``"varlen"`` or ``"fixed_order"`` (keyword only; not in
            flash-attn).

    Returns:
        ``out`` [total_q, Hq, Dv]; with ``return_attn_probs``, ``(out, softmax_lse, S_dmask)``:
        ``softmax_lse`` float32 [Hq, total_q] (flash-attn's varlen layout, contiguous) and
        ``S_dmask`` an empty tensor (what flash-attn returns when dropout is off).

    Differences from flash-attn: rows that see no key (``Sk == 0``, or causal with
    ``Sq > Sk``) get lse ``-inf`` (flash-attn writes ``+inf``); ``softmax_lse`` is
    differentiable (flash-attn drops its gradient); the features above raise instead of
    running. Validation errors are portattn's (ValueError / TypeError naming the argument);
    where flash-attn raises a RuntimeError for an index value outside the cache (a block table
    page, a key count beyond the pages), portattn raises :class:`portattn.CacheIndexError`,
    both a ValueError and a RuntimeError.
    """
    causal, return_attn_probs = _resolve_features(
        dropout_p, causal, alibi_slopes, deterministic, return_attn_probs
    )
    max_seqlen_q = max_seqlen_arg("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = max_seqlen_arg("max_seqlen_k", max_seqlen_k)
    out, lse = varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal=causal,
        softmax_scale=softmax_scale,
        return_lse=True,  # flash-attn computes it always
        kernel=kernel,
        block_table=block_table,
        window_size=window_size,
        softcap=softcap,
    )
    if not return_attn_probs:
        return out
    return out, lse.transpose(0, 1).contiguous(), _no_attn_probs(q)


def flash_attn_func(
    q,
    k,
    v,
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
    """flash-attn 2's ``flash_attn_func`` (dense BSHD), computed by portattn.

    Args:
        q: [B, Sq, Hq, D] float16 or bfloat16, ``stride(-1) == 1``.
        k, v: [B, Sk, Hkv, D] and [B, Sk, Hkv, Dv], ``Hq % Hkv == 0``.
        Other arguments as in :func:`flash_attn_varlen_func`.

    Returns:
        ``out`` [B, Sq, Hq, Dv]; with ``return_attn_probs``, ``(out, softmax_lse, S_dmask)`` with
        ``softmax_lse`` float32 [B, Hq, Sq] (contiguous) and ``S_dmask`` an empty tensor.
        Same differences from flash-attn as :func:`flash_attn_varlen_func`.
    """
    causal, return_attn_probs = _resolve_features(
        dropout_p, causal, alibi_slopes, deterministic, return_attn_probs
    )
    out, lse = attention(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        return_lse=True,  # flash-attn computes it always
        kernel=kernel,
        window_size=window_size,
        softcap=softcap,
    )
    if not return_attn_probs:
        return out
    return out, lse.contiguous(), _no_attn_probs(q)
