"""portattn as an attention implementation of Hugging Face transformers (5.x).

::

    import portattn.integrations.transformers as pt_hf

    pt_hf.register()  # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="portattn")
    # or "portattn_fixed_order" for the strict kernel

``register()`` adds both names to transformers' ``AttentionInterface`` (the attention function
of every layer) and ``AttentionMaskInterface`` (the mask builder: transformers' flash-attention
one, which hands the layers the 2-D padding mask, or ``None`` when nothing is padded; without
it a left-padded batch would silently attend to its padding). This module is the only one of
portattn that imports transformers; the core package never needs it.

What the attention function does with what transformers passes, as its flash-attention path
does (``modeling_flash_attention_utils._flash_attention_forward``):

- q, k, v arrive as ``[B, H, S, D]``; they are transposed to portattn's ``[B, S, H, D]`` views
  (``.transpose(1, 2)``), and GQA/MQA k, v go in with their own head count (no ``repeat_kv``).
- a 2-D padding mask ``[B, Sk]``: the real tokens are gathered (one copy), run through
  ``varlen_attention`` and scattered back; padded query rows get 0. Queries are the last
  ``Sq`` positions of the mask (left padding, as in transformers), one per sequence when
  ``Sq == 1``. The gather indices are derived once per mask and reused by every layer.
- ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (and optional ``max_length_q`` / ``max_length_k``,
  ints or 0-d tensors) kwargs: a packed batch, straight into ``varlen_attention``.
- ``position_ids`` of a batch of one that restart (at their minimum): a packed batch whose
  sequences start where the minimum occurs (``prepare_fa_kwargs_from_position_ids``'s rule).
- otherwise ``portattn.attention`` (dense); with a KV cache ``Sq < Sk`` and the causal mask is
  bottom-right aligned, which is what decoding needs.

A layer's ``sliding_window`` W becomes ``window_size=(W - 1, W - 1)`` (as transformers'
flash-attention path passes it), its ``softcap`` portattn's ``softcap`` (Gemma 2, Mistral,
Qwen2 with sliding windows) and its ``s_aux`` (gpt-oss' per-head sinks) portattn's ``sinks``.

Raised as ``ValueError`` (portattn would not compute what was asked): attention dropout
(``dropout > 0``: a model in training mode with ``config.attention_dropout > 0``), a position
bias, a 4-D attention mask other
than the plain causal (or, for non-causal layers, the all-visible) pattern, a value head dim
different from the query's, and an attention mask next to ``cu_seq_lens`` kwargs.
"""

from __future__ import annotations

import weakref

import torch
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.modeling_utils import AttentionInterface
from transformers.utils import logging

from portattn.api import attention, varlen_attention
from portattn.flash_compat import max_seqlen_arg
from portattn.validation import DTypeError

__all__ = [
    "IMPLEMENTATIONS",
    "fixed_order_attention_forward",
    "portattn_attention_forward",
    "register",
]

logger = logging.get_logger(__name__)

_HALF = (torch.float16, torch.bfloat16)


def _unsupported(what: str, hint: str) -> ValueError:
    return ValueError(f"attn_implementation='portattn' does not support {what}; {hint}")


