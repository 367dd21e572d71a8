"""``python benchmarks/bench.py``: portattn's kernels against SDPA and FlexAttention, one run.

Workloads (:func:`default_workloads`) are packed varlen batches in bfloat16: equal-length packs
(2 x 8192 tokens, so dense SDPA is a natural peer) and skewed packs (16k or 32k tokens in
sequences of 64...4096, fixed seed), H = 16 with D = 128 or 64, and GQA with 32 query / 8 kv
heads at D = 128; each causal and full; timed forward and forward+backward.

Peers, timed in the same run: FlashAttention-4 (``flash_attn.cute``, deterministic=True and its
default) where it imports (``source .fa4/install.sh`` on the H200), SDPA with the cuDNN and the
flash backend (equal packs only: they need the dense [B, H, S, D] layout, which the packed
tensors are viewed as, without a copy),
FlexAttention with a document mask (every pack, ``torch.compile``-d), torch's ``varlen_attn``
(``torch.nn.attention.varlen``, FlashAttention-2, on the packed tensors; where the installed
torch has what the workload needs) and both portattn kernels through the public
``portattn.varlen_attention``. An implementation that fails (setup, first
call or timing) gets rows with the error message instead of timings; the run goes on.

Timing. Each implementation's first call per mode runs outside the timings (Triton JIT,
FlexAttention's compile); FlexAttention's first-call seconds are reported as its compile time,
per workload and mode. Inductor's caches apply as found: a pack whose shapes were compiled
before (on disk, or earlier in the run: skewed 16k d64 has the shapes of equal 2x8192 d64)
reports little more than a cache lookup. Then ``HEAT_S`` seconds of untimed calls of every
implementation (the GPU as busy before the first timing as before the others), then ``--passes``
passes (two: the second in reverse order; more: ``pass_order``), each timing every
implementation with ``triton.testing.do_bench(..., return_mode="median")``; the reports take
the best of the medians. While timing, ``torch.compiler`` is set to fail on
a recompile, so a compile can never hide inside a timing (it fails that implementation instead).

L2. The H200 has 50 MiB of L2 and some inputs would fit (16k x 16 x 64 bf16 is 32 MiB).
Triton 3.6's ``do_bench`` (``triton/testing.py``) calls ``runtime.driver.active.clear_cache``
before every timed repeat, outside the timed events; on CUDA that is ``cache.zero_()`` on a
256 MB buffer (``get_empty_cache_for_benchmark`` in ``triton/backends/nvidia/driver.py``),
which evicts everything the previous repeat left in L2. So no repeat reuses L2; nothing more is
done here. (The untimed warm-up calls are not separated by flushes; they are not measured.)

FLOPs: useful FLOPs, flash-attention convention: forward ``4 * Sq * Sk * D`` per query head
and sequence, halved for causal; forward+backward 3.5x forward. Peak memory:
``torch.cuda.max_memory_allocated`` over one call after a reset (outside ``do_bench``, whose
256 MB flush buffer would otherwise count), in GiB, with the resident inputs counted.

Reports (markdown, JSON, PNG chart): :mod:`benchmarks.bench_report`. ``--decode`` runs
:mod:`benchmarks.bench_decode` instead. The chart needs matplotlib (``pip install -e
'.[bench]'``).

Run from a checkout (the benchmarks are not part of the installed package):
``python benchmarks/bench.py [--quick] [--decode] [--json PATH] ...``; ``--help`` lists the
options.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import random
import re
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/bench.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import bench_report as report
from benchmarks.bench_report import (
    CUDNN,
    FA4,
    FA4_DET,
    FIXED,
    FLASH,
    FLEX,
    MODES,
    TORCH_VARLEN,
    VARLEN,
)

WARMUP_MS = 50  # do_bench's warm-up and repetition budgets: about 0.4 s per do_bench call
REP_MS = 300
PASSES = 2  # timed passes per (workload, mode); the reports keep each implementation's best
# Seconds of untimed calls of every implementation, round robin, before a mode's first pass.
# Without them the first pass's first implementation was timed faster than in its later pass
# (perf-notes row 111, both cards' JSON: varlen, always first, its forwards 2-4% slower in its
# second pass on average, up to 8%; FA4 det's, third, 3-4% faster in theirs): the first calls
# before it (compiles, FlexAttention's seconds on the CPU) leave the GPU idle, the likely cause.
HEAT_S = 1.0
DOCS_STEM = "docs/bench"  # --docs: docs/bench-<card>.{json,md,png}, relative to the cwd


def docs_stem(stem: str) -> str:
    """``stem`` with the GPU's short name appended (``docs/bench`` -> ``docs/bench-h100`` on an
    H100), so a run on one card never overwrites another card's recorded tables. Without a GPU
    (``plot --docs`` re-rendering a recorded table) the H200's, the card of the issues' targets."""
    if not torch.cuda.is_available():
        return f"{stem}-h200"
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", torch.cuda.get_device_name().upper())
    return f"{stem}-{match.group(1).lower() if match else 'gpu'}"


SKEWED_CHOICES = (64, 128, 300, 512, 1000, 2048, 3000, 4096)
# torch.cuda covers both: ROCm builds of torch answer through the same API.
NEEDS_GPU = "a GPU (CUDA or ROCm)"


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


# --- implementations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Impl:
    """An attention implementation on packed [T, H, D] inputs. ``fn(q, k, v)`` returns the
    output in the implementation's own layout; ``view`` maps a packed tensor to that layout
    (without copying), so the output gradient can be made once, packed, for every peer."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    view: Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _portattn(w: Workload, cu: torch.Tensor, kernel: str) -> Impl:
    import portattn

    longest = max(w.lengths)

    # The public API as users call it, eager checks included (they read cu_seqlens on the host
    # each call: a few microseconds against calls of milliseconds).
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return portattn.varlen_attention(
            q, k, v, cu, cu, longest, longest, causal=w.causal, kernel=kernel
        )

    return Impl(fn, _identity)


