"""Registers and spills of the forward and decode kernels with a key chunk (design §3.1), on a
CPU: sm90 entries compiled as they ship, with ``fwd_ws`` off, and with ``key_chunk`` C (the
Triton forward's chunks merged in registers; where the entry ships the Gluon forward, also that
one with C, its accumulator parked between merges),
whose compile check adds the chunk merge's launches (``compile_launches.CHUNK_STAGES``: the
forward and the unsplit decode of two chunks of keys, the split decode's two launches).

Usage: python ci/key_chunk_regs.py [C] [head dims, e.g. 128,64] [family]
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if not __package__:  # run as `python ci/key_chunk_regs.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import portattn.tools.compile_launches as cl
from portattn.tools.compilecheck import check_entry

STAGES = ("fwd", "decode", *cl.CHUNK_STAGES)  # the chunk merge's where the entry has a chunk


def main() -> int:
    chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    dims = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [128, 64]
    name = sys.argv[3] if len(sys.argv) > 3 else "sm90"
    for kernel in ("varlen", "fixed_order"):
        for d in dims:
            entry = cl.Entry(name, kernel, d, "bf16")
            base = entry.config()
            chunked = dataclasses.replace(base, fwd_ws=False, key_chunk=chunk)
            variants = (("shipped", base), ("ws off", dataclasses.replace(base, fwd_ws=False)),
                        (f"C{chunk}", chunked))  # fmt: skip
            if base.fwd_ws:  # the Gluon forward with C as it would ship: its acc parked
                variants += ((f"C{chunk} ws", dataclasses.replace(base, key_chunk=chunk)),)
            for label, cfg in variants:
                for r in check_entry(entry, cfg=cfg, stages=STAGES):
                    print(f"{kernel} d{d} {label} {r.stage}: regs {r.regs} spills {r.spills}",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
