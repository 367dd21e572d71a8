"""flash-attn 2's public interface (``flash_attn.flash_attn_interface``), computed by portattn:
``flash_attn_varlen_func``, ``flash_attn_func``, the packed forms (``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func`` and their varlen forms) and ``flash_attn_with_kvcache``.

Same argument order, defaults and return conventions as flash-attn 2.6 to 2.8, so that::

    from flash_attn import flash_attn_varlen_func      # becomes
    from portattn import flash_attn_varlen_func

is the only change a caller needs, as long as it uses the supported features. Features portattn
does not implement (dropout, ALiBi, rotary inside attention, left-padded caches) raise a
ValueError naming the feature; nothing is silently ignored except ``deterministic``, which
portattn always is. Each function here is a signature: it rejects those features and hands its
arguments to :func:`portattn.varlen_attention`, :func:`portattn.attention` or
:func:`portattn.kvcache.kvcache_attention`, whose checks and records are the rest.
"""

from __future__ import annotations

import numbers

import torch

from portattn.api import attention, varlen_attention
from portattn.kvcache import kvcache_attention
from portattn.options import CallScalars
from portattn.validation import check_bool, type_name

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


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
            2**-16 to 2**10 (``options.SOFTCAP_MAX``: the float32 tanh's error grows
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


# flash-attn 2's packed forms: views of the packed tensor (``qkv[:, :, 0]``, ...: no copy;
# the kernels read strided rows) handed to the functions above, so errors, features and returns
# are theirs; the gradient of the packed tensor is the packed gradients, as in flash-attn.


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


def _kvcache_unsupported(feature: str, arg: str) -> ValueError:
    return ValueError(f"{feature} is not supported by portattn's flash_attn_with_kvcache ({arg})")


def _check_kvcache_features(
    rotary_cos, rotary_sin, cache_leftpad, alibi_slopes, num_splits
) -> None:
    if rotary_cos is not None or rotary_sin is not None:
        raise _kvcache_unsupported("rotary embedding inside attention", "rotary_cos / rotary_sin")
    if cache_leftpad is not None:
        raise _kvcache_unsupported("left-padded caches", "cache_leftpad")
    if alibi_slopes is not None:
        raise _kvcache_unsupported("ALiBi", "alibi_slopes")
    if type(num_splits) is not int and (  # an int passes without the ABC check
        isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)
    ):
        raise TypeError(f"num_splits must be an int, got {type_name(num_splits)}")
    if num_splits not in (0, 1):
        raise ValueError(
            f"num_splits must be 0 (choose) or 1: a sequence's keys split only at the table "
            f"entry's fixed key chunk (its rows keep the trainer's bits), got {num_splits}"
        )


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    kernel: str = "varlen",
):
    """flash-attn 2's ``flash_attn_with_kvcache``: attention of new query rows against a KV
    cache, optionally appending new keys and values to it first (in place).

    Args:
        q: [B, Sq, Hq, D] float16 or bfloat16 (Sq from 1, a decode step, to a few hundred).
        k_cache, v_cache: dense [B_cache, S_cache, Hkv, D] (``Hq % Hkv == 0``), or with
            ``block_table`` paged [num_pages, page_size, Hkv, D] (page_size a power of two
            from 16 to 256). Written in place when ``k``/``v`` are given. v_cache may have a
            head dim Dv of its own (as in :func:`portattn.varlen_attention`).
        k, v: None, or [B, S_new, Hkv, D] and [B, S_new, Hkv, Dv]: appended at positions
            ``cache_seqlens[b]`` onwards of sequence ``b``'s cache before the attention
            (``cache_seqlens`` is not updated, as in flash-attn).
        rotary_cos, rotary_sin, cache_leftpad, alibi_slopes: must be None (ValueError).
        window_size, softcap: a sliding window and the scores' cap, as in
            :func:`portattn.varlen_attention` (a row's bytes are those of the prefill with
            them).
        cache_seqlens: int32 [B] (or an int for all, or None for the full cache): the keys in
            each sequence's cache before the append; the attention sees ``cache_seqlens[b] +
            S_new`` keys.
        cache_batch_idx: int32 [B] or None (``0..B-1``): the cache row of each sequence
            (dense caches only; rows must not repeat when appending).
        block_table: int32 [B, pages_per_seq] or None: the pages of each sequence (paged).
        softmax_scale: default ``1 / sqrt(D)``.
        causal: bottom-right aligned: query row ``i`` sees keys ``j <= i + Sk - Sq``.
        rotary_interleaved: accepted (it only matters with rotary_cos).
        num_splits: 0 or 1 (keys split only at the entry's fixed chunk: ValueError otherwise).
        return_softmax_lse: also return the lse, float32 [B, Hq, Sq] (natural log).
        kernel: ``"varlen"`` or ``"fixed_order"`` (keyword only, not in flash-attn).

    Returns:
        out [B, Sq, Hq, Dv], or ``(out, softmax_lse)``. Rows that see no key get out 0 and lse
        ``-inf`` (flash-attn: ``+inf``). Inference only: no argument may require grad.

    Eager calls check the values of ``cache_seqlens``, ``block_table`` and ``cache_batch_idx``
    (every count within its cache, every page used inside the cache, no cache slot or row
    appended to twice) before writing anything; while a CUDA graph is captured they are
    skipped and the caller guarantees them. With an append, the caches and the new k/v must
    not share memory (checked from their layouts, always: :mod:`portattn.kvcache_checks`).
    """
    _check_kvcache_features(rotary_cos, rotary_sin, cache_leftpad, alibi_slopes, num_splits)
    check_bool("rotary_interleaved", rotary_interleaved)
    compiling = torch.compiler.is_compiling()  # in this frame: see check_options
    scalars = CallScalars(causal, softmax_scale, return_softmax_lse, kernel, window_size, softcap)
    tensors = (q, k_cache, v_cache, k, v, block_table)
    return kvcache_attention(tensors, cache_seqlens, cache_batch_idx, scalars, compiling)
