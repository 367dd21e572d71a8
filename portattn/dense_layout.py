"""How a dense call's ``[B, S, H, D]`` tensors reach the varlen kernels, as views where possible.

The kernels read packed tensors ``[tokens, heads, D]`` with any token and head strides (last
dim contiguous). A dense batch becomes one in one of two ways:

* **tokens**: batch and sequence merge into the token dim (``stride(0) == S * stride(1)``, e.g.
  contiguous BSHD input, and what a transformers layer hands over in training): ``B`` sequences
  of ``S`` tokens, ``cu_seqlens = b * S``.
* **heads**: batch and heads merge into the head dim (``stride(0) == H * stride(2)``, e.g.
  transformers' KV cache, ``[B, H, S, D]`` grown by ``torch.cat`` along S, and a decode step's
  q): one sequence of ``S`` tokens with ``B * H`` heads. Query head ``b * Hq + h`` then reads kv
  head ``(b * Hq + h) // group = b * Hkv + h // group``, the kv head of the unfolded call.

Every row gets the same bits either way: a row's result does not depend on its sequence's
place in the pack nor on its head's index (DESIGN §3, pack and head invariance). Where no fold
is a view of all three tensors, the fold that copies the fewest elements is taken and only the
tensors that do not fit it are copied, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portattn.tensor_memo import ramp

MAX_GRID_HEADS = 65535  # the launch grid's head dim (CUDA's grid y), as validation's Hq limit


def _merges_tokens(x: torch.Tensor) -> bool:
    """``x [B, S, H, D]`` views as ``[B * S, H, D]``."""
    batch, seqlen = x.shape[:2]
    return batch <= 1 or seqlen <= 1 or x.stride(0) == seqlen * x.stride(1)


def _merges_heads(x: torch.Tensor) -> bool:
    """``x [B, S, H, D]`` views as ``[S, B * H, D]``."""
    batch, heads = x.shape[0], x.shape[2]
    return batch <= 1 or heads <= 1 or x.stride(0) == heads * x.stride(2)


@dataclass(frozen=True)
class DenseLayout:
    """The fold of one dense call: ``heads`` (batch into heads) or tokens (batch into tokens)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: bool

    def packed(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, S, H, D]`` as the kernels' ``[tokens, heads, D]`` (a view where ``x`` fits
        the fold, else one copy that does)."""
        batch, seqlen, heads, dim = x.shape
        if not self.heads:
            return x.reshape(batch * seqlen, heads, dim)  # copies only where it must
        if not _merges_heads(x):
            x = x.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, S, D] in memory
        return x.permute(1, 0, 2, 3).reshape(seqlen, batch * heads, dim)

    def cu_seqlens(
        self, device: torch.device, capturing: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 ``cu_seqlens_q``, ``cu_seqlens_k`` of the packed call: kept ramps
        (``tensor_memo.ramp``), made anew while ``capturing`` (a CUDA graph, or tracing)."""
        sequences = 1 if self.heads else self.batch
        return (
            ramp(sequences + 1, self.seqlen_q, device, capturing),
            ramp(sequences + 1, self.seqlen_k, device, capturing),
        )

    def output(self, out: torch.Tensor, heads_q: int) -> torch.Tensor:
        """The packed output ``[tokens, B * Hq or Hq, Dv]`` as ``[B, Sq, Hq, Dv]`` (a view)."""
        b, s = self.batch, self.seqlen_q
        if not self.heads:
            return out.view(b, s, heads_q, out.shape[-1])
        return out.view(s, b, heads_q, out.shape[-1]).permute(1, 0, 2, 3)

    def lse(self, lse: torch.Tensor, heads_q: int) -> torch.Tensor:
        """The packed lse ``[tokens, B * Hq or Hq]`` as ``[B, Hq, Sq]`` (a view)."""
        b, s = self.batch, self.seqlen_q
        if not self.heads:
            return lse.view(b, s, heads_q).permute(0, 2, 1)
        return lse.view(s, b, heads_q).permute(1, 2, 0)


@dataclass(frozen=True)
class FoldViews:
    """One call signature's fold (shapes and strides fix it) with the views it makes:
    :meth:`DenseLayout.packed`'s of q, k and v as ``(size, stride)`` each (None where that
    tensor is copied) and :meth:`DenseLayout.output`'s of the packed out. They are the same
    for every call of the signature, so a kept signature's calls make each view in one
    ``as_strided`` instead of a permute and a reshape (issue 37: host time per call)."""

    layout: DenseLayout
    inputs: tuple[tuple | None, ...]
    out: tuple  # (size, stride) of out's [B, Sq, Hq, Dv] view of a contiguous packed buffer
    heads_q: int

    @staticmethod
    def record(layout: DenseLayout, q, k, v) -> FoldViews:
        """The views of ``layout`` (the fold of q, k, v) as this call's tensors get them."""
        inputs = []
        for x in (q, k, v):
            view = layout.packed(x)
            shared = x.numel() > 0 and view.data_ptr() == x.data_ptr()
            same = shared and view.storage_offset() == x.storage_offset()
            inputs.append((tuple(view.shape), view.stride()) if same else None)
        tokens = layout.seqlen_q * (1 if layout.heads else layout.batch)
        heads = q.shape[2] * (layout.batch if layout.heads else 1)
        packed_out = torch.empty(tokens, heads, v.shape[-1], device="meta")
        out = layout.output(packed_out, q.shape[2])
        return FoldViews(layout, tuple(inputs), (tuple(out.shape), out.stride()), q.shape[2])

    def packed(self, q, k, v) -> tuple[torch.Tensor, ...]:
        """q, k and v as the kernels' packed tensors (:meth:`DenseLayout.packed`)."""
        return tuple(
            self.layout.packed(x) if view is None else x.as_strided(*view, x.storage_offset())
            for x, view in zip((q, k, v), self.inputs, strict=True)
        )

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The packed out as ``[B, Sq, Hq, Dv]`` (:meth:`DenseLayout.output`)."""
        if not out.is_contiguous():
            return self.layout.output(out, self.heads_q)
        return out.as_strided(*self.out, out.storage_offset())


def dense_layout(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None
) -> DenseLayout:
    """The fold of a dense call on q ``[B, Sq, Hq, D]``, k, v ``[B, Sk, Hkv, D / Dv]`` (checked
    shapes): tokens where all three merge their batch and sequence dims, else heads where all
    three merge batch and heads, else the one that copies fewer elements (ties: tokens). Heads
    needs ``B * Hq`` within the grid and no sinks (a sink is per query head: folded heads would
    each need a copy of it, and its gradient another sum)."""
    tensors = (q, k, v)
    batch, seqlen_q, heads_q = q.shape[:3]
    layout = DenseLayout(batch, seqlen_q, k.shape[1], heads=False)
    copied_by_tokens = sum(x.numel() for x in tensors if not _merges_tokens(x))
    if copied_by_tokens == 0:
        return layout
    if sinks is not None or batch * heads_q > MAX_GRID_HEADS or min(seqlen_q, k.shape[1]) < 1:
        return layout
    copied_by_heads = sum(x.numel() for x in tensors if not _merges_heads(x))
    if copied_by_heads < copied_by_tokens:
        return DenseLayout(batch, seqlen_q, k.shape[1], heads=True)
    return layout