def _refuse_unsupported(query, key, value, dropout, kwargs):
    if dropout is not None and dropout != 0:
        raise _unsupported(
            f"attention dropout (dropout={dropout}, the layer's attention_dropout in training "
            "mode)",
            "set config.attention_dropout = 0.0, or call model.eval()",
        )
    if kwargs.get("position_bias") is not None:
        raise _unsupported("an additive position bias", "use attn_implementation='sdpa'")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(
            "query, key and value must be [batch, heads, seq, head_dim], got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if value.shape[-1] != query.shape[-1]:
        raise _unsupported(
            f"a value head dim ({value.shape[-1]}) different from the query's ({query.shape[-1]})",
            "use attn_implementation='sdpa'",
        )


def _window(sliding_window) -> tuple[int, int]:
    """transformers' ``sliding_window`` W (a token sees itself and the W - 1 before it; the
    masks' ``kv_idx > q_idx - W``) as portattn's window: ``(W - 1, W - 1)``, what transformers'
    flash-attention path passes (the right side is 0 for causal layers). transformers passes it
    only where keys outnumber the window; a wider window gives the same bytes, so portattn
    always takes it."""
    if sliding_window is None:
        return (-1, -1)
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
        raise TypeError(f"sliding_window must be an int or None, got {sliding_window!r}")
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
    return (sliding_window - 1, sliding_window - 1)


def _half_dtype(query: torch.Tensor, module: torch.nn.Module) -> torch.dtype | None:
    """The dtype to cast float32 q, k, v to, as transformers' flash path does for models whose
    norms PEFT keeps in float32: the dtype of the layer's linear weights, when that is
    float16/bfloat16. None: no cast (half input, or autocast, which portattn applies itself)."""
    if query.dtype != torch.float32 or torch.is_autocast_enabled(query.device.type):
        return None
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            return layer.weight.dtype if layer.weight.dtype in _HALF else None
    return None


# Values derived from a mask / position_ids tensor, once per tensor version: every layer of a
# forward gets the same tensor, so the host syncs (nonzero, max) happen once, not per layer.
_DERIVED: dict[tuple[int, str, int], tuple[weakref.ref, int, int, object]] = {}
_DERIVED_MAX = 64


def _derived(t: torch.Tensor, tag: str, arg: int, fn):
    if torch.compiler.is_compiling():
        return fn()
    try:
        version = t._version
    except RuntimeError:  # an inference tensor has no version counter: no reuse
        return fn()
    key = (id(t), tag, arg)
    hit = _DERIVED.get(key)
    if hit is not None and hit[0]() is t and hit[1] == version and hit[2] == t.data_ptr():
        return hit[3]
    value = fn()
    if len(_DERIVED) >= _DERIVED_MAX:
        for k in [k for k, v in _DERIVED.items() if v[0]() is None]:
            del _DERIVED[k]
        if len(_DERIVED) >= _DERIVED_MAX:
            _DERIVED.clear()
    _DERIVED[key] = (weakref.ref(t), version, t.data_ptr(), value)
    return value


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _longest(lengths: torch.Tensor) -> int:
    return int(lengths.max()) if lengths.numel() else 0


def _padding_meta(mask: torch.Tensor, q_len: int):
    """From a 2-D padding mask [B, Sk] (True / nonzero: a real token): the (batch, position)
    indices, cu_seqlens and longest length of the real keys and of the queries; None when
    every token is real (nothing to unpad)."""
    mask = mask if mask.dtype == torch.bool else mask != 0
    batch, k_len = mask.shape
    if q_len <= k_len and bool(mask.all()):
        return None
    k_idx = mask.nonzero().unbind(1)
    k_lens = mask.sum(-1, dtype=torch.int32)
    key_meta = (k_idx, _cu_seqlens(k_lens), _longest(k_lens))
    if q_len == k_len:
        return key_meta, key_meta
    if q_len == 1:  # one decode row per sequence, as transformers' flash path
        rows = torch.arange(batch, device=mask.device)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=mask.device)
        return ((rows, torch.zeros_like(rows)), cu_q, min(batch, 1)), key_meta
    if q_len > k_len:
        raise ValueError(f"the attention mask covers {k_len} keys, fewer than the {q_len} queries")
    mask_q = mask[:, -q_len:]  # the queries are the last q_len positions (left padding)
    q_lens = mask_q.sum(-1, dtype=torch.int32)
    return (mask_q.nonzero().unbind(1), _cu_seqlens(q_lens), _longest(q_lens)), key_meta


def _packed_meta(position_ids: torch.Tensor):
    """cu_seqlens and longest length of a batch of one whose position_ids restart, or None
    when they just count up (one sequence, or a continuation with a KV cache)."""
    pos = position_ids.reshape(-1)
    if pos.numel() == 0:
        return None
    first = pos.min()
    steps = torch.arange(pos.numel(), device=pos.device, dtype=pos.dtype) + first
    if not bool((pos != steps).any()):
        return None
    starts = (pos == first).nonzero().flatten()
    if int(starts[0]) != 0:
        raise ValueError(
            "packed position_ids must start every sequence at the same smallest position, the "
            f"first token included; position_ids[0] is {int(pos[0])}, the smallest is "
            f"{int(first)}"
        )
    ends = torch.tensor([pos.numel()], dtype=torch.int32, device=pos.device)
    cu = torch.cat((starts.to(torch.int32), ends))
    return cu, _longest(cu.diff())


