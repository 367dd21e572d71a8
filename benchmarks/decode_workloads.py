"""The decode benchmark's workloads (:class:`DecodeWorkload`, :func:`default_workloads`: decode
and append steps at B = 1 ... 256 and one or eight 32k-key sequences) and their inputs: one set
of K/V values as packed rows, a paged cache (pages in a seeded random order) and a dense one
(:func:`make_inputs`), with the float32 reference of a few sequences (:func:`reference_rows`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

PAGE_SIZE = 64
KV_RANGE = (512, 8192)
BATCHES = (1, 8, 64, 256)
CHECK_SEQS = 4  # sequences compared with the float32 reference


@dataclass(frozen=True)
class DecodeWorkload:
    """B sequences: ``q_len`` query rows each, the last ``q_len`` of its ``kv_lens[b]`` keys."""

    name: str
    kv_lens: tuple[int, ...]
    q_len: int
    n_heads_q: int
    n_heads_k: int
    head_dim: int
    flex: bool = False  # FlexAttention is timed here (it compiles per shape)

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    def kv_bytes(self) -> int:
        """K and V bytes read once: ``sum(kv_len) * Hkv * D * 2 tensors * 2 bytes (bf16)``."""
        return sum(self.kv_lens) * self.n_heads_k * self.head_dim * 2 * 2

    def describe(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), batch=self.batch, kv_bytes=self.kv_bytes())


def kv_lengths(batch: int, seed: int = 0, lo: int = KV_RANGE[0], hi: int = KV_RANGE[1]):
    """``batch`` lengths uniform in ``lo...hi`` (both included), from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(lo, hi + 1, (batch,), generator=gen).tolist())


def _workload(q_len: int, lens: tuple[int, ...], hq: int, hk: int, d: int, tag: str = ""):
    kind = "decode" if q_len == 1 else f"append{q_len}"
    name = f"{kind} B{len(lens)}{tag} gqa{hq}/{hk} d{d}"
    flex = len(lens) >= 64 and (hq, hk, d) == (32, 8, 128) and not tag
    return DecodeWorkload(name, lens, q_len, hq, hk, d, flex)


def default_workloads(seed: int = 0) -> list[DecodeWorkload]:
    """The 19 workloads of ``--decode`` (names are stable: reports match rows by name)."""
    out = [_workload(q, kv_lengths(b, seed), 32, 8, 128) for q in (1, 4, 16) for b in BATCHES]
    for hq, hk, d in ((8, 1, 128), (32, 8, 64)):
        out += [_workload(1, kv_lengths(b, seed), hq, hk, d) for b in (64, 256)]
    out.append(_workload(16, kv_lengths(64, seed), 8, 1, 128))
    out.append(_workload(1, (32768,) * 8, 32, 8, 128, tag=" 32k"))
    out.append(_workload(1, (32768,), 32, 8, 128, tag=" 32k"))  # one long sequence
    return out


def quick_workloads(seed: int = 0) -> list[DecodeWorkload]:
    """``--quick``: decode only, GQA 32/8 d128, B = 64 and 256."""
    keep = ("decode B64 gqa32/8 d128", "decode B256 gqa32/8 d128")
    return [w for w in default_workloads(seed) if w.name in keep]


def select_workloads(quick: bool = False, patterns: list[str] | None = None):
    out = quick_workloads() if quick else default_workloads()
    if patterns:
        out = [w for w in out if any(p.lower() in w.name.lower() for p in patterns)]
    return out


# --- inputs: one set of K/V values in three layouts ------------------------------------------


