"""Attention across several processes with ``torch.distributed``, built on the public API.

Two ways to split one attention call over the ranks of a process group:

- **Context parallel** (:func:`context_parallel_attention`): every rank holds all the queries
  and a slice of each sequence's keys/values. Each rank computes its partial ``(out, lse)``
  with :func:`portattn.varlen_attention`, the partials are all-gathered in rank order and merged
  with :func:`portattn.merge_attention_states`. Every rank ends with the same bytes, and the
  result matches a single call over all keys to the float64-reference accuracy rule (it is not
  bitwise equal to it: the softmax is summed in a different grouping).
- **Tensor parallel** (:func:`shard_heads`): every rank computes whole GQA groups of heads. No
  communication inside attention; each rank's heads are bitwise equal to those heads of a single
  call over all heads (invariance 3 of ``docs/invariance.md``), forward and backward.

:func:`shard_keys` cuts each sequence's keys into contiguous, rank-ordered chunks: the layout
that causal context parallelism needs.

``python benchmarks/distributed_demo.py`` (a checkout's) runs both on 2 processes and checks them
(see ``docs/distributed.md``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import portattn
from portattn.validation import check_common, check_varlen

__all__ = ["context_parallel_attention", "shard_heads", "shard_keys"]


def shard_heads(n_heads_q: int, n_heads_kv: int, world_size: int, rank: int) -> tuple[slice, slice]:
    """The query heads and kv heads of ``rank`` in a tensor-parallel split of attention heads.

    Each rank gets ``n_heads_kv // world_size`` whole kv heads and their GQA groups: query heads
    ``[rank * Hq / W, (rank + 1) * Hq / W)`` and kv heads ``[rank * Hkv / W, (rank + 1) * Hkv /
    W)``. Use them on ``q`` ``[total_q, Hq, D]`` and ``k``/``v`` ``[total_k, Hkv, D]`` as
    ``q[:, sq]``, ``k[:, skv]`` (views, no copy needed). The rank's out, lse, dq, dk and dv are
    then bitwise equal to those heads of one call over all heads.

    Raises:
        ValueError: ``world_size < 1``, ``rank`` outside ``[0, world_size)``, ``Hq % Hkv != 0``,
            or ``Hkv % world_size != 0`` (a GQA group would be split across ranks; with fewer kv
            heads than ranks, replicate kv heads yourself: the forward stays bitwise, but each
            rank's dk/dv is then a partial sum over its query heads and must be reduced).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"need world_size >= 1 and 0 <= rank < world_size, got {rank}, {world_size}"
        )
    if n_heads_kv < 1 or n_heads_q % n_heads_kv != 0:
        raise ValueError(f"Hq ({n_heads_q}) must be a multiple of Hkv ({n_heads_kv}) >= 1")
    if n_heads_kv % world_size != 0:
        raise ValueError(
            f"Hkv ({n_heads_kv}) must be a multiple of world_size ({world_size}) so that every "
            "rank gets whole GQA groups"
        )
    per_kv = n_heads_kv // world_size
    per_q = per_kv * (n_heads_q // n_heads_kv)
    return slice(rank * per_q, (rank + 1) * per_q), slice(rank * per_kv, (rank + 1) * per_kv)


def shard_keys(
    cu_seqlens_k: torch.Tensor, world_size: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys of ``rank`` when each sequence's keys are cut into ``world_size`` contiguous
    chunks in rank order (sequence of ``n`` keys: rank ``r`` holds keys
    ``[n * r // W, n * (r + 1) // W)``; chunks may be empty).

    Args:
        cu_seqlens_k: int32 ``[B + 1]``, the global key boundaries.

    Returns:
        ``(index, cu_seqlens_k_local)``: int64 ``[total_k_local]`` rows of the global packed
        ``k``/``v`` (``k_local = k.index_select(0, index)``) and int32 ``[B + 1]``, both on the
        device of ``cu_seqlens_k``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"need world_size >= 1 and 0 <= rank < world_size, got {rank}, {world_size}"
        )
    cu = cu_seqlens_k.long()
    lens = cu[1:] - cu[:-1]
    lo, hi = lens * rank // world_size, lens * (rank + 1) // world_size
    cu_local = torch.zeros_like(cu)
    cu_local[1:] = torch.cumsum(hi - lo, 0)
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=cu.device), hi - lo)
    pos = torch.arange(seq.numel(), device=cu.device) - cu_local[:-1][seq]
    return cu[:-1][seq] + lo[seq] + pos, cu_local.to(torch.int32)


def _all_gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    """``dist.all_gather`` into a list in rank order. With a gloo group, CUDA tensors go through
    host copies (gloo's CUDA support differs between collectives and builds)."""
    x = x.contiguous()
    if x.device.type != "cpu" and str(dist.get_backend(group)) == "gloo":
        return [part.to(x.device) for part in _all_gather(x.cpu(), group)]
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


class _GatherFromRanks(torch.autograd.Function):
    """Forward: all-gather, rank order. Backward: the gradient of this rank's own part (the
    output is replicated, and every rank is assumed to compute the same loss from it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> tuple[torch.Tensor, ...]:
        ctx.rank = dist.get_rank(group)
        return tuple(_all_gather(x, group))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        return grads[ctx.rank], None


class _SumGradInRankOrder(torch.autograd.Function):
    """Forward: identity. Backward: the sum over ranks of the gradient, in rank order and in
    float32 (fixed order: bitwise the same on every rank and run to run)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        parts = _all_gather(grad, ctx.group)
        total = parts[0].float()
        for part in parts[1:]:
            total = total + part.float()
        return total.to(grad.dtype), None


_DTYPES = (torch.float16, torch.bfloat16)


def _agree(q, k_local, v_local, cu_q, cu_k, max_q, max_k, causal, scale, kernel, group):
    """Check locally, then make every rank agree: raise on *every* rank (so none hangs in a later
    collective) if any rank's input is bad or the ranks' queries differ in shape or packing.
    Returns (softmax_scale, per-rank key lengths [W, B])."""
    error = None
    try:
        scale = check_common(q, k_local, v_local, causal, scale, True, kernel)
        check_varlen(q, k_local, v_local, cu_q, cu_k, max_q, max_k)
    except (TypeError, ValueError) as exc:
        error = exc
    ok = error is None
    meta = [int(ok)]
    if ok:
        meta += [*q.shape, cu_q.numel(), int(causal), _DTYPES.index(q.dtype)]
    meta += [0] * (7 - len(meta))
    metas = torch.stack(_all_gather(torch.tensor(meta, device=q.device), group)).tolist()
    if error is not None:
        raise error
    bad = [r for r, m in enumerate(metas) if not m[0]]
    if bad:
        raise ValueError(f"context_parallel_attention: the input of rank(s) {bad} is invalid")
    if any(m != metas[0] for m in metas):
        raise ValueError(
            "context_parallel_attention: the ranks disagree on q's shape, the batch size, causal "
            f"or the dtype ([ok, total_q, Hq, D, B + 1, causal, dtype] per rank: {metas})"
        )
    cus = torch.stack(_all_gather(torch.cat([cu_q, cu_k]), group)).long()
    n = cu_q.numel()
    if not bool((cus[:, :n] == cus[0, :n]).all()):
        raise ValueError("context_parallel_attention: cu_seqlens_q differs between ranks")
    lens_k = cus[:, n + 1 :] - cus[:, n:-1]
    return scale, lens_k


def _causal_part(q, k, v, cu_q, cu_k, lens_k, rank, max_q, max_k, scale, kernel):
    """This rank's partial causal attention. Its keys of sequence b are global keys
    ``[a, e)`` of ``Sk``; global row ``i`` (of ``Sq``) sees keys ``j <= i + Sk - Sq``. Rows
    ``i < c = clamp(e - Sk + Sq, 0, Sq)`` are cut by the diagonal inside the chunk: a causal
    call on just those rows against the chunk has exactly that mask (bottom-right rule with
    ``Sq' = c``, ``Sk' = e - a``). Rows ``i >= c`` see the whole chunk: a non-causal call."""
    start = lens_k[:rank].sum(0)
    end = start + lens_k[rank]
    total_k = lens_k.sum(0)
    cu_q64 = cu_q.long()
    lens_q = cu_q64[1:] - cu_q64[:-1]
    cut = torch.minimum(torch.clamp(end - total_k + lens_q, min=0), lens_q)
    kw = {"softmax_scale": scale, "return_lse": True, "kernel": kernel}
    if bool((cut == lens_q).all()):
        return portattn.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, **kw)
    if bool((cut == 0).all()):
        return portattn.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, **kw)
    seq = torch.repeat_interleave(torch.arange(lens_q.numel(), device=q.device), lens_q)
    pos = torch.arange(q.shape[0], device=q.device) - cu_q64[:-1][seq]
    diag = pos < cut[seq]
    rows_c, rows_f = diag.nonzero().squeeze(1), (~diag).nonzero().squeeze(1)

    def cu_of(lens: torch.Tensor) -> torch.Tensor:
        return torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(torch.int32)

    out_c, lse_c = portattn.varlen_attention(
        q.index_select(0, rows_c), k, v, cu_of(cut), cu_k, max_q, max_k, causal=True, **kw
    )
    out_f, lse_f = portattn.varlen_attention(
        q.index_select(0, rows_f), k, v, cu_of(lens_q - cut), cu_k, max_q, max_k, **kw
    )
    order = torch.argsort(torch.cat([rows_c, rows_f]))  # back to the rows of q
    out = torch.cat([out_c, out_f]).index_select(0, order)
    return out, torch.cat([lse_c, lse_f]).index_select(0, order)


