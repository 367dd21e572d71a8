"""The device work of ``flash_attn_with_kvcache`` (:mod:`portattn.kvcache`) around its
attention: the in-place append of the new keys and values (:func:`append_rows`: one launch of
``kernels/append.py``, or aten index ops under torch.compile) and the key offsets of the
sequences (:func:`cache_cu_seqlens`). Index tensors that are the same for every layer of a
decode step are made once per version of what they come from (:mod:`portattn.tensor_memo`);
while a CUDA graph is captured or torch.compile traces, they are made anew.
"""

from __future__ import annotations

import torch

from portattn.forward_replay import LaunchTemplate, launch_directly, tensor_indexes
from portattn.kernels.append import plan_append
from portattn.kernels.plan import run_launches
from portattn.tensor_memo import derived, ramp, stream_key

# Off only for measurements and tests: the eager append then runs as two aten index_put_ (its
# index tensors kept per version of cache_seqlens), as under torch.compile.
APPEND_KERNEL = True


def cache_cu_seqlens(seqlens: torch.Tensor | int, new: int, batch: int, device, capturing: bool):
    """int32 [B + 1]: 0, then the running sum of each sequence's keys (cache plus new). Made
    once per decode step by its caller's memo (``kvcache._step_indices``)."""
    if isinstance(seqlens, int):
        return ramp(batch + 1, seqlens + new, device, capturing)
    counts = seqlens + new if new else seqlens
    # Two kernels (a CUDA graph replays each of every layer's call): the leading 0, then the
    # running sum written behind it. int32 sums: the same bits as int64 sums stored to int32
    # (both wrap mod 2**32).
    cu = torch.empty(batch + 1, dtype=torch.int32, device=device)
    cu[:1].zero_()
    torch.cumsum(counts, 0, dtype=torch.int32, out=cu[1:])
    return cu


def int_lengths(value: int, batch: int, device) -> torch.Tensor:
    """An int cache_seqlens as an int32 [B] tensor, kept per value (a decode step's layers)."""
    return derived(
        "int_lengths",
        (),
        (value, batch, device, stream_key(device)),
        lambda: torch.full((batch,), value, dtype=torch.int32, device=device),
    )


def append_rows(
    k_cache,
    v_cache,
    k,
    v,
    cache_seqlens,
    block_table,
    page_size,
    batch_idx,
    capturing: bool,
    kept: dict | None = None,
) -> None:
    """Write the new rows in place at positions ``cache_seqlens[b] + i`` (device work only;
    ``cache_seqlens`` a [B] tensor or an int for all; ``batch_idx``: a dense cache's rows,
    None for rows 0..B-1): the append kernel (``kernels/append.py``), or the aten index ops
    under torch.compile. Every element is written by one copy (no two writes to one slot,
    checked before), so either gives the bytes of any other way of writing them. ``kept``: the
    dict of the caller's record for a call signature that holds every layout here (eager
    ``flash_attn_with_kvcache``): a paged append keeps its launch there, with these tensors
    as slots (an int ``cache_seqlens`` as a tensor), and launches it from the next call on."""
    compiling = torch.compiler.is_compiling()
    if APPEND_KERNEL and not compiling:  # one launch for k and v, eager and captured alike
        if kept is not None and block_table is not None and type(cache_seqlens) is int:
            # An int is a value of the launch, new each step: as an int32 [B] tensor, made once
            # a step (tensor_memo.derived), the launch is kept as a tensor's is (same copies).
            cache_seqlens = int_lengths(cache_seqlens, k.shape[0], k.device)
        tensors = (k, v, k_cache, v_cache, cache_seqlens, block_table)
        # What the signature does not hold: whether k is v (one tensor has one slot) and the
        # layout of cache_seqlens (its stride is a value of the launch)
        lengths = None if type(cache_seqlens) is int else cache_seqlens.stride()
        slot = ("append", k is v, lengths)
        template = None if kept is None else kept.get(slot)
        if template is not None:
            if launch_directly((template,), tensors):  # its kept kernel, past the bind
                return
            launch = template.bind(tensors)
        else:
            launch = plan_append(k_cache, v_cache, k, v, cache_seqlens, block_table, batch_idx)
            # an int cache_seqlens is a value of the launch; a dense cache's rows are not slots
            keep = kept is not None and block_table is not None and lengths is not None
            if keep and launch is not None:
                template = LaunchTemplate.record(launch, tensor_indexes(tensors))
                if template is not None:
                    kept[slot] = template
        if launch is not None:
            run_launches((launch,), k.device)
        return
    # torch.compile traces the aten ops below (it would break the graph at the launcher)
    batch, new = k.shape[:2]
    caches = ((k_cache, k), (v_cache, v))
    memo = not (capturing or compiling)
    device = k.device

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(cache_seqlens, int):
            pos = torch.full((batch, 1), cache_seqlens, dtype=torch.int64, device=device)
        else:
            pos = cache_seqlens.long()[:, None]  # [B, 1]
        if new > 1:
            pos = pos + ramp(new, 1, device, capturing)  # [B, S_new]
        if block_table is not None:
            return torch.gather(block_table, 1, pos // page_size), pos % page_size  # int32 pages
        rows = ramp(batch, 1, device, capturing) if batch_idx is None else batch_idx
        return rows[:, None], pos

    # The slots are the same for every layer of a decode step: made once per version of the
    # index tensors (an int cache_seqlens: once per value), see portattn.tensor_memo.
    if isinstance(cache_seqlens, int):
        tensors, extra = (block_table, batch_idx), (cache_seqlens,)
    else:
        tensors, extra = (cache_seqlens, block_table, batch_idx), ()
    extra = (*extra, new, page_size, batch, device, stream_key(device))
    rows, slots = derived("append_slots", tensors, extra, make, use=memo)
    for cache, x in caches:
        cache.index_put_((rows, slots), x)
