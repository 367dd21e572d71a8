"""Variant timing for the sm90 configuration table (docs/perf-notes.md records the results).

Each variant replaces one sm90 bfloat16 entry of the table in this process only, is checked
against float64 (``portattn.tools.check``'s small packed case, at the entry's head dim, causal and
not), and is timed on the skewed 32k-token pack (16 heads, bf16): forward alone and backward
alone (``autograd.grad`` on a kept graph), medians of ``triton.testing.do_bench``. The table in
``portattn/configs/rows.py`` is edited by hand afterwards; nothing here picks a configuration at run
time.

Usage (GPU): python ci/tune_sm90.py [--round NAME] [--json PATH] [--table-only]
[--forward-only] [--list]. ``--round`` picks a list of ``ROUNDS`` (default: the latest); the
forward-only rounds time the forward alone. On any machine, ``--compile`` compile-checks a
round's variants for sm90 (no GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

if not __package__:  # run as `python ci/tune_sm90.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton

import portattn
from benchmarks.timing import profile_cuda_us, write_rows
from benchmarks.workloads import skewed_lengths
from ci.wait_barrier_probe import digest  # the bits column (out, and the gradients)
from portattn import configs
from portattn.configs import Tiles
from portattn.tools import check

# Rounds of variants, named by the docs/perf-notes.md row that records them. A variant is
# (kernel, head_dim, overrides): overrides are KernelConfig fields (tiles as tuples, ``tma`` a
# tuple of kernel names) applied to the committed table's entry, and {} is that entry. Replayed
# after the table changed, a round compares its variants against the new table.
ALL_TMA = configs.TMA_KERNELS  # for overrides that read every row tile through descriptors
_DK_1WG = dict(bwd_dkdv=(64, 64, 4, 2), bwd_dv=(64, 64, 4, 3))  # row 39's choice


def _one_pass(tiles: tuple) -> dict:
    """dK and dV summed by one program (one warp group; both accumulators in registers)."""
    return dict(dkdv_passes=1, bwd_dkdv=tiles, bwd_dv=None)


ROUNDS: dict[str, list[tuple[str, int, dict]]] = {
    # One-warp-group forward tiles, two CTAs per SM (forward only).
    "row35-forward": [
        ("fixed_order", 64, {}),
        ("fixed_order", 64, dict(fwd=(64, 64, 4, 3), tma=ALL_TMA)),
        ("fixed_order", 64, dict(fwd=(64, 128, 4, 2), tma=ALL_TMA)),
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(64, 64, 4, 3), tma=ALL_TMA)),
        ("fixed_order", 96, {}),
        ("fixed_order", 96, dict(fwd=(64, 64, 4, 3), tma=("fwd",))),
    ],
    # One-warp-group backward tiles that fit two CTAs per SM (run against the table before it).
    "row39": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(bwd_dq=(64, 64, 4, 2))),
        ("varlen", 128, _DK_1WG),
        ("varlen", 128, dict(bwd_dkdv=(64, 64, 4, 2))),
        ("varlen", 128, dict(bwd_dv=(64, 64, 4, 3))),
        ("varlen", 128, dict(bwd_dkdv=(64, 64, 4, 2), bwd_dv=(64, 64, 4, 2))),
        ("varlen", 128, dict(bwd_dkdv=(64, 64, 4, 2), bwd_dv=(128, 64, 4, 2))),
        ("varlen", 128, dict(bwd_dkdv=(32, 64, 4, 3), bwd_dv=(64, 64, 4, 3))),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(bwd_dq=(64, 64, 4, 2))),
        ("fixed_order", 128, _DK_1WG),
        ("fixed_order", 128, dict(bwd_dkdv=(64, 64, 4, 2))),
        ("fixed_order", 128, dict(bwd_dv=(64, 64, 4, 3))),
        ("fixed_order", 128, dict(bwd_dkdv=(32, 64, 4, 3), bwd_dv=(64, 64, 4, 3))),
        ("varlen", 96, {}),
        ("varlen", 96, _DK_1WG),
        ("fixed_order", 96, {}),
        ("fixed_order", 96, _DK_1WG),
    ],
    # dQ with 4 stages.
    "row40": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(bwd_dq=(128, 64, 8, 4))),
        ("varlen", 128, dict(bwd_dq=(128, 32, 8, 4))),
    ],
    # Wider-than-tall forward tiles, one CTA per SM (forward only).
    "row40-forward": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(fwd=(128, 64, 8, 3))),
        ("varlen", 128, dict(fwd=(128, 64, 8, 4))),
    ],
    # dK and dV summed by one program of one warp group.
    "row42": [
        ("varlen", 128, {}),
        ("varlen", 128, _one_pass((32, 64, 4, 2))),
        ("varlen", 128, _one_pass((32, 64, 4, 1))),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, _one_pass((32, 64, 4, 2))),
        ("fixed_order", 128, _one_pass((32, 64, 4, 1))),
        ("fixed_order", 128, _one_pass((16, 64, 4, 2))),
        ("varlen", 96, {}),
        ("varlen", 96, _one_pass((32, 64, 4, 2))),
        ("fixed_order", 96, {}),
        ("fixed_order", 96, _one_pass((32, 64, 4, 1))),
    ],
    # One-pass dK/dV again, after dK and dV are stored through descriptors (row 44).
    "row44": [
        ("varlen", 128, {}),
        ("varlen", 128, _one_pass((32, 64, 4, 2))),
        ("varlen", 128, _one_pass((32, 64, 4, 3))),
        ("varlen", 128, _one_pass((64, 128, 8, 2))),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, _one_pass((32, 64, 4, 2))),
        ("fixed_order", 128, _one_pass((32, 64, 4, 3))),
        ("varlen", 96, {}),
        ("varlen", 96, _one_pass((32, 64, 4, 2))),
        ("varlen", 96, _one_pass((32, 64, 4, 3))),
        ("fixed_order", 96, {}),
        ("fixed_order", 96, _one_pass((32, 64, 4, 2))),
        ("fixed_order", 96, _one_pass((32, 64, 4, 3))),
    ],
    # Row 44's best one-pass tiles against deeper pipelines.
    "row45": [
        ("varlen", 128, _one_pass((32, 64, 4, 3))),
        ("varlen", 128, _one_pass((64, 128, 8, 2))),
        ("varlen", 128, _one_pass((32, 64, 4, 4))),
        ("fixed_order", 128, _one_pass((32, 64, 4, 3))),
        ("fixed_order", 128, _one_pass((32, 64, 4, 4))),
        ("varlen", 96, _one_pass((32, 64, 4, 3))),
        ("varlen", 96, _one_pass((64, 128, 8, 2))),
        ("varlen", 96, _one_pass((32, 64, 4, 4))),
        ("fixed_order", 96, _one_pass((32, 64, 4, 3))),
        ("fixed_order", 96, _one_pass((32, 64, 4, 4))),
    ],
    # Wider dQ tiles, timed in row 46 with a dQ that read Q / dO and stored dQ through
    # descriptors (that source change was not kept; replayed now, the tiles run without it).
    "row46": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(bwd_dq=(128, 128, 8, 2))),
        ("varlen", 128, dict(bwd_dq=(64, 128, 4, 2))),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(bwd_dq=(64, 64, 4, 2))),
        ("fixed_order", 128, dict(bwd_dq=(64, 64, 4, 3))),
        ("varlen", 96, {}),
        ("varlen", 96, dict(bwd_dq=(128, 128, 8, 2))),
    ],
    # fixed_order forwards with smaller tiles, three CTAs per SM (forward only).
    "row48-forward": [
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(fwd=(64, 32, 4, 3))),
        ("fixed_order", 128, dict(fwd=(64, 32, 4, 2))),
        ("fixed_order", 128, dict(fwd=(64, 64, 4, 2))),
        ("fixed_order", 96, {}),
        ("fixed_order", 96, dict(fwd=(64, 32, 4, 3))),
    ],
    # The warp-specialised Gluon forward (``fwd_ws``) against the Triton forward, same tiles
    # (forward only; rows 49-52). fixed_order and d64 at 128 query rows: the Gluon kernel's
    # shape (two groups of 64 rows), with BLOCK_N as in their table rows.
    "row51-forward": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(fwd_ws=False)),
        ("varlen", 128, dict(fwd=(128, 128, 8, 2))),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(fwd=(128, 64, 8, 3))),
        ("fixed_order", 128, dict(fwd=(128, 64, 8, 3), fwd_ws=True)),
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(128, 64, 8, 3), fwd_ws=True)),
    ],
    # The warp-specialised dK/dV kernel (``bwd_ws``) against the Triton dK/dV kernel (row 53);
    # fixed_order at its own 32-row query tiles (64 rows would change its split-P bits).
    "row53-backward": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(bwd_ws=False, bwd_dkdv=(32, 64, 4, 3))),
        ("varlen", 128, dict(bwd_ws=False)),
        ("varlen", 128, dict(bwd_dkdv=(64, 128, 8, 3))),
        ("varlen", 128, dict(bwd_dkdv=(32, 128, 8, 2))),
        ("varlen", 64, {}),
        ("varlen", 64, dict(bwd_ws=False)),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(bwd_dkdv=(32, 128, 8, 2), bwd_ws=True)),
        ("fixed_order", 128, dict(bwd_dkdv=(32, 128, 8, 3), bwd_ws=True)),
    ],
    # Warp-specialised dQ (dq_ws) against the Triton dQ at the same tiles, and its ring depth.
    "row54-dq": [
        ("varlen", 128, {}),
        ("varlen", 128, dict(dq_ws=False)),
        ("varlen", 128, dict(bwd_dq=(128, 64, 8, 2))),
        ("varlen", 128, dict(bwd_dq=(128, 64, 8, 4))),
        ("varlen", 64, {}),
        ("varlen", 64, dict(dq_ws=True)),
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(dq_ws=False)),
    ],
    # FA4's d64 forward runs 128-key tiles warp-specialised (perf-notes, "FlashAttention-4 on
    # SM90", ranked item 1): the Gluon forward at d64 with 128 keys (forward only).
    "fa4-d64-forward": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(128, 128, 8, 2), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 128, 8, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 64, 8, 2), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 128, 8, 3))),
    ],
    # FA4's d64 forward shape itself (perf-notes row 129): 192 query rows in three consumer
    # groups of 160 registers (row 65's two groups lost to the table's one-group Triton
    # tiles). 64-key tiles keep the table's bits; 128-key ones give row 65's (128, 128)
    # Gluon bits (the bits column tells).
    "d64-three-groups": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(192, 64, 12, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(192, 64, 12, 4), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(192, 128, 12, 2), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(192, 128, 12, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 128, 8, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(64, 128, 4, 3))),
    ],
    # d64, where the gap to FA4 deterministic is widest (perf-notes row 69: 0.73-0.74x of its
    # forward+backward): dK/dV (warp-specialised, 128 keys) at other query tiles and ring
    # depths, dQ tiles; then the table again for the spread. Session 24, not run yet; check
    # on the CPU first: python ci/tune_sm90.py --round d64-backward --compile
    "d64-backward": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(bwd_dkdv=(64, 128, 8, 3))),
        ("varlen", 64, dict(bwd_dkdv=(32, 128, 8, 2))),
        ("varlen", 64, dict(bwd_dkdv=(32, 128, 8, 3))),
        ("varlen", 64, dict(bwd_dq=(128, 128, 8, 2))),
        ("varlen", 64, dict(bwd_dq=(64, 64, 4, 3))),
        ("varlen", 64, dict(bwd_dq=(64, 128, 4, 2))),
        ("varlen", 64, dict(bwd_dq=(128, 64, 8, 4))),
        ("varlen", 64, {}),
    ],
    # The d64 forward's one-warp-group tiles (two CTAs per SM) at other key tiles and depths.
    "d64-forward": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(64, 64, 4, 4))),
        ("varlen", 64, dict(fwd=(64, 128, 4, 2))),
        ("varlen", 64, dict(fwd=(64, 128, 4, 3))),
        ("varlen", 64, dict(fwd=(64, 32, 4, 4))),
        ("varlen", 64, {}),
    ],
    # Session 35 (row 99): the d64 Gluon forward after FA4's step order (row 98) and the groups'
    # turns; 64-key tiles keep the table's bits (the table's d64 forward is 64x64 Triton).
    "row99-d64": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(128, 128, 8, 2), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 128, 8, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 64, 8, 3), fwd_ws=True)),
        ("varlen", 64, dict(fwd=(128, 64, 8, 4), fwd_ws=True)),
        ("varlen", 64, {}),
    ],
    # Session 37: the warp-specialised dQ (row 54, d128 only so far) at d64, both kernels;
    # its 64-key tiles and (128, 64, 8, 3) are the table's d64 dQ tiles, so the bits hold.
    "d64-dq-ws": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(dq_ws=True)),
        ("varlen", 64, dict(dq_ws=True, bwd_dq=(128, 64, 8, 2))),
        ("fixed_order", 64, {}),
        ("fixed_order", 64, dict(dq_ws=True)),
        ("varlen", 64, {}),
    ],
    # The same, three variants (for a call with two minutes of device time left).
    "d64-dq-ws-short": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(dq_ws=True)),
        ("varlen", 64, {}),
    ],
    # Session 38 (row 106): the d64 Triton forward's query tiles and stages again, now that it
    # reads through host descriptors; 64-key tiles keep the table's bits, both kernels.
    "d64-forward-host": [
        ("varlen", 64, {}),
        ("varlen", 64, dict(fwd=(128, 64, 8, 3))),
        ("varlen", 64, dict(fwd=(128, 64, 8, 2))),
        ("varlen", 64, dict(fwd=(64, 64, 4, 4))),
        ("varlen", 64, dict(fwd=(64, 64, 4, 2))),
        ("fixed_order", 64, {}),
        ("fixed_order", 64, dict(fwd=(128, 64, 8, 2))),
        ("fixed_order", 64, dict(fwd=(64, 64, 4, 4))),
        ("varlen", 64, {}),
    ],
    # Session 39: fixed_order's forward is 1.4-1.8x varlen's time (target 1.35x; H100, commit
    # 02789fd) and still the Triton kernel; row 51 found the warp-specialised one no faster at
    # its tiles, before rows 98 (FA4's step order) and 105 (host descriptors). 64-key tiles
    # keep the table's bits (as varlen d64's Gluon and Triton forwards share theirs).
    "fixed-order-ws": [
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(fwd=(128, 64, 8, 3), fwd_ws=True)),
        ("fixed_order", 128, dict(fwd=(128, 64, 8, 2), fwd_ws=True)),
        ("fixed_order", 64, {}),
        ("fixed_order", 64, dict(fwd=(128, 64, 8, 3), fwd_ws=True)),
        ("fixed_order", 128, {}),
    ],
    # Session 39: fixed_order d64's dK/dV as the warp-specialised Gluon kernel at its table
    # tiles, (64, 128, 8, 2), varlen d64's (row 53: there -22% / -29% dK/dV against the Triton
    # kernel at the same tiles, bits equal with split-P too); never timed for fixed_order d64.
    "fixed-order-d64-bwd-ws": [
        ("fixed_order", 64, {}),
        ("fixed_order", 64, dict(bwd_ws=True)),
        ("fixed_order", 64, dict(bwd_ws=True, bwd_dkdv=(64, 128, 8, 3))),
        ("fixed_order", 64, {}),
        # d128 at its own 32-row query tiles (row 53: -2 to -6% then, before row 108)
        ("fixed_order", 128, {}),
        ("fixed_order", 128, dict(bwd_ws=True, bwd_dkdv=(32, 128, 8, 2))),
    ],
}
FORWARD_ONLY = {"row35-forward", "row40-forward", "row48-forward", "row51-forward"}
FORWARD_ONLY |= {"fa4-d64-forward", "d64-forward", "row99-d64", "d64-forward-host"}
FORWARD_ONLY |= {"fixed-order-ws", "d64-three-groups"}
LATEST = "d64-backward"

TABLE = dict(configs.config_table())  # the committed table, before any override


def variant_config(kernel: str, head_dim: int, overrides: dict) -> configs.KernelConfig:
    """The committed sm90 bf16 entry with ``overrides`` (each variant starts from the table)."""
    base = TABLE[("sm90", kernel, head_dim, torch.bfloat16)]
    fields = {  # tiles as tuples (lists from JSON)
        k: Tiles(*v) if isinstance(v, (tuple, list)) and k != "tma" else v
        for k, v in overrides.items()
    }
    return dataclasses.replace(base, **fields)


def variant_problems(kernel: str, head_dim: int, overrides: dict) -> list[str]:
    """A variant's compile check for sm90 (``python -m portattn compile``'s: shared memory,
    spills, wgmma): one line per kernel that fails or spills, none if all pass. Arguments and
    result are JSON, so tests run it through ``ci.golden_dev.keys.in_compiler_process``."""
    from portattn.tools.compile_launches import Entry
    from portattn.tools.compilecheck import check_entry

    cfg = variant_config(kernel, head_dim, overrides)
    results = check_entry(Entry("sm90", kernel, head_dim, "bf16"), cfg=cfg)
    if not results:
        return ["nothing compiled"]
    return [
        f"{r.stage}: regs {r.regs} spills {r.spills} shared {r.shared} {'; '.join(r.failures)}"
        for r in results
        if not r.ok or r.spills
    ]


def compile_round(variants: list[tuple[str, int, dict]]) -> int:
    """``--compile``: each variant's kernels compiled for sm90 (``variant_problems``); prints
    one line per kernel that fails or spills and one per variant. Exit 1 if a variant fails or
    spills."""
    failed = 0
    for kernel, head_dim, overrides in variants:
        problems = variant_problems(kernel, head_dim, overrides)
        for line in problems:
            print(f"  {line}")
        failed += bool(problems)
        state = "FAIL" if problems else "ok"
        print(f"{kernel} d{head_dim} {overrides or 'table'}: {state}", flush=True)
    return 1 if failed else 0


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
        return fwd_ms, float("nan"), profile_kernels(fwd), digest(fwd())
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fwd(*leaves)
    # dO from its own seed: the global generator's state depends on the variants timed before,
    # so a randn_like here gave every variant other gradients (and another bits column).
    dout = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen.manual_seed(2))
    bits = digest(out, *torch.autograd.grad(out, leaves, dout, retain_graph=True))

    def bwd():
        torch.autograd.grad(out, leaves, dout, retain_graph=True)

    bwd_ms = triton.testing.do_bench(bwd, warmup=25, rep=150, return_mode="median")

    def step():
        torch.autograd.grad(fwd(*leaves), leaves, dout)

    return fwd_ms, bwd_ms, profile_kernels(step), bits


def profile_kernels(step) -> dict[str, float]:
    """Milliseconds of CUDA time per kernel name in one call of ``step`` (torch.profiler)."""
    per_kernel = profile_cuda_us(step, 3)
    return {name[:40]: round(us / 3 / 1e3, 3) for name, us in per_kernel.items() if us > 0}


def flops(head_dim: int, causal: bool) -> float:
    per = sum(4.0 * n * n * head_dim * 16 for n in skewed_lengths(32768))
    return per / 2 if causal else per


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--table-only", action="store_true", help="only the table's entries")
    parser.add_argument("--forward-only", action="store_true", help="time the forward alone")
    parser.add_argument(
        "--round", default=LATEST, choices=sorted(ROUNDS), help=f"variants (default {LATEST})"
    )
    parser.add_argument("--list", action="store_true", help="print the round's variants, exit")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile-check each variant for sm90 on this machine (no GPU), print, exit",
    )
    args = parser.parse_args()
    forward_only = args.forward_only or args.round in FORWARD_ONLY
    if args.list:
        for variant in ROUNDS[args.round]:
            print(*variant)
        return 0
    if args.compile:
        return compile_round(ROUNDS[args.round])
    rows = []
    for kernel, head_dim, overrides in ROUNDS[args.round]:
        if args.table_only and overrides:
            continue
        cfg = variant_config(kernel, head_dim, overrides)
        install(kernel, head_dim, cfg)
        start = time.perf_counter()
        row = dict(kernel=kernel, head_dim=head_dim, overrides=repr(overrides))
        try:
            row["problems"] = correct(kernel, head_dim)
            for causal in (False, True):
                f_ms, b_ms, kernel_ms, bits = timings(kernel, head_dim, causal, forward_only)
                tag = "causal" if causal else "full"
                fl = flops(head_dim, causal)
                row |= {
                    f"fwd_ms_{tag}": f_ms,
                    f"bwd_ms_{tag}": b_ms,
                    f"fwd_tf_{tag}": fl / f_ms / 1e9,
                    f"bwd_tf_{tag}": 2.5 * fl / b_ms / 1e9,
                    f"kernel_ms_{tag}": kernel_ms,
                    f"bits_{tag}": bits,
                }
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        row["seconds"] = time.perf_counter() - start
        install(kernel, head_dim, variant_config(kernel, head_dim, {}))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| kernel | d | overrides | fwd TF full/causal | bwd TF full/causal | ok | bits |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['kernel']} | {r['head_dim']} | {r['overrides']} | error | {r['error']} |")
            continue
        print(
            f"| {r['kernel']} | {r['head_dim']} | {r['overrides']} "
            f"| {r['fwd_tf_full']:.0f} / {r['fwd_tf_causal']:.0f} "
            f"| {r['bwd_tf_full']:.0f} / {r['bwd_tf_causal']:.0f} "
            f"| {'yes' if not r['problems'] else r['problems']} "
            f"| {r['bits_full']} / {r['bits_causal']} |"
        )
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
