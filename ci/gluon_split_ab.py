"""The Gluon split decode (``decode.GLUON_SPLIT``: a split decode's partials from
``decode_ws.py``, merged by ``decode.py``'s combine) against the Triton split (issue 37's long
rows: B1 x 32k, 0.47 TB/s on an H100 in session 48 against a target of 2.5).

GPU: for B = 1, 2, 4, 8 sequences of 32,768 keys (GQA 32/8 d128, bf16, pages of 64 in a
shuffled pool; the entries' key chunk of 16,384: two chunks a sequence) and both kernels, the
planned decode with the switch off and on, each captured in a CUDA graph after its own plan:
whether out is equal bitwise (it must be: the same chunks through the same steps), which
kernels ran, and each one's graph-replay TB/s (K/V bytes read once), best of two alternating
passes; FA4 det paged (the workload's peer) beside them. Then the short rows of
``bench_decode`` (B1, B8: 512..8,192 keys) with the block table an engine keeps, 512 pages
(32k keys) a sequence: the split follows the table's capacity (``kvcache``: the call's
``max_seqlen_k``), so these rows split too; the same rows with a table of their own width
(unsplit) beside them.

CPU (``--compile``): the split kernel's sm90 compile under the installed Triton (registers,
spills, shared memory), the first check before any GPU time.

    python ci/gluon_split_ab.py
    python ci/gluon_split_ab.py --compile
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

if not __package__:  # run as `python ci/gluon_split_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.timing import attempt
from portattn.kernels import decode, forward, plan

BATCHES = (1, 2, 4, 8)
KEYS = 32768


@contextlib.contextmanager
def decode_kernels_planned():
    """A list of the (stage, kernel name) of each decode launch planned in the block (a spy on
    ``forward.plan_decode``, put back after it); tests/test_decode_ws.py uses it too."""
    seen: list[tuple[str, str]] = []
    real = forward.plan_decode

    def spy(*args, **kw):
        launches, partials = real(*args, **kw)
        seen.extend((launch.stage, launch.kernel.fn.__name__) for launch in launches)
        return launches, partials

    forward.plan_decode = spy
    try:
        yield seen
    finally:
        forward.plan_decode = real


def planned(bd, w, inp, kernel: str, gluon: bool):
    """The decode planned with ``decode.GLUON_SPLIT = gluon``: (graphed impl, out, the
    (stage, kernel) of each launch planned)."""
    shipped, decode.GLUON_SPLIT = decode.GLUON_SPLIT, gluon
    plan.forget_problems()
    try:
        with decode_kernels_planned() as seen:
            impl = bd.portattn_impl(w, inp, kernel, paged=True)
            out = impl.fn().clone()
            graph = bd.graphed(impl)
    finally:
        decode.GLUON_SPLIT = shipped
    return graph, out, sorted(set(seen))


def workloads(bd) -> list:
    """(workload, block-table pages a sequence or None: the workload's own width)."""
    from benchmarks import decode_workloads as dw

    long = [dw.DecodeWorkload(f"decode B{b} 32k gqa32/8 d128", (KEYS,) * b, 1, 32, 8, 128)
            for b in BATCHES]  # fmt: skip
    short = [w for w in dw.default_workloads() if w.name in SHORT]
    return [(w, None) for w in long] + [(w, n) for w in short for n in (None, KEYS // 64)]


SHORT = ("decode B1 gqa32/8 d128", "decode B8 gqa32/8 d128")


def gpu() -> int:
    import dataclasses

    from benchmarks import bench_decode as bd
    from benchmarks import decode_workloads as dw

    print("| workload | table | kernel | Triton split graph TB/s | Gluon split graph TB/s | bits "
          "| kernels (Gluon) | FA4 det paged TB/s |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | --- | --- | ---: |")
    with torch.no_grad():
        for w, width in workloads(bd):
            inp = dw.make_inputs(w)
            table = "own"
            if width is not None:  # an engine's table (pages of 64): unused entries 0, unread
                pad = width - inp.block_table.shape[1]
                wide = torch.nn.functional.pad(inp.block_table, (0, pad))
                inp, table = dataclasses.replace(inp, block_table=wide), f"{width} pages"
            peer = "-"
            impl, error = attempt(lambda w=w, inp=inp: bd.graphed(bd.fa4_impl(w, inp, True, True)))
            if error is None:
                peer = f"{w.kv_bytes() / min(bd.gpu_timer(impl.fn)[0] for _ in range(2)) / 1e9:.2f}"
            for kernel in ("varlen", "fixed_order"):
                ref, ref_out, _ = planned(bd, w, inp, kernel, False)
                new, new_out, kernels = planned(bd, w, inp, kernel, True)
                same = torch.equal(ref_out, new_out)
                diff = (ref_out.float() - new_out.float()).abs().nan_to_num(1e9).max().item()
                best = {"ref": float("inf"), "new": float("inf")}
                for order in (("ref", "new"), ("new", "ref")):  # alternating passes
                    for name in order:
                        fn = (ref if name == "ref" else new).fn
                        best[name] = min(best[name], bd.gpu_timer(fn)[0])
                tbps = {name: w.kv_bytes() / ms / 1e9 for name, ms in best.items()}
                names = ", ".join(f"{stage}: {fn}" for stage, fn in kernels)
                print(f"| {w.name} | {table} | {kernel} | {tbps['ref']:.2f} | {tbps['new']:.2f} | "
                      f"{'equal' if same else f'DIFF {diff:.1e}'} | {names} | {peer} |",
                      flush=True)  # fmt: skip
    return 0


def compile_split(kernel: str, slots: int = 2) -> dict:
    """The sm90 compile of the split kernel (CPU tensors; nothing runs): its registers, spill
    bytes and shared memory. JSON in and out, for ``ci.golden_dev.keys.in_compiler_process``."""
    import tempfile

    from portattn.families import FAMILIES
    from portattn.kernels.decode_ws import (
        attn_decode_ws_kernel,
        decode_ws_args,
        decode_ws_params,
        decode_ws_reads,
    )
    from portattn.tools.compile_artifacts import resource_usage
    from portattn.tools.compile_inputs import pinned_knobs
    from portattn.tools.compile_launches import Entry, bind_launch
    from portattn.tools.compilecheck import compile_launch

    family = FAMILIES["sm90"]
    cfg = Entry("sm90", kernel, 128, "bf16").config()
    tiles = cfg.decode_tiles()
    b, hq, hk, d, page = 2, 32, 8, 128, 64
    q = torch.randn(b, hq, d, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(b, hq)
    k, table = torch.randn(4, page, hk, d, dtype=torch.bfloat16), torch.zeros(b, 2).int()
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    partials = torch.empty(slots, b, hq, d + 4)
    args = decode_ws_args(q, k, k.clone(), out, lse, cu, cu * 100, table, b, hq // hk,
                          d**-0.5, partials)  # fmt: skip
    params = decode_ws_params(d, tiles, hq // hk, page, True, kernel == "fixed_order",
                              cfg.key_chunk)  # fmt: skip
    launch = bind_launch("decode_split", attn_decode_ws_kernel, args, params,
                         decode_ws_reads(tiles.block_n, page, d))  # fmt: skip
    with tempfile.TemporaryDirectory() as cache, pinned_knobs(cache):
        art = compile_launch(launch, family)
    use = resource_usage(art, family)
    return dict(registers=use["regs"], spills=use["spills"], shared=art.shared,
                key_chunk=cfg.key_chunk)  # fmt: skip


def compile_sm90() -> int:
    print("| kernel | key chunk | registers | spill B | shared B |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kernel in ("varlen", "fixed_order"):
        r = compile_split(kernel)
        print(f"| {kernel} | {r['key_chunk']} | {r['registers']} | {r['spills']} | "
              f"{r['shared']} |")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="sm90 compile on this machine")
    args = parser.parse_args()
    return compile_sm90() if args.compile else gpu()


if __name__ == "__main__":
    sys.exit(main())
