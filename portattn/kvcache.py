"""The work of ``flash_attn_with_kvcache`` (flash-attn 2's decode entry point, whose signature
is :func:`portattn.flash_compat.flash_attn_with_kvcache`): :func:`kvcache_attention` checks a
call (kept per call signature), appends the new rows and attends. The attention runs on the
forward's paged path (``kernels/decode.py``): a dense cache [B_cache, S_cache, Hkv, D] is read
as a paged cache of one page of ``S_cache`` rows per sequence (its block table is
``cache_batch_idx``), a paged cache through ``block_table``. A query row gets the bytes of the
same row of the trainer's packed prefill (design §3).

Everything it does is device work (no host copy): it can be captured in a CUDA graph, where the
value checks of ``cache_seqlens`` / ``block_table`` / ``cache_batch_idx``, which need their
host values, are skipped; in eager mode they run before anything is written (a host copy once
per tensor version, see ``validation.host_values``; none for an int or None ``cache_seqlens``).
"""

from __future__ import annotations

import contextlib
import numbers
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from portattn.configs import resolve_config
from portattn.families import override_setting
from portattn.forward_entry import run_forward, run_kept_forward
from portattn.kernels.buffers import check_row_strides
from portattn.kvcache_append import append_rows, cache_cu_seqlens
from portattn.kvcache_checks import (
    byte_extents,
    byte_spans,
    check_append_memory,
    check_rows_apart,
    check_written_slots,
)
from portattn.options import (
    PLAIN_TENSORS,
    AttentionOptions,
    CallScalars,
    capturing,
    check_options,
    kept_record,
    needs_grad,
    options_signature,
)
from portattn.tensor_memo import derived, ramp, stream_key
from portattn.validation import (
    INT32_MAX,
    DTypeError,
    check_block_table_meta,
    check_key_counts,
    check_pages,
    host_values,
    type_name,
)

__all__ = ["kvcache_attention"]


# The checks shared with varlen_attention name its arguments, which this function calls k_cache,
# v_cache and return_softmax_lse (and its batch is q's, not that of a cu_seqlens).
_SHARED_NAMES = {
    "k": "k_cache",
    "v": "v_cache",
    "return_lse": "return_softmax_lse",
    "cu_seqlens": "q",  # block_table's B: "the batch of q"
}
# A whole word, not an attribute or a quoted value (``kernel='k'`` stays as given).
_SHARED_NAME = re.compile(r"(?<![\w.'])(" + "|".join(_SHARED_NAMES) + r")(?![\w'])")


@contextlib.contextmanager
def _named_as_here() -> Iterator[None]:
    """Errors of the shared checks in this block, worded with this function's argument names;
    the error keeps its type and traceback."""
    try:
        yield
    except (TypeError, ValueError) as err:
        if err.args and isinstance(err.args[0], str):
            renamed = _SHARED_NAME.sub(lambda m: _SHARED_NAMES[m.group(1)], err.args[0])
            err.args = (renamed, *err.args[1:])
        raise


