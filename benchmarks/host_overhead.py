"""Host time per eager call of portattn's decode and varlen entry points (issue 37, item 3).

Cases (B=1 decode, Hq 32 / Hkv 8, d128, page 64, bfloat16; varlen: 4 x 256 tokens):

* ``paged_append_t`` / ``paged_append_i``: paged ``flash_attn_with_kvcache`` appending one
  token, ``cache_seqlens`` an int32 tensor / an int;
* ``paged``: the same without the append; ``dense``: a dense [1, 4096, 8, 128] cache;
* ``attention_growing``: ``attention`` of one query row against the first n rows of a dense
  cache, n one more each call (as a transformers cache grows by a token a step: a new call
  signature every call, its first layer's);
* ``attention_decode``: ``attention`` as transformers' decode step calls it after a step's
  first layer (a kept signature): q, k, v ``[B, S, H, D]`` views of ``[B, H, S, D]`` memory,
  B 8, GQA 16/4, 2,049 keys, d128;
* ``varlen_nograd``: ``varlen_attention`` forward (both max_seqlen) under ``torch.no_grad()``;
* ``varlen_grad``: the same forward with q/k/v requiring grad (forward only);
* ``varlen_train``: that forward and its backward (``out.backward(dout)``), as a training step
  calls them;
* ``attention_step``: a transformers decode step of ``LAYERS`` (32) ``attention_decode``
  calls whose cache grows by a token a step as transformers' ``DynamicCache`` grows it (a new
  contiguous ``[B, H, S + 1, D]`` tensor: new shapes and strides, a new call signature each
  step, called by every layer of the step). Its times and aten ops are per call;
* ``paged_append_step`` / ``paged_append_step_i``: a decode step of ``LAYERS`` (32)
  ``paged_append_t`` / ``paged_append_i`` calls sharing one ``cache_seqlens``, which grows by
  one after the step (in place for the tensor, as engines do): the calls after a step's first
  reuse what it derived from it. Its times and aten ops are per call, over the whole step.

CPU (default): the kernels' launch is stubbed out (Triton's interpreter runs nothing), everything
else runs: ``run_launches`` with its ``before_launch`` checks, the context managers, the buffers.
Prints the median host µs per call over ``--n`` calls after warm-up, the aten ops per call
(``torch.profiler``, top-level ``aten::`` events) and, with ``--profile``, cProfile's top 25 by
cumulative time per case.

GPU (``--gpu``): the real eager call, timed host-side (the median of ``time.perf_counter``
around each of ``--n`` calls, with no sync between them), the same calls' GPU time (CUDA
events around them), whether a warm call waits for the GPU
(``torch.cuda.set_sync_debug_mode("error")``), and the CUDA-graph replay of the same call (CUDA
events around ``--n`` replays).

Usage: python benchmarks/host_overhead.py [--gpu] [--n 2000] [--profile] [--cases a,b]
[--aten-append] [--plan-backward] [--no-kept-maps]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if "--gpu" not in sys.argv:  # CPU tensors need Triton's interpreter, set before triton loads
    os.environ["TRITON_INTERPRET"] = "1"
if not __package__:  # run as `python benchmarks/host_overhead.py`: the checkout's root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import portattn  # noqa: E402
from benchmarks.aten_ops import top_level_aten_ops  # noqa: E402
from benchmarks.call_times import gpu_times, profile  # noqa: E402

B, HQ, HKV, D, PAGE, PAGES, CACHED = 1, 32, 8, 128, 64, 64, 1000
LAYERS = 32  # calls per step of the *_step cases
# transformers' decode layout of the attention_* decode cases: batch, query / kv heads, keys
HF_B, HF_HQ, HF_HKV, HF_KEYS = 8, 16, 4, 2049
MAX_STEPS = (PAGES * PAGE - CACHED - 30) // 2  # timed steps of a step case (see main)
CASES = (
    "paged_append_t",
    "paged_append_i",
    "paged",
    "dense",
    "attention_growing",
    "attention_decode",
    "varlen_nograd",
    "varlen_grad",
    "varlen_train",
    "attention_step",
    "paged_append_step",
    "paged_append_step_i",
)


def calls_per_run(name: str) -> int:
    """The calls one run of a case makes (its times and ops are reported per call)."""
    return LAYERS if name.endswith(("_step", "_step_i")) else 1


def stub_triton_launch() -> None:
    """Make ``launch.kernel[launch.grid](...)`` (``kernels/plan.py::run_launches``) a no-op:
    under the interpreter ``kernel[grid]`` calls ``InterpretedFunction.run``. Everything around
    it in ``run_launches`` still runs (the before-launch checks, the descriptor scratch)."""
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None


def make_case(name: str, device: str, dtype=torch.bfloat16):
    """A zero-argument call of the case (its tensors made once, as a decode loop reuses them)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, grad=False):
        t = torch.randn(*shape, generator=gen).to(dtype).to(device)
        return t.requires_grad_() if grad else t

    if name.startswith("varlen"):
        grad = name in ("varlen_grad", "varlen_train")
        total, seqs = 1024, 4
        q, k, v = (
            rand(total, HQ, D, grad=grad),
            rand(total, HKV, D, grad=grad),
            rand(total, HKV, D, grad=grad),
        )
        cu = torch.arange(0, total + 1, total // seqs, dtype=torch.int32, device=device)
        dout = rand(total, HQ, D)

        def call():
            with torch.set_grad_enabled(grad):
                return portattn.varlen_attention(q, k, v, cu, cu, 256, 256, causal=True)

        def train():
            call().backward(dout)
            q.grad = k.grad = v.grad = None  # each step's gradients are new tensors

        return train if name == "varlen_train" else call
    if name == "attention_decode":  # transformers' layout: [B, H, S, D] memory, BSHD views
        qh = rand(HF_B, HF_HQ, 1, D)
        kh, vh = rand(HF_B, HF_HKV, HF_KEYS, D), rand(HF_B, HF_HKV, HF_KEYS, D)
        views = tuple(x.transpose(1, 2) for x in (qh, kh, vh))

        def layer():
            with torch.no_grad():
                return portattn.attention(*views, causal=True)

        return layer
    if name == "attention_step":  # attention_decode's shapes, the cache a token longer a step
        qh, grown = rand(HF_B, HF_HQ, 1, D), HF_KEYS + 2 * MAX_STEPS + 32
        k_store, v_store = (rand(HF_B * HF_HKV * grown * D) for _ in range(2))
        tokens = {"n": HF_KEYS}

        def decode_step():
            n = tokens["n"] = HF_KEYS + (tokens["n"] - HF_KEYS + 1) % (grown - HF_KEYS)
            # contiguous [B, Hkv, n, D], as DynamicCache's torch.cat leaves it (no copy here)
            shape, strides = (HF_B, HF_HKV, n, D), (HF_HKV * n * D, n * D, D, 1)
            kh, vh = (x.as_strided(shape, strides) for x in (k_store, v_store))
            for _ in range(LAYERS):
                with torch.no_grad():
                    out = portattn.attention(qh.transpose(1, 2), kh.transpose(1, 2),
                                             vh.transpose(1, 2), causal=True)  # fmt: skip
            return out

        return decode_step
    q = rand(B, 1, HQ, D)
    if name == "attention_growing":
        cache = rand(B, PAGES * PAGE, HKV, D)
        length = {"n": CACHED}

        def grow():
            length["n"] = CACHED + (length["n"] - CACHED + 1) % (PAGES * PAGE - CACHED)
            keys = cache[:, : length["n"]]
            with torch.no_grad():
                return portattn.attention(q, keys, keys, causal=True)

        return grow
    new_k, new_v = rand(B, 1, HKV, D), rand(B, 1, HKV, D)
    lens_t = torch.full((B,), CACHED, dtype=torch.int32, device=device)
    if name == "dense":
        k_cache, v_cache = rand(B, PAGES * PAGE, HKV, D), rand(B, PAGES * PAGE, HKV, D)
        table = None
    else:
        k_cache, v_cache = rand(PAGES, PAGE, HKV, D), rand(PAGES, PAGE, HKV, D)
        table = torch.arange(PAGES, dtype=torch.int32, device=device).view(B, PAGES)
    append = name.startswith("paged_append")
    lens = CACHED if name == "paged_append_i" else lens_t

    def call(seqlens=lens):
        with torch.no_grad():
            return portattn.flash_attn_with_kvcache(
                q,
                k_cache,
                v_cache,
                new_k if append else None,
                new_v if append else None,
                cache_seqlens=seqlens,
                block_table=table,
                causal=True,
            )

    if not name.endswith(("_step", "_step_i")):
        return call
    state = {"len": CACHED}  # the host's count of the cached keys: no read of lens_t

    def step():
        as_int = name.endswith("_i")
        for _ in range(LAYERS):
            out = call(state["len"] if as_int else lens_t)
        if state["len"] < PAGES * PAGE - 1:
            state["len"] += 1
            lens_t.add_(1)  # in place: a new version, as engines step their lengths
        else:  # the cache is full: start over
            state["len"] = CACHED
            lens_t.fill_(CACHED)
        return out

    return step


def host_us_cpu(call, n: int) -> float:
    """Median µs of one call over ``n`` (after 20 warm-up calls)."""
    for _ in range(20):
        call()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def aten_ops(call) -> int:
    """Top-level ``aten::`` ops of one call after a first (those not inside another aten op)."""
    call()
    return len(top_level_aten_ops(call))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="time the real calls on cuda:0")
    parser.add_argument("--n", type=int, default=None, help="calls per case (CPU 2000, GPU 1000)")
    parser.add_argument("--profile", action="store_true", help="cProfile top 25 per case")
    parser.add_argument("--sort", default="cumulative", help="cProfile order (e.g. tottime)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    help_aten = "append with aten index_put_ (kvcache_append.APPEND_KERNEL off), for an A/B"
    parser.add_argument("--aten-append", action="store_true", help=help_aten)
    help_plan = "plan every backward (backward_replay.REPLAYED_BACKWARDS off), for an A/B"
    parser.add_argument("--plan-backward", action="store_true", help=help_plan)
    help_maps = "make TMA maps every launch (launcher.KEPT_MAPS off), for an A/B"
    parser.add_argument("--no-kept-maps", action="store_true", help=help_maps)
    args = parser.parse_args()
    if args.no_kept_maps:
        from portattn.kernels import launcher

        launcher.KEPT_MAPS = False
    if args.aten_append:
        from portattn import kvcache_append

        kvcache_append.APPEND_KERNEL = False
    if args.plan_backward:
        from portattn import backward_replay

        backward_replay.REPLAYED_BACKWARDS = False
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {CASES}")
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu needs a CUDA/ROCm device")
    device = "cuda" if args.gpu else "cpu"
    n = args.n or (1000 if args.gpu else 2000)
    if not args.gpu:
        stub_triton_launch()
    header = "host µs | GPU µs | graph µs | syncs | aten ops" if args.gpu else "host µs | aten ops"
    print(f"| case | {header} |")
    print("| --- |" + " ---: |" * (header.count("|") + 1))
    for name in cases:
        call = make_case(name, device)
        per = calls_per_run(name)
        ops = aten_ops(call) / per
        # A step case's replays grow cache_seqlens on the GPU with no wrap: keep them within
        # the cache (eager steps wrap on the host; warm-up, timed steps, replays: 2n + 30).
        runs = n if per == 1 else min(n, MAX_STEPS)
        if args.gpu:
            row = gpu_times(call, runs)
            cells = [row["host_us"], row["gpu_us"], row.get("graph_us", float("nan"))]
            cells = [f"{c / per:.1f}" for c in cells] + [row["syncs"]]
        else:
            cells = [f"{host_us_cpu(call, runs) / per:.1f}"]
        print(f"| {name} | " + " | ".join(cells) + f" | {ops:g} |", flush=True)
        if args.profile:
            profile(call, min(n, 500), args.sort)
    return 0


if __name__ == "__main__":
    sys.exit(main())
