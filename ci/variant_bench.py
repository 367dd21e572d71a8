"""``benchmarks/bench.py`` with one sm90 bf16 configuration entry replaced in this process, so a
table variant is timed by the benchmark's own workloads and peers (perf-notes rows 129-130:
the three-group d64 forward against the table, with FA4 deterministic in the same run).

Usage (GPU): python ci/variant_bench.py [--variant KERNEL:HEAD_DIM:FIELD=VALUE,...] -- <the
arguments of benchmarks/bench.py>. FIELD=VALUE as in ``ci/tune_sm90.py``'s rounds: tiles as
``fwd=192/128/12/3``, flags as ``fwd_ws=1``. Without ``--variant`` it runs the table, so two
processes, alternated, compare a variant with the table, e.g.

    python ci/variant_bench.py --variant varlen:64:fwd=192/128/12/3,fwd_ws=1 -- \\
        --workloads d64 --impls portattn --impls FA4
    python ci/variant_bench.py --variant varlen:64:fwd=192/128/12/3,fwd_ws=1 -- \\
        --decode --workloads d64

The entry is checked when it is made (``KernelConfig``); nothing here is used by the package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/variant_bench.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_variant(text: str) -> tuple[str, int, dict]:
    """``KERNEL:HEAD_DIM:FIELD=VALUE,...`` as (kernel, head_dim, overrides) for
    ``ci.tune_sm90.variant_config``: a value with ``/`` is tiles, else an int or a bool flag."""
    kernel, head_dim, fields = text.split(":", 2)
    overrides: dict = {}
    for item in filter(None, fields.split(",")):
        name, value = item.split("=", 1)
        if "/" in value:
            overrides[name] = tuple(int(x) for x in value.split("/"))
        elif name.endswith("_ws"):  # fwd_ws, bwd_ws, dq_ws, decode_ws
            overrides[name] = value not in ("0", "false", "False")
        else:
            overrides[name] = int(value)
    return kernel, int(head_dim), overrides


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python ci/variant_bench.py")
    parser.add_argument("--variant", action="append", default=[], help="KERNEL:HEAD_DIM:...")
    if "--" in argv:
        split = argv.index("--")
        ours, bench_args = argv[:split], argv[split + 1 :]
    else:
        ours, bench_args = argv, []
    args = parser.parse_args(ours)
    from benchmarks import bench
    from ci.tune_sm90 import install, variant_config

    for text in args.variant:
        kernel, head_dim, overrides = parse_variant(text)
        install(kernel, head_dim, variant_config(kernel, head_dim, overrides))
        print(f"variant: {kernel} d{head_dim} {overrides}", flush=True)
    return bench.main(bench_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
