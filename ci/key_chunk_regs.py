"""Registers and spills of the forward and decode kernels with a key chunk (design §3.1), on a
CPU: sm90 entries compiled as they ship, with ``fwd_ws`` off, and with ``key_chunk`` C (the
chunks merged in registers, or parked with ``ci/patches/park_running_acc.diff`` applied), and
the split decode's two launches (one sequence of 4096 keys, a small grid).

Usage: python ci/key_chunk_regs.py [C] [head dims, e.g. 128,64] [family]
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as `python ci/key_chunk_regs.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn.tools.compile_launches as cl
from portattn.families import FAMILIES
from portattn.kernels import decode
from portattn.tools.compile_artifacts import resource_usage
from portattn.tools.compile_inputs import pinned_knobs
from portattn.tools.compilecheck import check_entry, compile_launch


def main() -> int:
    chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    dims = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [128, 64]
    name = sys.argv[3] if len(sys.argv) > 3 else "sm90"
    family = FAMILIES[name]
    for kernel in ("varlen", "fixed_order"):
        for d in dims:
            entry = cl.Entry(name, kernel, d, "bf16")
            base = entry.config()
            chunked = dataclasses.replace(base, fwd_ws=False, key_chunk=chunk)
            variants = (("shipped", base), ("ws off", dataclasses.replace(base, fwd_ws=False)),
                        (f"C{chunk}", chunked))  # fmt: skip
            for label, cfg in variants:
                decode.SPLIT_BELOW_PROGRAMS = 0  # the unsplit decode: its own stage
                for r in check_entry(entry, cfg=cfg, stages=("fwd", "decode")):
                    print(f"{kernel} d{d} {label} {r.stage}: regs {r.regs} spills {r.spills}")
            decode.SPLIT_BELOW_PROGRAMS = 1 << 30
            cl.REPRESENTATIVE = dict(cl.REPRESENTATIVE, seqlen=4096)
            q = torch.zeros(2, 16, d, dtype=torch.bfloat16)
            k = torch.zeros(2, 4, d, dtype=torch.bfloat16)
            with cl.unset_env(["TRITON_INTERPRET"]):
                plan = cl._plan_paged_decode(entry, chunked, q, k, k, d**-0.5)
            cl.REPRESENTATIVE = dict(cl.REPRESENTATIVE, seqlen=256)
            with tempfile.TemporaryDirectory() as cache, pinned_knobs(cache):
                for planned in plan.launches:
                    launch = cl.bind_launch(planned.stage, planned.kernel, planned.args,
                                            planned.params)  # fmt: skip
                    use = resource_usage(compile_launch(launch, family), family)
                    print(f"{kernel} d{d} C{chunk} {planned.stage}: regs {use['regs']} "
                          f"spills {use['spills']}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