def paged_layout(kv_lens: tuple[int, ...], page_size: int = PAGE_SIZE, seed: int = 0):
    """A shuffled page pool: ``block_table`` int32 [B, max pages] (unused entries 0) and, for
    every key of the packed order, its row in the pool viewed as [num_pages * page_size]."""
    pages = [math.ceil(n / page_size) for n in kv_lens]
    total = sum(pages)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(total, generator=gen)
    table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    slots, start = [], 0
    for b, (n, p) in enumerate(zip(kv_lens, pages)):
        mine = perm[start : start + p]
        table[b, :p] = mine.to(torch.int32)
        pos = torch.arange(n)
        slots.append(mine[pos // page_size] * page_size + pos % page_size)
        start += p
    return table, torch.cat(slots), total


@dataclass
class DecodeInputs:
    q: torch.Tensor  # [B, Sq, Hq, D]
    k: torch.Tensor  # packed [total_k, Hkv, D]
    v: torch.Tensor
    cu_q: torch.Tensor  # int32 [B + 1]
    cu_k: torch.Tensor
    seqlens: torch.Tensor  # int32 [B]: cache_seqlens / seqused_k
    k_pages: torch.Tensor  # [num_pages, PAGE_SIZE, Hkv, D]
    v_pages: torch.Tensor
    block_table: torch.Tensor  # int32 [B, max pages]
    k_dense: torch.Tensor  # [B, S_cache, Hkv, D]
    v_dense: torch.Tensor


def make_inputs(w: DecodeWorkload, device="cuda", dtype=torch.bfloat16, seed: int = 0):
    """Seeded normal q and K/V; the paged and dense caches hold the packed K/V's values (their
    unused slots random too: FA4 needs finite rows in a last, partly used page)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b, hk, d = w.batch, w.n_heads_k, w.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    lens = torch.tensor(w.kv_lens)
    total = int(lens.sum())
    q = randn(b, w.q_len, w.n_heads_q, d)
    k, v = randn(total, hk, d), randn(total, hk, d)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    cu_q = torch.arange(b + 1) * w.q_len
    table, slots, n_pages = paged_layout(w.kv_lens, PAGE_SIZE, seed)
    slots = slots.to(device)
    k_pages, v_pages = randn(n_pages, PAGE_SIZE, hk, d), randn(n_pages, PAGE_SIZE, hk, d)
    k_pages.view(-1, hk, d)[slots] = k
    v_pages.view(-1, hk, d)[slots] = v
    s_cache = math.ceil(max(w.kv_lens) / PAGE_SIZE) * PAGE_SIZE
    seq = torch.repeat_interleave(torch.arange(b), lens).to(device)
    pos = (torch.arange(total) - torch.repeat_interleave(cu_k[:-1], lens)).to(device)
    k_dense, v_dense = randn(b, s_cache, hk, d), randn(b, s_cache, hk, d)
    k_dense[seq, pos] = k
    v_dense[seq, pos] = v

    def i32(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=device, dtype=torch.int32)

    return DecodeInputs(
        q, k, v, i32(cu_q), i32(cu_k), i32(lens), k_pages, v_pages, i32(table), k_dense, v_dense
    )


def reference_rows(w: DecodeWorkload, inp: DecodeInputs, seqs: list[int]) -> torch.Tensor:
    """float32 attention of sequences ``seqs``: rows [len(seqs) * Sq, Hq, D]; query row i of a
    sequence of n keys sees keys 0 ... n - Sq + i."""
    group, out = w.n_heads_q // w.n_heads_k, []
    cu = inp.cu_k.tolist()
    for b in seqs:
        n = w.kv_lens[b]
        q = inp.q[b].float().transpose(0, 1)  # [Hq, Sq, D]
        k = inp.k[cu[b] : cu[b + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        v = inp.v[cu[b] : cu[b + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        s = q @ k.transpose(1, 2) / math.sqrt(w.head_dim)
        rows = torch.arange(w.q_len, device=s.device)[:, None] + (n - w.q_len)
        s = s.masked_fill(torch.arange(n, device=s.device)[None, :] > rows, float("-inf"))
        out.append((s.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(out)


def check_seqs(batch: int) -> list[int]:
    """The sequences compared with the reference: first, second, middle, last."""
    return sorted({0, min(1, batch - 1), batch // 2, batch - 1})[:CHECK_SEQS]