def _sdpa(w: Workload, backend_name: str) -> Impl:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = getattr(SDPBackend, backend_name)
    b, s = len(w.lengths), w.lengths[0]
    # GQA through enable_gqa=True, not by repeating kv heads: SDPA then reads the same 8 kv
    # heads as portattn and FlexAttention do; a backend that refuses it is recorded as failed.
    gqa = w.n_heads_q != w.n_heads_k

    def dense(x: torch.Tensor) -> torch.Tensor:  # [B*S, H, D] -> [B, H, S, D], a view
        return x.view(b, s, x.shape[1], x.shape[2]).transpose(1, 2)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):  # this backend only: an unsupported shape raises
            return sdpa(dense(q), dense(k), dense(v), is_causal=w.causal, enable_gqa=gqa)

    return Impl(fn, dense)


def _flex(w: Workload, cu: torch.Tensor) -> Impl:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh Dynamo cache per workload: each workload compiles (and reports) its own kernels,
    # and the per-function recompile limit (8) is never reached across workloads.
    torch._dynamo.reset()
    device = cu.device
    counts = torch.tensor(w.lengths, device=device)
    doc = torch.repeat_interleave(torch.arange(len(w.lengths), device=device), counts)

    if w.causal:  # within one sequence, kv_idx <= q_idx is the causal mask

        def mask_mod(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]

    total = doc.numel()
    # Built once, outside the timings (a training step would reuse it across layers).
    block_mask = create_block_mask(mask_mod, None, None, total, total, device=device)
    flex = torch.compile(flex_attention, dynamic=False)
    gqa = w.n_heads_q != w.n_heads_k

    def packed_to_bhsd(x: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [1, H, T, D], a view
        return x.transpose(0, 1).unsqueeze(0)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qs, ks, vs = packed_to_bhsd(q), packed_to_bhsd(k), packed_to_bhsd(v)
        return flex(qs, ks, vs, block_mask=block_mask, enable_gqa=gqa)

    return Impl(fn, packed_to_bhsd)


def _torch_varlen(w: Workload, cu: torch.Tensor) -> Impl:
    """torch's ``varlen_attn`` (its FlashAttention-2 kernels) on the packed tensors, where the
    installed torch has it with what the workload needs: a causal form (``window_size`` (-1, 0)
    or ``is_causal``) and, for GQA, ``enable_gqa`` (torch 2.11 has none: those rows record why)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    if not cu.is_cuda:
        raise RuntimeError(f"torch varlen_attn needs CUDA tensors (inputs are on {cu.device})")
    kw = torch_varlen_options(w, inspect.signature(varlen_attn).parameters)
    longest = max(w.lengths)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return varlen_attn(q, k, v, cu, cu, longest, longest, **kw)

    return Impl(fn, _identity)


def torch_varlen_options(w: Workload, params: Any) -> dict[str, Any]:
    """The keywords of torch's ``varlen_attn`` for ``w``, given its signature's ``params``;
    NotImplementedError where that torch lacks one the workload needs."""
    kw: dict[str, Any] = {}
    if w.n_heads_q != w.n_heads_k:
        if "enable_gqa" not in params:
            raise NotImplementedError(
                f"unsupported: torch {torch.__version__}'s varlen_attn: no enable_gqa"
            )
        kw["enable_gqa"] = True
    if w.causal and "window_size" in params:
        kw["window_size"] = (-1, 0)  # causal, bottom-right aligned (Sq == Sk here)
    elif w.causal and "is_causal" in params:
        kw["is_causal"] = True
    elif w.causal:
        raise NotImplementedError(f"unsupported: torch {torch.__version__}'s varlen_attn: causal")
    return kw


def fa4_available() -> bool:
    """Whether FlashAttention-4 (``flash_attn.cute``) imports: a peer only where it is
    installed (``source .fa4/install.sh`` on the H200; never a dependency of portattn)."""
    try:
        from flash_attn.cute import flash_attn_varlen_func  # noqa: F401
    except Exception:  # not installed, or no CUDA toolchain for its DSL
        return False
    return True


def _fa4(w: Workload, cu: torch.Tensor, deterministic: bool) -> Impl:
    from flash_attn.cute import flash_attn_varlen_func

    longest = max(w.lengths)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        result = flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=longest,
            max_seqlen_k=longest,
            causal=w.causal,
            deterministic=deterministic,
        )
        return result[0] if isinstance(result, tuple) else result  # (out, lse) in 4.0 betas

    return Impl(fn, _identity)


def build_impls(
    w: Workload, cu: torch.Tensor, only: list[str] | None = None
) -> dict[str, Impl | str]:
    """The implementations that apply to ``w`` (with ``only``: those whose name contains one
    of its substrings, case-insensitive); a setup failure maps to its error message."""
    makers: dict[str, Callable[[], Impl]] = {
        VARLEN: lambda: _portattn(w, cu, "varlen"),
        FIXED: lambda: _portattn(w, cu, "fixed_order"),
    }
    if fa4_available():
        makers[FA4_DET] = lambda: _fa4(w, cu, deterministic=True)
        makers[FA4] = lambda: _fa4(w, cu, deterministic=False)
    if w.equal:
        makers[CUDNN] = lambda: _sdpa(w, "CUDNN_ATTENTION")
        makers[FLASH] = lambda: _sdpa(w, "FLASH_ATTENTION")
    makers[FLEX] = lambda: _flex(w, cu)
    makers[TORCH_VARLEN] = lambda: _torch_varlen(w, cu)
    if only:
        wanted = [o.lower() for o in only]
        makers = {n: m for n, m in makers.items() if any(o in n.lower() for o in wanted)}
    out: dict[str, Impl | str] = {}
    for name, make in makers.items():
        impl, error = attempt(make)
        out[name] = impl if error is None else error
    return out


# --- running ----------------------------------------------------------------------------------

Step = Callable[[], object]
Timer = Callable[[Step], tuple[float, float | None, float | None]]  # ms, peak GiB, resident GiB


def cuda_graph(fn: Callable[[], Any], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn`` captured in a CUDA graph after ``warmup`` calls on a side stream (as
    ``torch.cuda.graph``'s docs ask); returns the graph and the captured call's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def attempt(fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """``(fn(*args), None)``, or ``(None, message)`` if it raised. The message includes the
    warnings raised meanwhile: SDPA gives the reasons why a backend cannot run only as
    warnings before its "No available kernel" error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args), None
        except Exception as exc:  # report, do not hide: the tables show it as failed
            text = f"{type(exc).__name__}: {exc}".strip()
            extra = [m for m in dict.fromkeys(str(c.message) for c in caught) if m not in text]
            return None, "; ".join([text, *extra])[:4000]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(impl: Impl, mode: str, q, k, v, do: torch.Tensor | None) -> Step:
    """One timed call: the forward, or the forward and the gradients of q, k and v."""
    if mode == "fwd":
        return lambda: impl.fn(q, k, v)
    dout = impl.view(do)

    def step() -> None:
        out = impl.fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    return step


