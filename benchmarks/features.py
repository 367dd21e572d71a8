"""Issue 25's speed rows on one GPU: sliding windows and borrowed head dims against the full
kernel and d128, with FlashAttention-4 (``deterministic=True``) beside them where installed.

Rows (bf16, causal, H = 16 query heads, GQA 16/4 no; one packed batch each):
  * a 32k pack (one sequence of 32768 tokens) at d128: full causal, window (4095, 0) and
    (127, 0) (a 4096- / 128-key sliding window: Mistral's / gpt-oss's convention);
  * an equal 4 x 8192 pack at d64, d80 (borrowed: runs d96's row), d128, and (D, Dv) =
    (192, 128) (MLA's value head dim of its own: runs d256's row, Triton kernels; FA4 beside
    it where it takes that pair).
Useful FLOPs count the visible (query, key) pairs exactly: ``2 * (D + Dv) * H * pairs``
forward (QK^T and PV), ``2 * (4 * D + 3 * Dv) * H * pairs`` forward + backward (with the
recomputed QK^T, dP, dV, dQ, dK): ``4 * D`` and 3.5x that where Dv == D. Timing:
``benchmarks.timing.gpu_timer`` (do_bench medians, L2 flushed), each implementation
warmed first, two passes in alternating order, the better median kept. q, k, v require grad
in the forward + backward rows.

    python benchmarks/features.py [--json PATH] [--only "d192 v128"]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/features.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks.timing import gpu_timer

HEADS = 16


def visible_pairs(n: int, left: int) -> int:
    """(query, key) pairs of one causal sequence of ``n`` tokens with a left window."""
    if left < 0 or left >= n - 1:
        return n * (n + 1) // 2
    w = left + 1  # keys per row once the window is full
    return w * (w + 1) // 2 + (n - w) * w  # rows 0..w-1 see i+1 keys, later rows w


def _exact_pairs(n: int, left: int) -> int:
    return sum(min(i + 1, left + 1) if left >= 0 else i + 1 for i in range(n))


def _fa4():
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as exc:  # noqa: BLE001 - a peer that is missing is reported, not fatal
        return None, f"{type(exc).__name__}: {exc}"
    return flash_attn_varlen_func, None


def impls(cu: torch.Tensor, longest: int, left: int):
    window = (left, 0) if left >= 0 else (-1, -1)
    out = {}
    for kernel in ("varlen", "fixed_order"):

        def ours(q, k, v, kernel=kernel):
            return portattn.varlen_attention(
                q, k, v, cu, cu, longest, longest, causal=True, window_size=window, kernel=kernel
            )

        out[f"portattn {kernel}"] = ours
    fa4, err = _fa4()
    if fa4 is not None:
        fa_window = (left, 0) if left >= 0 else (None, None)

        pack = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": longest}
        options = dict(pack, max_seqlen_k=longest, window_size=fa_window)

        def peer(q, k, v):
            o = fa4(q, k, v, causal=True, deterministic=True, **options)
            return o[0] if isinstance(o, tuple) else o

        out["FA4 deterministic"] = peer
    return out, err


def run_row(
    name: str, lengths: list[int], head_dim: int, left: int, log, head_dim_v: int | None = None
) -> list[dict]:
    total, longest = sum(lengths), max(lengths)
    dim_v = head_dim if head_dim_v is None else head_dim_v
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(total, HEADS, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        for d in (head_dim, head_dim, dim_v)
    )
    do = torch.randn(total, HEADS, dim_v, device="cuda", dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).cuda()
    pairs = sum(visible_pairs(n, left) for n in lengths)
    fns, err = impls(cu, longest, left)
    rows = []
    if err:
        rows.append(dict(row=name, impl="FA4 deterministic", error=err))
    steps = {}
    for impl, fn in fns.items():
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def fwd(fn=fn):
            with torch.no_grad():
                fn(q, k, v)

        def fwd_bwd(fn=fn, qg=qg, kg=kg, vg=vg):
            o = fn(qg, kg, vg)
            o.backward(do)
            qg.grad = kg.grad = vg.grad = None

        try:
            fwd()
            fwd_bwd()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(row=name, impl=impl, error=f"{type(exc).__name__}: {exc}"[:300]))
            continue
        steps[impl] = {"fwd": fwd, "fwd+bwd": fwd_bwd}
    best: dict[tuple[str, str], float] = {}
    for pass_ in range(2):
        order = list(steps) if pass_ == 0 else list(steps)[::-1]
        for impl in order:
            for mode, step in steps[impl].items():
                ms = gpu_timer(step)[0]
                key = (impl, mode)
                best[key] = min(best.get(key, ms), ms)
    for (impl, mode), ms in best.items():
        per_pair = 2.0 * ((4 * head_dim + 3 * dim_v) if mode == "fwd+bwd" else head_dim + dim_v)
        flops = per_pair * HEADS * pairs
        rows.append(
            dict(row=name, impl=impl, mode=mode, ms=ms, tflops=flops / ms / 1e9, pairs=pairs)
        )
        log(f"{name:28s} {impl:22s} {mode:8s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="run only the rows whose name contains this")
    args = ap.parse_args()
    for n, left in ((100, 9), (1000, 127), (33, 0), (5, 10)):
        assert visible_pairs(n, left) == _exact_pairs(n, left), (n, left)
    plan = [
        (name, [32768], 128, left, None)
        for name, left in (
            ("32k d128 full causal", -1),
            ("32k d128 window 4096", 4095),
            ("32k d128 window 128", 127),
        )
    ]
    plan += [(f"4x8192 d{d} causal", [8192] * 4, d, -1, None) for d in (64, 80, 128)]
    plan.append(("4x8192 d192 v128 causal", [8192] * 4, 192, -1, 128))
    rows = []
    for name, lengths, head_dim, left, head_dim_v in plan:
        if args.only in name:
            rows += run_row(name, lengths, head_dim, left, print, head_dim_v=head_dim_v)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("\n| row | impl | mode | ms | TFLOP/s |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['row']} | {r['impl']} | error | {r['error'][:80]} | |")
        else:
            print(f"| {r['row']} | {r['impl']} | {r['mode']} | {r['ms']:.3f} | {r['tflops']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