def _index_tensor(name: str, x, batch: int, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
    if x.dtype != torch.int32:
        raise DTypeError(f"{name} must have dtype torch.int32, got {x.dtype}")
    if x.shape != (batch,):
        raise ValueError(f"{name} must be [B] = [{batch}], got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {x.device}")
    return x


def _cache_seqlens(cache_seqlens, batch: int, capacity: int, device) -> torch.Tensor | int:
    """The keys already in each sequence's cache: an int32 [B] tensor as given, or an int
    (given for all, or None: the full cache) that the checks and the index arithmetic use as
    it is, with no device tensor to read back."""
    if cache_seqlens is None:
        return capacity
    if type(cache_seqlens) is torch.Tensor:  # the common case first: no ABC check
        return _index_tensor("cache_seqlens", cache_seqlens, batch, device)
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= capacity:
            raise ValueError(f"cache_seqlens must be in [0, {capacity}], got {cache_seqlens}")
        return int(cache_seqlens)
    return _index_tensor("cache_seqlens", cache_seqlens, batch, device)


def _check_new_kv(k, v, q, k_cache, v_cache) -> int:
    """The new keys and values to append, [B, S_new, Hkv, D] and [B, S_new, Hkv, Dv] like the
    caches' rows; returns S_new (0 without them)."""
    if k is None and v is None:
        return 0
    if k is None or v is None:
        raise ValueError("k and v must be given together (the new keys and values to append)")
    for name, x, cache in (("k", k, k_cache), ("v", v, v_cache)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
        if x.dtype != k_cache.dtype:
            raise DTypeError(f"{name} must have the cache's dtype {k_cache.dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on {q.device} like q, got {x.device}")
        want = (q.shape[0], x.shape[1] if x.dim() == 4 else -1, *cache.shape[2:])
        if x.dim() != 4 or tuple(x.shape) != want:
            raise ValueError(
                f"{name} must be [B, S_new, Hkv, {name}_cache's head dim] = [{q.shape[0]}, "
                f"S_new, {cache.shape[2]}, {cache.shape[3]}], got shape {tuple(x.shape)}"
            )
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must have the same shape but for the head dim, got {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    return k.shape[1]


def _check_values(cache_seqlens: torch.Tensor | int, block_table, batch_idx, sizes: tuple) -> bool:
    """The eager checks of the index tensors' values (host copies, once per tensor version;
    an int ``cache_seqlens`` is its own host value), before anything is written. Run once per
    version of the index tensors and these sizes (by :func:`_step_indices`' memo): the layers
    of a decode step check the step's indices at the first (loops over sequences and pages).
    ``sizes``: the batch, the new rows, the keys a cache holds, the page size and the cache's
    pages (or rows, dense)."""
    batch, new, capacity, page_size, n_cache_rows = sizes
    lens = [cache_seqlens] * batch if isinstance(cache_seqlens, int) else host_values(cache_seqlens)
    bad = [n for n in lens if n < 0]
    if bad:
        raise ValueError(f"cache_seqlens must be >= 0, got {bad[0]}")
    counts = [n + new for n in lens]
    check_key_counts("cache_seqlens + new keys", counts, capacity)
    if sum(counts) > INT32_MAX:  # cu_seqlens_k, their running sum, is int32
        raise ValueError(
            f"the sequences' keys (cache_seqlens + new keys) add up to {sum(counts)}, more "
            "than 2**31 - 1"
        )
    if block_table is not None:
        check_pages(block_table, counts, page_size, n_cache_rows)
        check_written_slots(host_values(block_table), lens, new, page_size)  # copied: no sync
    if batch_idx is not None:
        rows = host_values(batch_idx)
        outside = [r for r in rows if not 0 <= r < n_cache_rows]
        if outside:
            raise ValueError(
                f"cache_batch_idx names cache row {outside[0]}, outside the cache's "
                f"{n_cache_rows} rows"
            )
        if new and len(set(rows)) != len(rows):
            raise ValueError("cache_batch_idx must not repeat a row when new keys are appended")
    return True


def _step_indices(
    seqlens, block_table, rows, sizes: tuple, seqlen_q: int, device, in_graph: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_q, cu_seqlens_k) of a call, the index tensors' values checked first
    (:func:`_check_values`, eager calls only). The same for every layer of a decode step: kept
    per version of the index tensors (one lookup a call; ``tensor_memo.derived``)."""
    batch, new = sizes[:2]

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        if not in_graph:
            _check_values(seqlens, block_table, rows, sizes)
        cu_seqlens_k = cache_cu_seqlens(seqlens, new, batch, device, in_graph)
        return ramp(batch + 1, seqlen_q, device, in_graph), cu_seqlens_k

    if in_graph:
        return make()
    tensors = (block_table, rows)
    if isinstance(seqlens, int):
        extra = (seqlens, sizes, seqlen_q, device, stream_key(device))
    else:
        tensors, extra = (seqlens, *tensors), (sizes, seqlen_q, device, stream_key(device))
    return derived("kvcache_step", tensors, extra, make)


def _check_launchable(q_rows, k_cache, v_cache, kernel: str) -> None:
    """What the forward op would reject only once it plans its launch (its configuration
    lookup, the row strides of odd multiples of 8), checked before the append writes the
    caches: a rejected call leaves them as they were."""
    resolve_config(q_rows.device, kernel, q_rows.shape[-1], q_rows.dtype, v_cache.shape[-1])
    check_row_strides(q_rows, k_cache, v_cache)  # the tensors the op gets, as it checks them


def _check_writable(caches: dict[str, torch.Tensor]) -> None:
    """The append writes the caches in place, k_cache first: an in-place write PyTorch would
    refuse to the second (an inference tensor outside ``torch.inference_mode``) is refused
    here, before the first."""
    if torch.is_inference_mode_enabled():
        return
    for name, cache in caches.items():
        if cache.is_inference():
            raise ValueError(
                f"{name} is an inference tensor (made under torch.inference_mode) and k/v are "
                "appended to it in place, which PyTorch allows only inside "
                "torch.inference_mode: call there, or pass a clone"
            )


@dataclass(frozen=True)
class _CheckedCall:
    """What the checks of a call's layouts and options found (:func:`_check_call`), kept per
    call signature (:func:`_call_signature`): the layers of a decode step, and the steps after,
    are checked once. ``cache_spans``: the caches' byte ranges, which the new rows' memory (it
    moves from call to call) is checked against on every call."""

    options: AttentionOptions
    new: int  # S_new, the rows appended (0: none)
    page_size: int
    capacity: int  # the keys a sequence's cache holds
    cache_spans: tuple[tuple[int, int], ...]
    row_extents: tuple[int, ...]  # the new k and v rows' byte extents (kvcache_checks)
    # The launches of this signature (forward_entry.run_kept_forward's, append_rows' append).
    templates: dict[tuple, tuple] = field(default_factory=dict, compare=False)


_CHECKED_CALLS: dict[tuple, _CheckedCall] = {}  # by _call_signature (options.kept_record)


def _call_signature(tensors: tuple, no_batch_idx: bool, scalars: CallScalars) -> tuple | None:
    """What :func:`_check_call` reads, or None where it is not kept (the checks then run):
    :func:`check_options`' signature, the new rows' and the block table's layouts (not their
    addresses), the grad and inference states, the caches' addresses (an append must not write
    one through the other) and the family override (the configuration lookup)."""
    q, k_cache, v_cache, k, v, block_table = tensors
    base = options_signature(q, k_cache, v_cache, scalars, 2, None)
    if base is None:
        return None
    layouts = []
    for t in (k, v, block_table):
        if t is None:
            layouts.append(None)
        elif type(t) in PLAIN_TENSORS:
            layouts.append((type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        else:  # a subclass, or not a tensor: checked every call
            return None
    grad = (torch.is_grad_enabled(), q.requires_grad, k_cache.requires_grad, v_cache.requires_grad)
    inference = (torch.is_inference_mode_enabled(), k_cache.is_inference(), v_cache.is_inference())
    caches = (k_cache.data_ptr(), v_cache.data_ptr())
    return (base, *layouts, no_batch_idx, grad, inference, caches, override_setting())


def _check_call(
    tensors: tuple, cache_batch_idx, scalars: CallScalars, compiling: bool
) -> _CheckedCall:
    """The checks of everything but the index tensors' values (:func:`_check_values`), in
    order; all of them run before anything is written."""
    q, k_cache, v_cache, k, v, block_table = tensors
    with _named_as_here():
        options = check_options(
            q, k_cache, v_cache, **scalars._asdict(), token_dims=2, compiling=compiling
        )
    if needs_grad(q, k_cache, v_cache, *(x for x in (k, v) if isinstance(x, torch.Tensor))):
        raise ValueError(
            "flash_attn_with_kvcache is inference-only: its tensors must not require grad "
            "(use torch.no_grad(), or detach them)"
        )
    batch, seqlen_q, n_heads_q, head_dim = q.shape
    new = _check_new_kv(k, v, q, k_cache, v_cache)
    if new:  # from the layouts alone: checked while a CUDA graph is captured too
        check_append_memory({"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v})
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx applies to dense caches, not with a block_table")
        with _named_as_here():
            page_size = check_block_table_meta(block_table, k_cache, batch, q.device)
        capacity = block_table.shape[1] * page_size
    else:
        page_size = capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < batch:
            raise ValueError(
                f"k_cache has {k_cache.shape[0]} rows for a batch of {batch}: pass "
                "cache_batch_idx, or a cache with a row per sequence"
            )
    _check_launchable(
        q.reshape(batch * seqlen_q, n_heads_q, head_dim), k_cache, v_cache, scalars.kernel
    )
    if new:
        _check_writable({"k_cache": k_cache, "v_cache": v_cache})
    extents = byte_extents((k, v)) if new else ()
    return _CheckedCall(options, new, page_size, capacity, byte_spans((k_cache, v_cache)), extents)


def kvcache_attention(
    tensors: tuple, cache_seqlens, cache_batch_idx, scalars: CallScalars, compiling: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`portattn.flash_attn_with_kvcache` after its feature checks: ``tensors`` its
    ``(q, k_cache, v_cache, k, v, block_table)``, ``scalars`` its options as given,
    ``compiling`` read in its frame. Checks (kept per call signature), appends, attends."""
    q, k_cache, v_cache, k, v, block_table = tensors
    key = None if compiling else _call_signature(tensors, cache_batch_idx is None, scalars)
    call = kept_record(
        _CHECKED_CALLS, key, lambda: _check_call(tensors, cache_batch_idx, scalars, compiling)
    )
    if call.new:  # the new rows' memory, which moves from call to call (a kept call's check)
        appended = {"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v}
        check_rows_apart(call.cache_spans, call.row_extents, appended)
    new, page_size, capacity = call.new, call.page_size, call.capacity
    return_lse = bool(scalars.return_lse)
    batch, seqlen_q, n_heads_q, head_dim = q.shape
    in_graph = capturing(q)
    if block_table is not None:
        table, batch_idx = block_table, None
    else:
        if cache_batch_idx is None:
            batch_idx = ramp(batch, 1, q.device, in_graph)
        else:
            batch_idx = _index_tensor("cache_batch_idx", cache_batch_idx, batch, q.device)
        # A dense cache: one page of S_cache rows per sequence (a view, kept per tensor).
        table = derived("column", (batch_idx,), (), lambda: batch_idx[:, None], use=not in_graph)
    seqlens = _cache_seqlens(cache_seqlens, batch, capacity, q.device)
    rows = None if cache_batch_idx is None else batch_idx  # a dense cache's given rows
    sizes = (batch, new, capacity, page_size, k_cache.shape[0])
    cu_seqlens_q, cu_seqlens_k = _step_indices(seqlens, block_table, rows, sizes, seqlen_q,
                                               q.device, in_graph)  # fmt: skip
    q_rows = q.reshape(batch * seqlen_q, n_heads_q, head_dim)
    if new:
        kept = None if key is None or in_graph else call.templates
        append_rows(k_cache, v_cache, k, v, seqlens, block_table, page_size, rows, in_graph, kept)
    inputs = (q_rows, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, table)
    if key is None or in_graph:
        out, lse = run_forward(
            *inputs[:5],
            seqlen_q,
            capacity,
            call.options,
            block_table=table,
            compiling=compiling,
            lse_needed=return_lse,
        )
    else:  # the forward's launches kept with this signature's record
        out, lse = run_kept_forward(inputs, seqlen_q, capacity, call.options, return_lse,
                                    call.templates)  # fmt: skip
    out = out.view(batch, seqlen_q, n_heads_q, v_cache.shape[-1])  # v's head dim
    if not return_lse:
        return out
    return out, lse.view(batch, seqlen_q, n_heads_q).permute(0, 2, 1).contiguous()