@contextlib.contextmanager
def _no_recompile() -> Iterator[None]:
    """While timing, a recompile raises instead of being timed (torch >= 2.6)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        yield
        return
    with set_stance("fail_on_recompile"):
        yield


def gpu_timer(
    step: Step, warmup_ms: int = WARMUP_MS, rep_ms: int = REP_MS
) -> tuple[float, float | None, float | None]:
    """Median ms of ``do_bench`` (L2 flushed before each repeat: see the module docstring; its
    warm-up and repeat budgets in ms), and the peak and resident memory in GiB of one call
    measured before it."""
    import triton.testing

    with _no_recompile():
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        ms = triton.testing.do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return ms, peak / 2**30, resident / 2**30


def profile_cuda(step: Step, calls: int) -> Any:
    """``torch.profiler``'s record of the CUDA activity of ``calls`` calls of ``step``, after
    one call outside it."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    return prof


def profile_cuda_us(step: Step, calls: int) -> dict[str, float]:
    """CUDA microseconds of each kernel (by name) over ``calls`` calls of ``step``, after one
    call outside the profile (``torch.profiler``; the CI scripts' per-kernel times)."""
    return {evt.key: evt.device_time_total for evt in profile_cuda(step, calls).key_averages()}


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """The CI scripts' ``--json``: their rows, in order, as JSON indented by one space."""
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


