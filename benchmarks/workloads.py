"""The benchmark's workloads: packed varlen batches (:class:`Workload`), the full run's twelve
(:func:`default_workloads`), their other seeds, ``--quick``'s, the fixed-cost packs the GPU
probes in ci/ take by name, and their seeded inputs (:func:`make_inputs`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.bench_report import MODES

SKEWED_CHOICES = (64, 128, 300, 512, 1000, 2048, 3000, 4096)


@dataclass(frozen=True)
class Workload:
    """One packed batch: sequence lengths (queries and keys alike), heads, head dim, mask."""

    name: str
    lengths: tuple[int, ...]
    n_heads_q: int
    n_heads_k: int
    head_dim: int
    causal: bool

    @property
    def equal(self) -> bool:
        """All sequences of one length: SDPA's dense layout is a view of the packed tensors."""
        return len(set(self.lengths)) == 1

    def flops(self, mode: str) -> float:
        """Useful FLOPs of one call: ``4 * S^2 * D`` per query head and sequence (the two
        matrix products), halved for causal; forward+backward is 3.5x the forward."""
        fwd = sum(4.0 * n * n * self.head_dim * self.n_heads_q for n in self.lengths)
        fwd = fwd / 2 if self.causal else fwd
        return fwd * (3.5 if mode == "fwd+bwd" else 1.0)

    def describe(self) -> dict[str, Any]:
        """The workload as plain data for the JSON file."""
        return dict(
            name=self.name,
            lengths=list(self.lengths),
            n_heads_q=self.n_heads_q,
            n_heads_k=self.n_heads_k,
            head_dim=self.head_dim,
            causal=self.causal,
            flops={mode: self.flops(mode) for mode in MODES},
        )


def skewed_lengths(total: int, seed: int = 0) -> tuple[int, ...]:
    """Lengths drawn from 64...4096 summing exactly to ``total`` (fixed seed: the same pack in
    every run). Every length is one of ``SKEWED_CHOICES`` except the last, which is cut to what
    is left of ``total`` and may therefore be shorter than 64 (it is 1224 for 16k and 396 for
    32k with seed 0)."""
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < total:
        out.append(min(rng.choice(SKEWED_CHOICES), total - sum(out)))
    return tuple(out)


def _workload(pack: str, lengths: tuple[int, ...], hq: int, hk: int, d: int, causal: bool):
    heads = f"h{hq}" if hq == hk else f"gqa{hq}/{hk}"
    name = f"{pack} {heads} d{d} {'causal' if causal else 'full'}"
    return Workload(name, lengths, hq, hk, d, causal)


def default_workloads() -> list[Workload]:
    """The 12 workloads of a full run (names are stable: reports are compared by name)."""
    equal = (8192, 8192)
    packs = [  # (pack name, lengths, query heads, kv heads, head dim)
        ("equal 2x8192", equal, 16, 16, 128),
        ("skewed 32k", skewed_lengths(32768), 16, 16, 128),
        ("equal 2x8192", equal, 16, 16, 64),
        ("skewed 16k", skewed_lengths(16384), 16, 16, 64),
        ("equal 2x8192", equal, 32, 8, 128),
        ("skewed 32k", skewed_lengths(32768), 32, 8, 128),
    ]
    return [_workload(*p, causal) for p in packs for causal in (False, True)]


def seed_workloads(seeds: int) -> list[Workload]:
    """``--seeds N``: the skewed packs again with seeds 1 .. N - 1 ("skewed 32k seed1 h16 d128
    causal", ...): other mixes of the same lengths, so a ratio is not one pack's luck."""
    packs = [
        ("skewed 32k", 32768, 16, 16, 128),
        ("skewed 16k", 16384, 16, 16, 64),
        ("skewed 32k", 32768, 32, 8, 128),
    ]
    return [
        _workload(f"{pack} seed{seed}", skewed_lengths(total, seed), hq, hk, d, causal)
        for seed in range(1, seeds)
        for pack, total, hq, hk, d in packs
        for causal in (False, True)
    ]


def quick_workloads() -> list[Workload]:
    """``--quick``: equal 2x8192 and skewed 32k, H = 16, D = 128, causal and full."""
    keep = ("equal 2x8192 h16 d128 ", "skewed 32k h16 d128 ")
    return [w for w in default_workloads() if w.name.startswith(keep)]


def overhead_workloads() -> list[Workload]:
    """Packs where each program's fixed costs weigh most (not in a bench run; the GPU probes
    in ci/ take them by name): a small varlen call, RL-like packs of 64 sequences of random
    lengths 32..2048 (seeded), and 1024 sequences of one 128-row tile each."""
    rng = random.Random(0)
    rl = tuple(rng.randint(32, 2048) for _ in range(64))
    return [
        Workload("small 4x256 gqa32/8 d128 causal", (256,) * 4, 32, 8, 128, True),
        Workload("rl 64x(32..2048) gqa32/8 d128 causal", rl, 32, 8, 128, True),
        Workload("rl 64x(32..2048) h16 d128 full", rl, 16, 16, 128, False),
        Workload("rl 64x(32..2048) h16 d64 causal", rl, 16, 16, 64, True),
        Workload("tiles 1024x128 h16 d128 full", (128,) * 1024, 16, 16, 128, False),
    ]


def named_workloads(names: list[str]) -> list[Workload]:
    """The bench's and ``overhead_workloads``' packs named exactly by ``names``, in their
    order (the GPU probes in ci/ take workloads so); an unknown name raises ``ValueError``."""
    known = {w.name: w for w in default_workloads() + overhead_workloads() + seed_workloads(3)}
    missing = [name for name in names if name not in known]
    if missing:
        raise ValueError(f"unknown workload(s) {missing}; known: {sorted(known)}")
    return [known[name] for name in names]


def select_workloads(
    quick: bool = False, patterns: list[str] | None = None, seeds: int = 1
) -> list[Workload]:
    """The workloads of a run: all or ``--quick`` (with ``seeds`` > 1 the skewed packs of
    :func:`seed_workloads` too), then those whose name contains any of the ``--workloads``
    substrings (case-insensitive)."""
    out = quick_workloads() if quick else default_workloads() + seed_workloads(seeds)
    if patterns:
        out = [w for w in out if any(p.lower() in w.name.lower() for p in patterns)]
    return out


def make_inputs(w: Workload, device: str | torch.device = "cuda", dtype=torch.bfloat16):
    """Packed q [T, Hq, D], k and v [T, Hkv, D] (seeded normal), and int32 cu_seqlens."""
    total = sum(w.lengths)
    gen = torch.Generator(device=device).manual_seed(0)

    def mk(n_heads: int) -> torch.Tensor:
        return torch.randn(total, n_heads, w.head_dim, device=device, generator=gen, dtype=dtype)

    q, k, v = mk(w.n_heads_q), mk(w.n_heads_k), mk(w.n_heads_k)
    cu = torch.tensor([0, *torch.tensor(w.lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu.to(device)
