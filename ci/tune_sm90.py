"""Variant timing for the sm90 configuration table (docs/perf-notes.md records the results).

Each variant replaces one sm90 bfloat16 entry of the table in this process only, is checked
against float64 (``portattn.check``'s small packed case, at the entry's head dim, causal and
not), and is timed on the skewed 32k-token pack (16 heads, bf16): forward alone and backward
alone (``autograd.grad`` on a kept graph), medians of ``triton.testing.do_bench``. The table in
``portattn/configs.py`` is edited by hand afterwards; nothing here picks a configuration at run
time.

Usage (GPU): python ci/tune_sm90.py [--json PATH] [--table-only] [--forward-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch
import triton

import portattn
from portattn import check, configs
from portattn.bench import skewed_lengths
from portattn.configs import Tiles

# (kernel, head_dim, overrides): overrides are KernelConfig fields; tiles as tuples, ``tma`` as
# a tuple of kernel names. The lists hold the last round run, the table's entry first:
# VARIANTS (forward and backward timed) dK and dV summed by one program of one warp group
# (docs/perf-notes.md row 42); FORWARD_VARIANTS (``--forward-only``) wider-than-tall forward
# tiles, one CTA per SM (row 40).
ALL_TMA = configs.TMA_KERNELS  # for overrides that read every row tile through descriptors


def _one_pass(tiles: tuple) -> dict:
    """dK and dV summed by one program (one warp group; both accumulators in registers)."""
    return dict(dkdv_passes=1, bwd_dkdv=tiles, bwd_dv=None)


VARIANTS = [
    ("varlen", 128, {}),
    ("varlen", 128, _one_pass((32, 64, 4, 2))),
    ("varlen", 128, _one_pass((32, 64, 4, 1))),
    ("fixed_order", 128, {}),
    ("fixed_order", 128, _one_pass((32, 64, 4, 1))),
    ("fixed_order", 128, _one_pass((16, 64, 4, 2))),
    ("varlen", 96, {}),
    ("varlen", 96, _one_pass((32, 64, 4, 2))),
    ("fixed_order", 96, {}),
    ("fixed_order", 96, _one_pass((32, 64, 4, 1))),
]
FORWARD_VARIANTS = [
    ("varlen", 128, {}),
    ("varlen", 128, dict(fwd=(128, 64, 8, 3))),
    ("varlen", 128, dict(fwd=(128, 64, 8, 4))),
]


TABLE = dict(configs.config_table())  # the committed table, before any override


def variant_config(kernel: str, head_dim: int, overrides: dict) -> configs.KernelConfig:
    """The committed sm90 bf16 entry with ``overrides`` (each variant starts from the table)."""
    base = TABLE[("sm90", kernel, head_dim, torch.bfloat16)]
    fields = {
        k: Tiles(*v) if isinstance(v, tuple) and k != "tma" else v for k, v in overrides.items()
    }
    return dataclasses.replace(base, **fields)


def install(kernel: str, head_dim: int, cfg: configs.KernelConfig) -> None:
    """Put ``cfg`` in the (cached) table for sm90 bf16 in this process."""
    configs.config_table()[("sm90", kernel, head_dim, torch.bfloat16)] = cfg


def correct(kernel: str, head_dim: int) -> list[str]:
    lens_q, lens_k = (0, 17, 63, 300, 129), (9, 40, 50, 300, 200)
    problems = []
    for causal in (False, True):
        res = check.check_case(
            kernel, torch.bfloat16, causal, torch.device("cuda"), lens_q, lens_k, head_dim
        )
        problems += [f"causal={causal}: {p}" for p in res.problems]
    return problems


def timings(kernel: str, head_dim: int, causal: bool, forward_only: bool = False):
    lengths = skewed_lengths(32768)
    total, heads = sum(lengths), 16
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda").int()
    top = max(lengths)

    def fwd(q=q, k=k, v=v):
        return portattn.varlen_attention(q, k, v, cu, cu, top, top, causal=causal, kernel=kernel)

    fwd_ms = triton.testing.do_bench(fwd, warmup=25, rep=150, return_mode="median")
    if forward_only:
        return fwd_ms, float("nan"), profile_kernels(fwd)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fwd(*leaves)
    dout = torch.randn_like(out)

    def bwd():
        torch.autograd.grad(out, leaves, dout, retain_graph=True)

    bwd_ms = triton.testing.do_bench(bwd, warmup=25, rep=150, return_mode="median")

    def step():
        torch.autograd.grad(fwd(*leaves), leaves, dout)

    return fwd_ms, bwd_ms, profile_kernels(step)


def profile_kernels(step) -> dict[str, float]:
    """Milliseconds of CUDA time per kernel name in one call of ``step`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    return {
        evt.key[:40]: round(evt.device_time_total / 3 / 1e3, 3)
        for evt in prof.key_averages()
        if evt.device_time_total > 0
    }


def flops(head_dim: int, causal: bool) -> float:
    per = sum(4.0 * n * n * head_dim * 16 for n in skewed_lengths(32768))
    return per / 2 if causal else per


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--table-only", action="store_true", help="only the table's entries")
    parser.add_argument("--forward-only", action="store_true", help="time the forward alone")
    args = parser.parse_args()
    rows = []
    for kernel, head_dim, overrides in FORWARD_VARIANTS if args.forward_only else VARIANTS:
        if args.table_only and overrides:
            continue
        cfg = variant_config(kernel, head_dim, overrides)
        install(kernel, head_dim, cfg)
        start = time.perf_counter()
        row = dict(kernel=kernel, head_dim=head_dim, overrides=repr(overrides))
        try:
            row["problems"] = correct(kernel, head_dim)
            for causal in (False, True):
                f_ms, b_ms, kernel_ms = timings(kernel, head_dim, causal, args.forward_only)
                tag = "causal" if causal else "full"
                fl = flops(head_dim, causal)
                row |= {
                    f"fwd_ms_{tag}": f_ms,
                    f"bwd_ms_{tag}": b_ms,
                    f"fwd_tf_{tag}": fl / f_ms / 1e9,
                    f"bwd_tf_{tag}": 2.5 * fl / b_ms / 1e9,
                    f"kernel_ms_{tag}": kernel_ms,
                }
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        row["seconds"] = time.perf_counter() - start
        install(kernel, head_dim, variant_config(kernel, head_dim, {}))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| kernel | d | overrides | fwd TF full/causal | bwd TF full/causal | ok |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['kernel']} | {r['head_dim']} | {r['overrides']} | error | {r['error']} |")
            continue
        print(
            f"| {r['kernel']} | {r['head_dim']} | {r['overrides']} "
            f"| {r['fwd_tf_full']:.0f} / {r['fwd_tf_causal']:.0f} "
            f"| {r['bwd_tf_full']:.0f} / {r['bwd_tf_causal']:.0f} "
            f"| {'yes' if not r['problems'] else r['problems']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