def _check_4d_mask(mask: torch.Tensor, is_causal: bool, q_len: int, k_len: int) -> None:
    """A 4-D mask is honoured only when it is the mask portattn applies anyway: bottom-right
    causal for causal layers, all visible otherwise (bool: True = attend; float: 0 = attend,
    the dtype's minimum or -inf = masked)."""
    hint = (
        "portattn applies only its causal mask, a 2-D padding mask (transformers builds one for "
        "attn_implementation='portattn') and packing (position_ids that restart, or the "
        "cu_seq_lens_q / cu_seq_lens_k kwargs); use attn_implementation='sdpa' for other masks"
    )
    if mask.shape[-2:] != (q_len, k_len):
        raise _unsupported(f"a 4-D attention mask of shape {tuple(mask.shape)}", hint)
    if mask.dtype == torch.bool:
        visible = mask
    elif mask.dtype.is_floating_point:
        visible = mask == 0
        masked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((visible | masked).all()):
            raise _unsupported("a 4-D float attention mask with an additive bias", hint)
    else:
        raise _unsupported(f"a 4-D attention mask of dtype {mask.dtype}", hint)
    expected = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device)
    if is_causal:
        expected = expected.tril(k_len - q_len)
    if not bool((visible == expected).all()):
        what = "causal" if is_causal else "all-visible (non-causal)"
        raise _unsupported(f"a custom 4-D attention mask (not the {what} pattern)", hint)


def _forward(
    kernel: str,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    _refuse_unsupported(query, key, value, dropout, kwargs)
    if kwargs.get("output_attentions", False):
        logger.warning_once(
            "attn_implementation='portattn' returns no attention weights "
            "(output_attentions=True); use attn_implementation='eager' to get them"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal)
    target = _half_dtype(query, module)
    if target is not None:
        query, key, value = query.to(target), key.to(target), value.to(target)
    if query.dtype not in _HALF and not torch.is_autocast_enabled(query.device.type):
        raise DTypeError(
            f"attn_implementation='portattn' needs float16 or bfloat16 q, k, v, got "
            f"{query.dtype}: load the model with dtype=torch.bfloat16 (or float16), or run it "
            "under torch.autocast"
        )

    # [B, H, S, D] -> [B, S, H, D] views (portattn's layout); copies happen below where needed.
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    batch, q_len = q.shape[:2]
    args = dict(causal=causal, softmax_scale=scaling, kernel=kernel)
    args.update(window_size=_window(sliding_window), softcap=float(softcap or 0.0))
    args["sinks"] = s_aux if s_aux is not None else kwargs.get("sinks")  # gpt-oss: [Hq]

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise _unsupported(
                f"an attention mask of type {type(attention_mask).__name__}",
                "pass a 2-D padding mask (or none)",
            )
        if attention_mask.dim() == 4:
            _check_4d_mask(attention_mask, causal, q_len, k.shape[1])
            attention_mask = None
        elif attention_mask.dim() != 2:
            raise _unsupported(
                f"a {attention_mask.dim()}-D attention mask", "pass a 2-D padding mask [B, S]"
            )
    if attention_mask is not None:
        if cu_q is not None or cu_k is not None:
            raise ValueError(
                "give either a 2-D padding attention_mask or the cu_seq_lens_q / cu_seq_lens_k "
                "kwargs of a packed batch, not both"
            )
        return _padded(q, k, v, attention_mask, args), None
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None:
            raise ValueError("cu_seq_lens_q and cu_seq_lens_k must be given together")
        max_q = max_seqlen_arg("max_length_q", kwargs.get("max_length_q"))
        max_k = max_seqlen_arg("max_length_k", kwargs.get("max_length_k"))
        return _varlen(q, k, v, cu_q, cu_k, max_q, max_k, args), None
    position_ids = kwargs.get("position_ids")
    if position_ids is not None and batch == 1 and q_len > 1 and position_ids.numel() == q_len:
        packed = _derived(position_ids, "packed", 0, lambda: _packed_meta(position_ids))
        if packed is not None:
            if k.shape[1] != q_len:
                raise ValueError(
                    f"packed sequences (position_ids that restart) need as many keys as "
                    f"queries, got {k.shape[1]} keys for {q_len} queries (a KV cache?)"
                )
            cu, longest = packed
            return _varlen(q, k, v, cu, cu, longest, longest, args), None
    return attention(q, k, v, **args), None


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, args) -> torch.Tensor:
    """A packed batch: [B, S, H, D] views flattened to [B * S, H, D] (a view when B == 1)."""
    batch, q_len = q.shape[:2]
    cu_q, cu_k = (
        cu.to(torch.int32) if isinstance(cu, torch.Tensor) and cu.dtype == torch.int64 else cu
        for cu in (cu_q, cu_k)
    )
    out = varlen_attention(
        q.reshape(-1, *q.shape[2:]),
        k.reshape(-1, *k.shape[2:]),
        v.reshape(-1, *v.shape[2:]),
        cu_q,
        cu_k,
        max_q,
        max_k,
        **args,
    )
    return out.view(batch, q_len, *out.shape[1:])


