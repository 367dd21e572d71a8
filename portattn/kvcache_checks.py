"""Host checks of ``flash_attn_with_kvcache``'s in-place append: every element it writes is
written once, and nothing it writes is memory it reads or writes through another tensor.

Two (sequence, position) pairs written to one (page, slot) would leave one of the two values,
whichever write lands last: :func:`check_written_slots` refuses that from the host values of the
block table and the lengths (no extra host copy). :func:`check_append_memory` refuses caches
and new keys/values that share memory, from the tensors' layouts alone (no device work, so it
also runs while a CUDA graph is captured). Sharing is decided element by element, not by
address range: k and v caches interleaved in one buffer (``kv[:, :, 0]``, ``kv[:, :, 1]``, or
halves of one last dim) share no element and are accepted.
"""

from __future__ import annotations

import torch

# Work bound of the exact element-sharing search (:func:`_offset_reachable`); layouts that need
# more (none that a cache has) count as sharing memory: refused, never written twice.
_SEARCH_BUDGET = 4096


def check_written_slots(rows: list[list[int]], lens: list[int], new: int, page_size: int) -> None:
    """Paged append: position ``lens[b] + i`` (``i < new``) of sequence ``b`` is written to
    slot ``p % page_size`` of page ``rows[b][p // page_size]``; no two pairs may name one slot
    (pages that sequences only read, a shared prefix, may be shared). ``rows``: the block
    table's host values, each sequence's written pages inside the cache (checked before)."""
    if not new:
        return
    written = [rows[b][n // page_size : (n + new - 1) // page_size + 1] for b, n in enumerate(lens)]
    pages = [p for row in written for p in row]
    if len(set(pages)) == len(pages):  # no page written twice (the common case): one pass
        return
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    for b, n in enumerate(lens):
        for pos in range(n, n + new):
            slot = (rows[b][pos // page_size], pos % page_size)
            if slot in owner:
                b0, pos0 = owner[slot]
                raise ValueError(
                    f"block_table maps position {pos0} of sequence {b0} and position {pos} of "
                    f"sequence {b} to one cache slot (page {slot[0]}, slot {slot[1]}): the "
                    "append would write it twice, keeping one of the two"
                )
            owner[slot] = (b, pos)


def check_append_memory(tensors: dict[str, torch.Tensor]) -> None:
    """The tensors of an append, by argument name (caches first): the caches must not share
    memory with each other or with the new keys/values, and a cache may not write one element
    through two indices (a broadcast, stride-0 dim)."""
    names = list(tensors)
    for name in names[:2]:  # the caches
        x = tensors[name]
        if any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())):
            raise ValueError(
                f"{name} has a broadcast (stride 0) dim, strides {x.stride()}: the append "
                "would write several of its elements to one memory location; pass a "
                "contiguous cache"
            )
    spans = {name: _byte_range(x) for name, x in tensors.items()}  # once per tensor
    for i, a in enumerate(names[:2]):
        for b in names[i + 1 :]:
            if _apart(spans[a], spans[b]):  # the common case: no element in common
                continue
            if shares_memory(tensors[a], tensors[b]):
                raise ValueError(
                    f"{a} and {b} share memory: the append writes {a} in place, so it may not "
                    f"overlap {b} (pass separate tensors)"
                )


def byte_spans(tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[int, int], ...]:
    """Each tensor's [first, last + 1) byte addresses."""
    return tuple(_byte_range(x) for x in tensors)


def byte_extents(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    """Each tensor's bytes from its first to past its last element (its layout's alone)."""
    return tuple(end - start for start, end in map(_byte_range, tensors))


def check_rows_apart(
    cache_spans: tuple[tuple[int, int], ...],
    row_extents: tuple[int, ...],
    tensors: dict[str, torch.Tensor],
):
    """:func:`check_append_memory` of ``tensors`` (the caches, then the new rows) whose caches
    passed it with these layouts before (their byte ranges ``cache_spans``, :func:`byte_spans`;
    the rows' :func:`byte_extents`), where only the new rows' addresses are new: the address
    ranges alone when the rows lie apart from the caches (the common case), else the whole
    check."""
    rows = list(tensors.values())[2:]  # after the caches, as check_append_memory takes them
    for x, extent in zip(rows, row_extents):
        start = x.data_ptr()
        for span in cache_spans:
            if not _apart((start, start + extent), span):
                check_append_memory(tensors)
                return


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some byte of an element of ``a`` is a byte of an element of ``b`` (from their
    layouts, no device work). Exact for two tensors of one element size (the search gives up
    after :data:`_SEARCH_BUDGET` steps and answers True)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if _apart(_byte_range(a), _byte_range(b)):
        return False
    size = a.element_size()
    delta = b.data_ptr() - a.data_ptr()
    if b.element_size() != size or delta % size:  # elements not on one grid: bytes overlap
        return True
    # a[i] is b[j] iff a's offset of i minus b's offset of j is delta (in elements): digits
    # i_k and -j_k of the strides, merged where a stride is shared (their ranges add up).
    ranges: dict[int, list[int]] = {}
    for x, sign in ((a, 1), (b, -1)):
        for n, s in zip(x.shape, x.stride()):
            if n > 1 and s:
                lo_hi = ranges.setdefault(s, [0, 0])
                lo_hi[0 if sign < 0 else 1] += sign * (n - 1)
    digits = sorted(((s, lo, hi) for s, (lo, hi) in ranges.items()), reverse=True)
    return _offset_reachable(delta // size, digits, [_SEARCH_BUDGET])


def _apart(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two [first, last + 1) byte ranges share no byte."""
    return a[1] <= b[0] or b[1] <= a[0]


def _byte_range(x: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte address of ``x``'s elements (strides are never negative)."""
    last = 0
    for n, s in zip(x.shape, x.stride()):
        last += (n - 1) * s
    start = x.data_ptr()
    return start, start + (last + 1) * x.element_size()


def _offset_reachable(target: int, digits: list[tuple[int, int, int]], budget: list[int]) -> bool:
    """Whether ``target == sum(d_k * s_k)`` for integer digits ``lo_k <= d_k <= hi_k``
    (``digits``: (s_k, lo_k, hi_k), strides descending): a depth-first search that keeps only
    the digits after which the rest can still reach the target (one or two per stride for
    a cache's nested strides)."""
    if not digits:
        return target == 0
    budget[0] -= 1
    if budget[0] < 0:
        return True  # undecided: counted as sharing
    (s, lo, hi), rest = digits[0], digits[1:]
    rest_lo = sum(r_s * r_lo for r_s, r_lo, _ in rest)
    rest_hi = sum(r_s * r_hi for r_s, _, r_hi in rest)
    first = max(lo, -((rest_hi - target) // s))  # ceil((target - rest_hi) / s)
    last = min(hi, (target - rest_lo) // s)
    return any(_offset_reachable(target - d * s, rest, budget) for d in range(first, last + 1))
