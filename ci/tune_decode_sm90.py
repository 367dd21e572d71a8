"""Variant timing of the sm90 decode kernel's tiles (``KernelConfig.decode``), bits checked.

A decode row's bits depend on its key tiles (``BLOCK_N``, the forward's) and, on sm90, on the
query rows of a tile: below 64 rows the products leave wgmma for mma.sync and sum in another
order (measured: perf-notes row 85); warps and stages at 64 rows keep the bits. Each variant here
keeps ``BLOCK_N`` and its outputs must equal the committed entry's bitwise (``torch.equal`` on
out and lse) on every workload, or the row says so. Timed as ``benchmarks/bench_decode.py`` times
(``do_bench`` medians, L2 flushed), eagerly and as a CUDA-graph replay, on the paged cache of
pages of 64 keys: ``flash_attn_with_kvcache(..., causal=True)``, bf16.

Usage (GPU): python ci/tune_decode_sm90.py [--kernel varlen] [--head-dim 128] [--json PATH]
[--list]. The table in ``portattn/configs/rows.py`` is edited by hand afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

if not __package__:  # run as `python ci/tune_decode_sm90.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw
from portattn import configs
from portattn.configs import Tiles

WORKLOADS = ("decode B1 gqa32/8", "decode B8 gqa32/8", "decode B64 gqa32/8", "decode B1 32k")
# (block_m, num_warps, num_stages) with the entry's block_n; None: the committed entry.
VARIANTS = (
    None,
    (64, 8, 2),
    (64, 8, 4),
    (64, 4, 3),
    (32, 4, 3),
    (32, 4, 4),
    (16, 4, 3),
    (16, 4, 5),
    (16, 2, 4),
    # one stage: the K/V tiles of one (64 KB at d128) let 2-3 CTAs share an SM (perf-notes
    # row 78: one CTA of 8 warps per SM, limited by shared memory and registers alike)
    (64, 8, 1),
    (64, 4, 1),
    (32, 4, 1),
    (16, 4, 1),
    (16, 4, 2),
)


def entry(kernel: str, head_dim: int) -> configs.KernelConfig:
    return configs.config_table()[("sm90", kernel, head_dim, torch.bfloat16)]


def install(kernel: str, head_dim: int, cfg: configs.KernelConfig) -> None:
    """Put ``cfg`` in the (cached) table for sm90 bf16 in this process."""
    configs.config_table()[("sm90", kernel, head_dim, torch.bfloat16)] = cfg


def with_decode(base: configs.KernelConfig, variant: tuple | None) -> configs.KernelConfig:
    if variant is None:
        return base
    block_m, warps, stages = variant
    tiles = Tiles(block_m, base.fwd.block_n, warps, stages)
    return dataclasses.replace(base, decode=tiles)


def call(inp: dw.DecodeInputs, kernel: str):
    return portattn.flash_attn_with_kvcache(
        inp.q,
        inp.k_pages,
        inp.v_pages,
        cache_seqlens=inp.seqlens,
        block_table=inp.block_table,
        causal=True,
        return_softmax_lse=True,
        kernel=kernel,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="varlen", choices=("varlen", "fixed_order"))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--json", default=None)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    workloads = [w for w in dw.default_workloads() if w.name.startswith(WORKLOADS)]
    workloads = [w for w in workloads if w.head_dim == args.head_dim]
    if args.list:
        for variant in VARIANTS:
            print(variant)
        print(*(w.name for w in workloads), sep="\n")
        return 0
    base = entry(args.kernel, args.head_dim)
    inputs = {w.name: dw.make_inputs(w) for w in workloads}
    reference = {name: call(inp, args.kernel) for name, inp in inputs.items()}
    rows = []
    for variant in VARIANTS:
        cfg = with_decode(base, variant)
        install(args.kernel, args.head_dim, cfg)
        row = dict(variant=repr(variant), tiles=repr(cfg.decode_tiles()))
        start = time.perf_counter()
        for w in workloads:
            inp = inputs[w.name]
            try:
                out, lse = call(inp, args.kernel)
                ref_out, ref_lse = reference[w.name]
                same = torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
                impl = bd.DecodeImpl(lambda inp=inp: call(inp, args.kernel), lambda o: o[0])
                eager = bd.gpu_timer(impl.fn)[0]
                graph = bd.gpu_timer(bd.graphed(impl).fn)[0]
                row[w.name] = dict(
                    same_bits=same,
                    eager_ms=eager,
                    graph_ms=graph,
                    graph_tbps=w.kv_bytes() / graph / 1e9,
                )
            except Exception as exc:  # noqa: BLE001 - a variant that fails is a row
                row[w.name] = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        row["seconds"] = round(time.perf_counter() - start, 1)
        install(args.kernel, args.head_dim, base)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"| decode tiles ({args.kernel} d{args.head_dim}) | "
        + " | ".join(f"{w.name} graph TB/s (eager ms)" for w in workloads)
        + " |"
    )
    print("| --- |" + " ---: |" * len(workloads))
    for row in rows:
        cells = []
        for w in workloads:
            r = row[w.name]
            if "error" in r:
                cells.append(r["error"][:60])
                continue
            bits = "" if r["same_bits"] else " BITS DIFFER"
            cells.append(f"{r['graph_tbps']:.2f} ({r['eager_ms']:.3f}){bits}")
        print(f"| {row['tiles']} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