def context_parallel_attention(
    q: torch.Tensor,
    k_local: torch.Tensor,
    v_local: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k_local: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k_local: int | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    kernel: str = "varlen",
    group: dist.ProcessGroup | None = None,
):
    """Attention of all queries over keys spread across the ranks of ``group`` (context
    parallel). Call it on every rank of the group with the same ``q``.

    Args:
        q: [total_q, Hq, D] float16/bfloat16, the same on every rank (not checked beyond shape).
        k_local, v_local: [total_k_local, Hkv, D], this rank's keys/values of each sequence.
        cu_seqlens_q: int32 [B + 1], the same on every rank (checked).
        cu_seqlens_k_local: int32 [B + 1], this rank's key boundaries per sequence (same B).
        max_seqlen_q, max_seqlen_k_local: optional bounds, as in ``varlen_attention``.
        causal: bottom-right causal over the *global* keys. Needs the rank-ordered contiguous
            layout: for every sequence, rank ``r`` holds the ``r``-th contiguous chunk of its
            keys (any lengths, empty allowed), as :func:`shard_keys` makes. With
            ``causal=False`` any partition of each sequence's keys over the ranks works.
        softmax_scale, kernel: as in ``varlen_attention``; the same on every rank.
        return_lse: also return lse float32 [total_q, Hq].
        group: the process group (default: the whole world).

    Returns:
        ``out`` [total_q, Hq, D] in q's dtype, or ``(out, lse)``: the same bytes on every rank.
        Equal to ``varlen_attention`` of q over all ranks' keys (concatenated per sequence in
        rank order) to the accuracy rule of the tests, not bitwise. Rows that see no key
        anywhere get out 0 and lse ``-inf``.

    Autograd (Megatron-LM's convention for a replicated output): every rank is assumed to
    compute the same loss from the returned ``out``/``lse`` and run backward. Then ``q.grad`` on
    every rank is the full gradient (the ranks' shares summed in rank order, in float32, via one
    all-gather) and ``k_local.grad`` / ``v_local.grad`` are the gradients of this rank's keys.
    With a different loss on each rank the gradients are those of no single loss: reduce the
    losses first (e.g. all-reduce their mean) so that every rank backpropagates the same one.
    ``q.requires_grad`` must be the same on every rank (the backward all-gathers).

    Communication: two small all-gathers of metadata (checks; with a host sync), then one
    all-gather of the partial ``out`` and one of ``lse``; in backward, one all-gather of
    ``dq``. Gloo groups with CUDA tensors go through host copies. Eager mode only (not under
    ``torch.compile``).

    Raises:
        TypeError / ValueError (on every rank, before any kernel launch): bad local input on
        any rank (that rank raises its own error, the others say which rank), ranks that
        disagree on q's shape, the batch size, ``causal``, the dtype, or ``cu_seqlens_q``.
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    scale, lens_k = _agree(
        q,
        k_local,
        v_local,
        cu_seqlens_q,
        cu_seqlens_k_local,
        max_seqlen_q,
        max_seqlen_k_local,
        causal,
        softmax_scale,
        kernel,
        group,
    )
    q_in = _SumGradInRankOrder.apply(q, group)
    args = (q_in, k_local, v_local, cu_seqlens_q, cu_seqlens_k_local)
    bounds = (max_seqlen_q, max_seqlen_k_local)
    if causal:
        rank = dist.get_rank(group)
        out, lse = _causal_part(*args, lens_k, rank, *bounds, scale, kernel)
    else:
        out, lse = portattn.varlen_attention(
            *args, *bounds, softmax_scale=scale, return_lse=True, kernel=kernel
        )
    outs = _GatherFromRanks.apply(out, group)
    lses = _GatherFromRanks.apply(lse, group)
    out, lse = portattn.merge_attention_states(list(outs), list(lses))
    return (out, lse) if return_lse else out


if __name__ == "__main__":
    # The demo lives outside the package (benchmarks/), which the package never imports: the
    # former spelling says where it went instead of exiting 0 having run nothing.
    import sys

    print(
        "error: the multi-process demo moved out of the package: from a checkout of portattn, "
        "run python benchmarks/distributed_demo.py [--world-size N]",
        file=sys.stderr,
    )
    raise SystemExit(2)
