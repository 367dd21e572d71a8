"""Host time per eager call, portattn beside FlashAttention-4 (issue 37 item 3's 30 µs): the
same decode and varlen calls, each timed by ``benchmarks.call_times.gpu_times``: host-side
(median of ``time.perf_counter`` around each of ``--n`` calls, no sync between them; the GPU
work of these shapes is shorter than the host's), the same calls' GPU time, and the call's
CUDA-graph replay (GPU µs per replay) where it captures.

Cases: paged decode B1 (``bench_decode``'s inputs: GQA 32/8 d128, page 64, 512..8192 keys):
portattn ``flash_attn_with_kvcache`` and FA4 ``flash_attn_varlen_func`` (``page_table``,
``deterministic=True``); varlen forward, 4 x 256 tokens, GQA 32/8 d128, causal, no grad:
portattn ``varlen_attention`` and FA4. With ``--profile``: cProfile's top 20 (own time) of
portattn's two calls on this host. With ``--kernels``: each call's CUDA µs per kernel
(``torch.profiler``, mean of ``--n`` calls), where the small calls' GPU time goes.

Usage (GPU, FA4 from ``source .fa4/install.sh``): python ci/host_peers.py [--n 1000] [--profile]
[--kernels]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/host_peers.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw
from benchmarks.call_times import gpu_times, profile
from benchmarks.timing import profile_cuda_us


def varlen_calls() -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    total, seqs = 1024, 4
    q, k, v = (torch.randn(total, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (32, 8, 8))  # fmt: skip
    cu = torch.arange(0, total + 1, total // seqs, dtype=torch.int32, device="cuda")
    calls = {}

    def pa():
        with torch.no_grad():
            return portattn.varlen_attention(q, k, v, cu, cu, 256, 256, causal=True)

    calls["varlen: portattn"] = pa
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4

        def fa():
            with torch.no_grad():
                return fa4(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=256,
                           max_seqlen_k=256, causal=True, deterministic=True)  # fmt: skip

        calls["varlen: FA4 det"] = fa
    except ImportError as exc:
        print(f"FA4 not importable: {exc}")
    return calls


def decode_calls() -> dict:
    w = dw.select_workloads(patterns=["decode B1 gqa32/8 d128"])[0]
    inp = dw.make_inputs(w)
    calls = {}
    pa = bd.portattn_impl(w, inp, "varlen", True).fn
    calls["paged decode B1: portattn"] = lambda: pa()
    try:
        fa = bd.fa4_impl(w, inp, True, True).fn
        calls["paged decode B1: FA4 det"] = lambda: fa()
    except ImportError as exc:
        print(f"FA4 not importable: {exc}")
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="CUDA µs per kernel and call")
    args = parser.parse_args()
    calls = {**decode_calls(), **varlen_calls()}
    lines = ["| call | host µs (eager) | GPU µs (eager) | graph replay µs |",
             "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for name, call in calls.items():
        with torch.no_grad():
            row = gpu_times(call, args.n)
        graph = f"{row['graph_us']:.1f}" if "graph_us" in row else "-"
        lines.append(f"| {name} | {row['host_us']:.1f} | {row['gpu_us']:.1f} | {graph} |")
        print(lines[-1], flush=True)
    if args.profile:
        for name, call in calls.items():
            if "portattn" not in name:
                continue
            print(f"\n### {name}: cProfile, {args.n} calls, own time")
            with torch.no_grad():
                profile(call, args.n, "tottime", top=20)
            torch.cuda.synchronize()
    if args.kernels:
        for name, call in calls.items():
            with torch.no_grad():
                times = profile_cuda_us(call, args.n)
            print(f"\n### {name}: CUDA µs per call and kernel")
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1])[:8]:
                print(f"- {us / args.n:8.1f}  {kernel[:110]}")
    print("\n## summary\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
