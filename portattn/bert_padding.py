"""flash-attn's ``flash_attn.bert_padding``: ``unpad_input`` and ``pad_input``, between a padded
batch [B, S, ...] with an attention mask and the packed (varlen) layout portattn's varlen entry
points take. Plain PyTorch (gathers and scatters, differentiable), flash-attn 2.7's return
conventions, so ``from flash_attn.bert_padding import ...`` becomes
``from portattn.bert_padding import ...``.
"""

from __future__ import annotations

import torch

from portattn.validation import type_name

__all__ = ["pad_input", "unpad_input"]


def _mask(name: str, mask, hidden_states: torch.Tensor) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(mask)}")
    if mask.shape != hidden_states.shape[:2]:
        raise ValueError(
            f"{name} must be [B, S] = {list(hidden_states.shape[:2])} like hidden_states' "
            f"first dims, got shape {tuple(mask.shape)}"
        )
    return mask


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """The tokens of ``hidden_states`` [B, S, ...] where ``attention_mask`` [B, S] (bool or
    0/1 integers) is set, packed: returns ``(hidden_states [total, ...], indices [total]
    (int64, into the flattened B*S tokens), cu_seqlens int32 [B + 1], max_seqlen (int, a host
    copy), seqused int32 [B])``. ``unused_mask`` [B, S]: tokens packed too but not counted in
    ``seqused`` (flash-attn 2.7's; None: seqused is the sequence lengths). A sequence's tokens
    keep their order; masks need not be contiguous per row."""
    if not isinstance(hidden_states, torch.Tensor):
        raise TypeError(f"hidden_states must be a torch.Tensor, got {type_name(hidden_states)}")
    if hidden_states.dim() < 2:
        shape = tuple(hidden_states.shape)
        raise ValueError(f"hidden_states must be [B, S, ...], got shape {shape}")
    used = _mask("attention_mask", attention_mask, hidden_states)
    kept = used if unused_mask is None else used + _mask("unused_mask", unused_mask, hidden_states)
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, max_seqlen, used.sum(dim=-1, dtype=torch.int32)


def pad_input(hidden_states, indices, batch: int, seqlen: int) -> torch.Tensor:
    """The inverse of :func:`unpad_input`: packed ``hidden_states`` [total, ...] back to [batch,
    seqlen, ...] at ``indices`` (into the flattened batch*seqlen tokens), zeros elsewhere."""
    if not isinstance(hidden_states, torch.Tensor) or not isinstance(indices, torch.Tensor):
        raise TypeError("hidden_states and indices must be torch.Tensors")
    if indices.shape != hidden_states.shape[:1]:
        raise ValueError(
            f"indices must be [total] = [{hidden_states.shape[0]}], got {tuple(indices.shape)}"
        )
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)  # out of place: differentiable
    return out.view(batch, seqlen, *hidden_states.shape[1:])