def make_inputs(w: Workload, device: str | torch.device = "cuda", dtype=torch.bfloat16):
    """Packed q [T, Hq, D], k and v [T, Hkv, D] (seeded normal), and int32 cu_seqlens."""
    total = sum(w.lengths)
    gen = torch.Generator(device=device).manual_seed(0)

    def mk(n_heads: int) -> torch.Tensor:
        return torch.randn(total, n_heads, w.head_dim, device=device, generator=gen, dtype=dtype)

    q, k, v = mk(w.n_heads_q), mk(w.n_heads_k), mk(w.n_heads_k)
    cu = torch.tensor([0, *torch.tensor(w.lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu.to(device)


def _first_call(impl: Impl, mode: str, args: tuple, do: torch.Tensor | None):
    """The step of ``impl`` in ``mode`` and the seconds of its first call (compiles included)."""
    step = make_step(impl, mode, *args, do)
    t0 = time.perf_counter()
    step()
    _sync(args[0].device)
    return step, time.perf_counter() - t0


def _row(w: Workload, mode: str, impl: str, pass_: int | None, **fields: Any) -> dict[str, Any]:
    """One row of the results (fields described in :mod:`benchmarks.bench_report`)."""
    row = {"workload": w.name, "mode": mode, "impl": impl, "pass": pass_, "ms": None}
    row.update(tflops=None, peak_gib=None, resident_gib=None, error=None)
    row.update(fields)
    return row


def run_workload(
    w: Workload,
    impls: dict[str, Impl | str],
    inputs: tuple[torch.Tensor, ...],
    timer: Timer = gpu_timer,
    log: Callable[[str], None] = print,
    passes: int = PASSES,
    heat_s: float = HEAT_S,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Time every implementation on ``w`` in both modes. Returns the rows and FlexAttention's
    first-call (compile) seconds per mode. A failure gives a row with the error, never raises."""
    q, k, v = inputs[:3]
    rows: list[dict[str, Any]] = []
    compile_s: dict[str, float] = {}

    def failed(name: str, mode: str, error: str, pass_: int | None = None) -> None:
        rows.append(_row(w, mode, name, pass_, error=error))
        log(f"{w.name:32s} {mode:8s} {name:22s} FAILED: {error[:300]}")

    for mode in MODES:
        if mode == "fwd":
            args, do = (q, k, v), None
        else:  # leaves of their own; autograd.grad returns the gradients, accumulates nothing
            args = tuple(x.detach().requires_grad_() for x in (q, k, v))
            do = torch.randn_like(q)
        steps: dict[str, Step] = {}
        for name, impl in impls.items():
            if isinstance(impl, str):  # its setup failed
                failed(name, mode, impl)
                continue

            # The first call compiles (Triton JIT, torch.compile): never inside a timing.
            result, error = attempt(_first_call, impl, mode, args, do)
            if error is not None:
                failed(name, mode, error)
                continue
            steps[name], first_s = result
            if name == FLEX:
                compile_s[mode] = first_s
                log(f"{w.name:32s} {mode:8s} {name:22s} compile {first_s:6.1f} s")
        heat(list(steps.values()), heat_s)
        for pass_ in range(passes):
            for position, name in enumerate(pass_order(list(steps), pass_, passes)):
                result, error = attempt(timer, steps[name])
                if error is not None:
                    failed(name, mode, error, pass_)
                    continue
                ms, peak, resident = result
                tflops = w.flops(mode) / ms / 1e9
                fields = dict(ms=ms, tflops=tflops, peak_gib=peak, resident_gib=resident)
                fields.update(position=position)
                rows.append(_row(w, mode, name, pass_, **fields))
                log(f"{w.name:32s} {mode:8s} {name:22s} {ms:8.3f} ms {tflops:7.1f} TF/s")
    return rows, compile_s


def pass_order(names: list[str], pass_: int, passes: int) -> list[str]:
    """The implementations' order in pass ``pass_`` of ``passes``: odd passes reverse the pass
    before them, and each pair of passes starts ``len(names) / (passes / 2)`` places further
    round, so over the passes every implementation is timed early and late alike (two passes:
    the names, then reversed)."""
    pairs = (passes + 1) // 2
    turn = (pass_ // 2) * len(names) // pairs
    order = names[turn:] + names[:turn]
    return order[::-1] if pass_ % 2 else order


def heat(steps: list[Step], seconds: float) -> None:
    """Call ``steps`` round robin, untimed, for about ``seconds`` (none: nothing), then wait
    for the GPU: the first timed call finds it as busy as every later one (:data:`HEAT_S`)."""
    if seconds <= 0 or not steps:
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for step in steps:
            attempt(step)
        if torch.cuda.is_available():  # a round at a time: the queue never runs far ahead
            torch.cuda.synchronize()


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def metadata() -> dict[str, Any]:
    """Device, versions, git commit (None outside a checkout), date and command line."""
    import triton

    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):  # python benchmarks/bench.py ...
        argv = ["python", *argv]
    status = _git("status", "--porcelain", "--untracked-files=no")
    return dict(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        git_commit=_git("rev-parse", "HEAD"),
        git_dirty=None if status is None else bool(status),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join(argv),
        do_bench=dict(warmup_ms=WARMUP_MS, rep_ms=REP_MS, return_mode="median"),
        fa4=_fa4_version(),
    )


def _fa4_version() -> str | None:
    """FlashAttention-4's installed version (``flash-attn-4``), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None


def run(
    workloads: list[Workload],
    log: Callable[[str], None] = print,
    impls: list[str] | None = None,
    passes: int = PASSES,
    after_workload: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark on the current CUDA device; returns the data the reports take.
    ``after_workload(data)``: called with the rows so far after each workload (a run cut
    short by a time limit keeps what it measured)."""
    data = metadata()
    data.update(workloads=[w.describe() for w in workloads], rows=[], flex_compile_s={})
    data.update(passes=passes, heat_s=HEAT_S)
    for w in workloads:
        inputs = make_inputs(w)
        built = build_impls(w, inputs[3], impls)
        rows, compile_s = run_workload(w, built, inputs, log=log, passes=passes)
        data["rows"] += rows
        if compile_s:
            data["flex_compile_s"][w.name] = compile_s
        del inputs
        torch.cuda.empty_cache()  # the next workload's peaks start from a clean allocator
        if after_workload is not None:
            after_workload(data)
    return data


# --- command line -----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python benchmarks/bench.py``."""
    p.add_argument(
        "action",
        nargs="?",
        choices=("run", "plot"),
        default="run",
        help="run (default): time on this GPU; plot: render --png (and --markdown) from --json",
    )
    p.add_argument("--quick", action="store_true", help="only d128 H=16: equal 2x8192, skewed 32k")
    p.add_argument(
        "--workloads",
        action="append",
        metavar="SUBSTRING",
        help="only workloads whose name contains SUBSTRING (case-insensitive; repeatable)",
    )
    p.add_argument(
        "--impls",
        action="append",
        metavar="SUBSTRING",
        help="only implementations whose name contains SUBSTRING (case-insensitive; "
        "repeatable), e.g. --impls portattn --impls FA4",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="also the skewed packs drawn with seeds 1 .. N-1 (default 1: seed 0 only; each "
        "seed adds 6 workloads, about 3.5 minutes on an H100)",
    )
    p.add_argument("--list", action="store_true", help="print the selected workloads and exit")
    p.add_argument(
        "--passes",
        type=int,
        default=PASSES,
        metavar="N",
        help=f"timed passes per workload and mode, each implementation early in some and late "
        f"in others (default {PASSES}: in order, then reversed); the reports keep the best",
    )
    p.add_argument("--json", metavar="PATH", help="raw rows and metadata (plot: read from here)")
    p.add_argument("--markdown", metavar="PATH", help="write the markdown summary here")
    p.add_argument(
        "--png",
        "--plot",
        dest="png",
        metavar="PATH",
        help="bar chart (needs matplotlib: the `bench` extra; without it, render later with "
        "`plot`)",
    )
    p.add_argument(
        "--docs",
        action="store_true",
        help=f"default --json/--markdown/--png to {DOCS_STEM}-<card>.{{json,md,png}}",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="the decode/append benchmark against a KV cache instead (benchmarks/bench_decode.py; "
        "--quick, --workloads, --list, --json, --markdown and --docs apply to it)",
    )


def _write_png(data: dict[str, Any], png: str, json_path: str | None) -> bool:
    try:
        report.plot(data, png)
    except ImportError as exc:
        later = json_path or "RUN.json"
        print(
            f"no chart: {exc}; or render it where matplotlib is installed "
            f"with: python benchmarks/bench.py plot --json {later} --png {png}",
            file=sys.stderr,
        )
        return False
    print(f"wrote {png}")
    return True


def command(args: argparse.Namespace) -> int:
    """The benchmark (not ``--decode``) for parsed ``args``. Exit status: 0 done, 2 usage error
    or no GPU, 3 (plot) matplotlib missing."""
    if args.docs:
        for attr, ext in (("json", "json"), ("markdown", "md"), ("png", "png")):
            if getattr(args, attr) is None:
                setattr(args, attr, f"{docs_stem(DOCS_STEM)}.{ext}")
    if args.action == "plot":
        if not args.json or not (args.png or args.markdown):
            print("plot needs --json PATH and --png PATH (or --markdown PATH)", file=sys.stderr)
            return 2
        if not Path(args.json).is_file():
            print(f"plot: no such file: {args.json}", file=sys.stderr)
            return 2
        data = report.load_json(args.json)
        if args.markdown:
            Path(args.markdown).write_text(report.markdown(data), encoding="utf-8")
            print(f"wrote {args.markdown}")
        return 0 if not args.png or _write_png(data, args.png, args.json) else 3

    workloads = select_workloads(args.quick, args.workloads, getattr(args, "seeds", 1))
    if not workloads:
        names = "\n  ".join(w.name for w in select_workloads(args.quick))
        print(
            f"no workload matches {args.workloads}; the workloads are:\n  {names}", file=sys.stderr
        )
        return 2
    if args.passes < 1:
        print(f"--passes must be at least 1, got {args.passes}", file=sys.stderr)
        return 2
    if args.list:
        for w in workloads:
            print(f"{w.name:32s} {len(w.lengths):3d} sequences, {sum(w.lengths)} tokens")
        return 0
    if not torch.cuda.is_available():
        print(
            f"error: python benchmarks/bench.py times kernels on {NEEDS_GPU} and none is "
            "available here (torch.cuda.is_available() is False). `--list` and `plot` work "
            "without one.",
            file=sys.stderr,
        )
        return 2

    def partial(data: dict[str, Any]) -> None:  # the JSON so far, rewritten after each workload
        if args.json:
            report.write_json(args.json, data)

    data = run(workloads, impls=args.impls, passes=args.passes, after_workload=partial)
    text = report.markdown(data)
    print(text)
    report.write_reports(data, text, args.json, args.markdown)
    if args.png:
        _write_png(data, args.png, args.json)  # a missing matplotlib does not fail the run
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Benchmark portattn's kernels against SDPA (cuDNN, flash) and "
        "FlexAttention on packed bfloat16 workloads (docs/performance.md): prints a markdown "
        "table, optionally writes JSON, markdown and a PNG chart. `plot` renders the chart "
        "(and markdown) from a JSON file, on any machine with matplotlib. --decode: the "
        "decode/append benchmark against a KV cache.",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.decode:
        if args.passes != PASSES:
            parser.error("--passes applies to the training benchmark, not to --decode")
        from benchmarks import bench_decode  # it imports this module: imported here, not above

        return bench_decode.main(args)
    return command(args)


if __name__ == "__main__":
    # Through the package's module, so that bench_decode and this run share one copy of it.
    from benchmarks.bench import main as package_main

    raise SystemExit(package_main())