def _padded(q, k, v, mask: torch.Tensor, args) -> torch.Tensor:
    """Unpad by the 2-D mask, attend over the real tokens, pad back (zeros in padded rows); a
    mask without padding runs the dense call."""
    batch, q_len = q.shape[:2]
    k_len = mask.shape[1]
    if mask.shape[0] != batch:
        raise ValueError(f"the attention mask has batch size {mask.shape[0]}, q has {batch}")
    if k.shape[1] < k_len:
        raise ValueError(f"the attention mask covers {k_len} keys, k has only {k.shape[1]}")
    if k.shape[1] > k_len:  # a static cache longer than what was written: drop the rest
        k, v = k[:, :k_len], v[:, :k_len]
    meta = _derived(mask, "padding", q_len, lambda: _padding_meta(mask, q_len))
    if meta is None:  # no padding: the dense call, which reads a KV cache in place (the same
        return attention(q, k, v, **args)  # bits as the gathered tokens, pack invariance)
    (q_idx, cu_q, max_q), (k_idx, cu_k, max_k) = meta
    out = varlen_attention(
        q[q_idx], k[k_idx], v[k_idx], cu_q, cu_k, max_q, max_k, **args
    )  # the gathers are the one copy of the real tokens
    padded = out.new_zeros(batch, q_len, *out.shape[1:])
    return padded.index_put(q_idx, out)


def portattn_attention_forward(
    module, query, key, value, attention_mask, *args, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface on portattn's ``kernel="varlen"``: q, k, v
    ``[B, H, S, D]``, returns ``(out [B, S, H, D], None)``."""
    return _forward("varlen", module, query, key, value, attention_mask, *args, **kwargs)


def fixed_order_attention_forward(
    module, query, key, value, attention_mask, *args, **kwargs
) -> tuple[torch.Tensor, None]:
    """As :func:`portattn_attention_forward`, on ``kernel="fixed_order"``."""
    return _forward("fixed_order", module, query, key, value, attention_mask, *args, **kwargs)


IMPLEMENTATIONS = {
    "portattn": portattn_attention_forward,
    "portattn_fixed_order": fixed_order_attention_forward,
}


def register() -> tuple[str, ...]:
    """Register ``"portattn"`` and ``"portattn_fixed_order"`` with transformers: the attention
    functions in ``AttentionInterface`` and transformers' flash-attention mask builder (2-D
    padding mask or None) in ``AttentionMaskInterface``. Idempotent; returns the names."""
    for name, fn in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, flash_attention_mask)
    return tuple(IMPLEMENTATIONS)
