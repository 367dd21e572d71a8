"""Launch options of the key chunk's kernels on the GPU (design §3.1, issue 37): the device's
entries patched to ``C`` (the Triton forward, as ``ci/split_decode_ab.py``), then

1. the split decode's partials launch (``decode_split``) at other warps / pipeline stages than
   the entry's decode tiles (which spill 40 B at sm90 varlen d128, 32 B fixed_order; 8 warps
   at 1 stage does not, CPU compile): K/V TB/s of the graph replay, bits against the entry's
   own split (warps and stages must not move a bit);
2. the training forward with ``C`` (the Triton forward's chunks in registers, +9-14% on the H100
   in session 32) at ``C`` 2048 and 4096, and the shipped Gluon forward with ``C`` 1024 to 4096
   (its running accumulator parked in a float32 workspace between merges): ms against
   ``fwd_ws`` off without C, and the Gluon forward's bits against the Triton forward's.

Usage (GPU): python ci/split_variants.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if not __package__:  # run as `python ci/split_variants.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import decode_workloads as dw
from benchmarks.timing import gpu_timer
from ci.split_decode_ab import (
    TRAINING_PACKS,
    WORKLOADS,
    decode_call,
    patch_entries,
    tbps,
    training_pack,
)
from portattn import configs
from portattn.families import config_family
from portattn.kernels import decode, plan

SPLIT_OPTIONS: dict = {}  # num_warps / num_stages of the decode_split launches, {} as the entry's
_static = decode._decode_static


def _patched_static(p, page_size, has_sink, stage="decode", slots=0):
    grid, params = _static(p, page_size, has_sink, stage, slots)
    if stage == "decode_split" and SPLIT_OPTIONS:
        params = dict(params, **SPLIT_OPTIONS)
    return grid, params


decode._decode_static = _patched_static


def split_rows(names: list[str]) -> list[str]:
    lines = ["| split decode (paged 64, bf16 gqa32/8 d128, C 2048) | kernel | warps, stages | "
             "graph TB/s | bits |", "| --- | --- | --- | ---: | --- |"]  # fmt: skip
    variants = {"varlen": [None, (8, 1), (8, 2), (4, 2), (4, 1)],
                "fixed_order": [None, (8, 3), (8, 2), (4, 2), (8, 1)]}  # fmt: skip
    decode.SPLIT_BELOW_PROGRAMS = 1 << 30
    for name in names:
        w = dw.DecodeWorkload(name, WORKLOADS[name], 1, 32, 8, 128)
        inp = dw.make_inputs(w)
        for kernel, options in variants.items():
            reference = None
            for option in options:
                SPLIT_OPTIONS.clear()
                if option is not None:
                    SPLIT_OPTIONS.update(num_warps=option[0], num_stages=option[1])
                patch_entries(2048)  # forgets the planned problems: new launch parameters
                fn = decode_call(inp, kernel)
                with torch.no_grad():
                    out = fn()
                    graph, _ = tbps(w, fn)
                if reference is None:
                    reference, bits = out, "entry"
                else:
                    same = all(torch.equal(a, b) for a, b in zip(out, reference, strict=True))
                    bits = "= entry" if same else "DIFFER"
                label = "entry's" if option is None else f"{option[0]}, {option[1]}"
                lines.append(f"| {name} | {kernel} | {label} | {graph:.2f} | {bits} |")
                print(lines[-1], flush=True)
    SPLIT_OPTIONS.clear()
    return lines


def patch_forward(chunk: int, ws: bool = False, **fwd) -> None:
    """The device family's entries with ``key_chunk`` = ``chunk``, fwd_ws off (``ws``: as
    shipped) and the forward's tiles changed by ``fwd`` (num_warps / num_stages)."""
    patch_entries(None)
    table = configs.config_table()
    family = config_family(torch.device("cuda"))
    for key, cfg in list(table.items()):
        if key[0] == family:
            tiles = dataclasses.replace(cfg.fwd, **fwd)
            table[key] = dataclasses.replace(cfg, fwd=tiles, fwd_ws=cfg.fwd_ws and ws,
                                             key_chunk=chunk)  # fmt: skip
    plan.forget_problems()


def forward_rows(kernels: tuple[str, ...] = ("varlen", "fixed_order")) -> list[str]:
    lines = ["| training forward (causal, bf16 h16 d128, Triton) | variant | ms | vs no C |",
             "| --- | --- | ---: | ---: |"]  # fmt: skip
    # The Gluon forward as shipped (three ring slots, 128-key tiles) with C: its running acc
    # parked in a float32 workspace between merges (forward_ws._chunked_keys).
    variants = [("no C", 0, {}), ("C2048", 2048, {}), ("C4096", 4096, {}),
                ("Gluon (shipped)", 0, {"ws": True}),
                ("C1024 Gluon", 1024, {"ws": True}),
                ("C2048 Gluon", 2048, {"ws": True}),
                ("C4096 Gluon", 4096, {"ws": True})]  # fmt: skip
    best: dict = {}
    outputs: dict = {}
    for name, lens in TRAINING_PACKS:
        q, k, v, cu = training_pack(lens)
        for kernel in kernels:
            for label, chunk, fwd in variants * 2:  # alternating passes, the best kept
                patch_forward(chunk, **fwd)

                def step(q=q, k=k, v=v, cu=cu, n=max(lens), kernel=kernel):
                    return portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True,
                                                     kernel=kernel)  # fmt: skip

                ms = gpu_timer(step)[0]
                key = (name, kernel, label)
                best[key] = min(best.get(key, ms), ms)
                if key not in outputs:
                    with torch.no_grad():
                        outputs[key] = step()
            # the Gluon forward's chunk merge (acc parked in a workspace) against the Triton one's
            gluon, triton_ = (
                outputs[(name, kernel, "C2048 Gluon")],
                outputs[(name, kernel, "C2048")],
            )
            same = torch.equal(gluon, triton_)
            lines.append(f"| {name} {kernel} | C2048 Gluon = C2048 Triton | "
                         f"{'equal' if same else 'DIFFER'} | |")  # fmt: skip
            for label, *_ in variants:
                ratio = best[(name, kernel, label)] / best[(name, kernel, "no C")]
                lines.append(f"| {name} {kernel} | {label} | {best[(name, kernel, label)]:.3f} "
                             f"| {ratio:.3f} |")  # fmt: skip
                print(lines[-1], flush=True)
    patch_entries(None)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B1 32k and B64 only")
    parser.add_argument("--forward", action="store_true", help="the varlen forward rows only")
    args = parser.parse_args()
    names = ["B1 32k", "B64"] if args.quick else ["B1 32k", "B8 32k", "B8", "B64"]
    if args.forward:
        lines = forward_rows(("varlen",))
    else:
        lines = split_rows(names) + forward_rows()
    print("\n## summary\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
