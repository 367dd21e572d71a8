"""Where the paged decode loses to the packed one (issue 37 item 2): the same decode rows through
``flash_attn_with_kvcache`` on paged caches of pages 16, 64 and 256 and through
``varlen_attention`` on packed K/V (both run ``kernels/decode.py``; the rows must be equal bit
for bit), timed as CUDA-graph replays (K/V bytes read per second), bf16, GQA 32/8, d128.

``--ncu``: each variant runs three times and nothing is timed, for Nsight Compute to profile the
decode kernels (``ci/gpu_next.sh 5`` runs it under ``ncu``); kernel launches come in the
order of ``VARIANTS`` per workload.

Usage (GPU): python ci/decode_paged_ab.py [--ncu] [--workloads "decode B64"] [--kernel fixed_order]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/decode_paged_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw
from ci.tune_decode_sm90 import call as paged_call

WORKLOADS = ("decode B8 gqa32/8 d128", "decode B64 gqa32/8 d128", "decode B1 32k gqa32/8 d128")
PAGES = (16, 64, 256)
VARIANTS = ("packed",) + tuple(f"paged {p}" for p in PAGES)


def calls(w: dw.DecodeWorkload, kernel: str) -> dict[str, object]:
    """variant -> a zero-argument call of ``kernel`` returning (out [B, Hq, D] rows, lse)."""
    out = {}
    for page in PAGES:
        dw.PAGE_SIZE = page  # make_inputs lays the pages out at the module's page size
        inp = dw.make_inputs(w)

        def paged(inp=inp):
            o, lse = paged_call(inp, kernel)  # [B, 1, Hq, D], [B, Hq, 1]
            rows = o.reshape(-1, w.n_heads_q, w.head_dim)
            return rows, lse.transpose(1, 2).reshape(-1, w.n_heads_q)

        out[f"paged {page}"] = paged
    q_rows = inp.q.reshape(-1, w.n_heads_q, w.head_dim)
    max_k = max(w.kv_lens)

    def packed(inp=inp):
        return portattn.varlen_attention(
            q_rows,
            inp.k,
            inp.v,
            inp.cu_q,
            inp.cu_k,
            w.q_len,
            max_k,
            causal=True,
            return_lse=True,
            kernel=kernel,
        )

    return {"packed": packed, **out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncu", action="store_true", help="run each variant 3 times, untimed")
    parser.add_argument("--workloads", action="append", default=None, help="name prefixes")
    parser.add_argument(
        "--kernel", action="append", default=None, help="varlen (default) / fixed_order"
    )
    args = parser.parse_args()
    wanted = tuple(args.workloads or WORKLOADS)
    workloads = [w for w in dw.default_workloads() if w.name.startswith(wanted)]
    print("| workload | kernel | " + " | ".join(f"{v} graph TB/s" for v in VARIANTS) + " | bits |")
    print("| --- | --- |" + " ---: |" * len(VARIANTS) + " --- |")
    with torch.no_grad():
        for w, kernel in ((w, k) for w in workloads for k in args.kernel or ["varlen"]):
            fns = calls(w, kernel)
            results = {name: fn() for name, fn in fns.items()}
            ref_out, ref_lse = results["packed"]
            same = all(
                torch.equal(o, ref_out) and torch.equal(lse, ref_lse) for o, lse in results.values()
            )
            if args.ncu:
                for fn in fns.values():
                    for _ in range(3):
                        fn()
                torch.cuda.synchronize()
                print(
                    f"| {w.name} | {kernel} | " + " | ".join("-" for _ in VARIANTS) + f" | {same} |"
                )
                continue
            cells = []
            for name in VARIANTS:
                impl = bd.DecodeImpl(fns[name], lambda o: o[0])
                ms = bd.gpu_timer(bd.graphed(impl).fn)[0]
                cells.append(f"{w.kv_bytes() / ms / 1e9:.2f}")
            bits = "equal" if same else "DIFFER"
            print(f"| {w.name} | {kernel} | " + " | ".join(cells) + f" | {bits} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
