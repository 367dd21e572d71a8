"""The Gluon decode (``portattn/kernels/decode_ws.py``) against the shipped one: bits and K/V
bandwidth (issue 37's short rows; perf-notes rows 112, 114, 120).

GPU: for each workload (``bench_decode``'s lengths, GQA 32/8 d128 unless said) and kernel, the
shipped decode of the same rows (``varlen_attention`` on packed K/V, ``flash_attn_with_kvcache``
on pages of 16, 64 and 256) against ``decode_ws`` launched directly at 2 and 3 ring slots
(fixed_order's 64-key tiles also 4): whether out and lse are equal bitwise (they must be: the
same tiles through the same steps), and each one's graph-replay TB/s (K/V bytes read once).

CPU (``--compile``): the sm90 compile of each variant under the installed Triton (registers,
spills, shared memory), the first check before any GPU time.

    python ci/gluon_decode_ab.py [--quick]
    python ci/gluon_decode_ab.py --compile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/gluon_decode_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks.timing import attempt
from portattn.kernels.decode_ws import launch_decode_ws, plan_decode_ws
from portattn.tools.compile_launches import Entry

WORKLOADS = ("decode B1 gqa32/8 d128", "decode B8 gqa32/8 d128", "decode B64 gqa32/8 d128",
             "decode B256 gqa32/8 d128", "append16 B8 gqa32/8 d128", "decode B64 gqa8/1 d128",
             "decode B64 gqa32/8 d64", "decode B256 gqa32/8 d64")  # fmt: skip
PAGES = (0, 16, 64, 256)  # 0: packed K/V
# --swap: the short rows the swapped consumer is for, then the rest of its scope
SWAP_WORKLOADS = ("decode B1 gqa32/8 d128", "decode B8 gqa32/8 d128", "decode B1 32k gqa32/8 d128",
                  "decode B64 gqa8/1 d128", "decode B64 gqa32/8 d128", "append16 B8 gqa32/8 d128",
                  "decode B64 gqa32/8 d64", "decode B256 gqa32/8 d128")  # fmt: skip


def variants(kernel: str, head_dim: int) -> tuple[int, list[int]]:
    """(the sm90 entry's key tile, the ring slots to try)."""
    tiles = Entry("sm90", kernel, head_dim, "bf16").config().decode_tiles()
    return tiles.block_n, [2, 3, 4] if tiles.block_n == 64 else [2, 3]


def shipped(inp, w, page: int, kernel: str):
    """The shipped decode's (out [total_q, Hq, D], lse [total_q, Hq]) of the workload's rows."""
    if page == 0:
        q_rows = inp.q.reshape(-1, w.n_heads_q, w.head_dim)
        out, lse = portattn.varlen_attention(q_rows, inp.k, inp.v, inp.cu_q, inp.cu_k, w.q_len,
                                             max(w.kv_lens), causal=True, return_lse=True,
                                             kernel=kernel)  # fmt: skip
    else:
        out, lse = portattn.flash_attn_with_kvcache(
            inp.q, inp.k_pages, inp.v_pages, cache_seqlens=inp.seqlens,
            block_table=inp.block_table, causal=True, return_softmax_lse=True, kernel=kernel,
        )  # fmt: skip
        # [B, Sq, Hq, D], lse [B, Hq, Sq]
        out, lse = out.reshape(-1, w.n_heads_q, w.head_dim), lse.transpose(1, 2)
    if lse.shape[0] != out.shape[0] and lse.shape[-1] == out.shape[0]:  # [Hq, total_q]
        lse = lse.transpose(0, 1)
    return out, lse.reshape(out.shape[0], w.n_heads_q)


def gluon_call(inp, w, page: int, kernel: str, block_n: int, stages: int, swap: bool = False):
    """A zero-argument call of the Gluon decode on the same rows, and its (out, lse);
    ``swap``: its swapped consumer (``decode_swap.py``: 16-row tiles)."""
    q_rows = inp.q.reshape(-1, w.n_heads_q, w.head_dim)
    out = torch.full_like(q_rows, float("nan"))
    lse = torch.full(q_rows.shape[:2], float("nan"), device=q_rows.device)
    if page == 0:
        k, v, table, cu_k = inp.k, inp.v, None, inp.cu_k
    else:
        k, v, table = inp.k_pages, inp.v_pages, inp.block_table
        cu_k = torch.nn.functional.pad(inp.seqlens.cumsum(0), (1, 0)).int()
    launch = plan_decode_ws(q_rows, k, v, out, lse, inp.cu_q, cu_k, w.q_len, table,
                            w.head_dim**-0.5, True, kernel == "fixed_order", block_n,
                            stages, swap=swap)  # fmt: skip

    def run():
        launch_decode_ws(launch)
        return out

    return run, out, lse


def gpu_row(bd, w, kernel: str, page: int, swap: bool = False) -> str:
    """One table row: the shipped decode's graph TB/s, the Gluon decode's at each slot count
    (``swap``: at the entry's slots, unswapped then swapped), and whether each gives the
    shipped bits."""
    from benchmarks import decode_workloads as dw

    block_n, slots = variants(kernel, w.head_dim)
    stages = Entry("sm90", kernel, w.head_dim, "bf16").config().decode_tiles().num_stages
    runs = [(stages, False), (stages, True)] if swap else [(n, False) for n in slots]
    dw.PAGE_SIZE = page or 64  # make_inputs lays the pages out at this size
    inp = dw.make_inputs(w)
    ref_out, ref_lse = shipped(inp, w, page, kernel)
    ref = bd.graphed(bd.DecodeImpl(lambda: shipped(inp, w, page, kernel), lambda o: o[0])).fn
    cells, bits = [], []
    for n, swapped in runs:
        try:
            run, out, lse = gluon_call(inp, w, page, kernel, block_n, n, swapped)
            run()
        except Exception as err:  # noqa: BLE001 - a variant that fails: its row says so
            bits.append("error: " + str(err).splitlines()[-1][:80])
            cells.append(f"- ({n}{' swap' if swapped else ''})")
            continue
        torch.cuda.synchronize()
        same = torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        diff = (out.float() - ref_out.float()).abs().nan_to_num(1e9).max().item()
        bits.append("equal" if same else f"DIFF {diff:.1e}")
        fn = bd.graphed(bd.DecodeImpl(run, lambda o: o)).fn
        ms = min(bd.gpu_timer(fn)[0] for _ in range(2))
        cells.append(f"{w.kv_bytes() / ms / 1e9:.2f} ({n}{' swap' if swapped else ''})")
    ms_ref = min(bd.gpu_timer(ref)[0] for _ in range(2))
    peer = "-"
    if page == 64 and kernel == "varlen":  # FA4 det on the same pages (bench_decode's peer)
        impl, error = attempt(lambda: bd.graphed(bd.fa4_impl(w, inp, True, True)))
        if error is None:
            peer = f"{w.kv_bytes() / min(bd.gpu_timer(impl.fn)[0] for _ in range(2)) / 1e9:.2f}"
    layout = f"paged {page}" if page else "packed"
    return (f"| {w.name} | {kernel} | {layout} | {w.kv_bytes() / ms_ref / 1e9:.2f} | "
            f"{' / '.join(cells)} | {' / '.join(bits)} | {peer} |")  # fmt: skip


def gpu(quick: bool, swap: bool = False) -> int:
    from benchmarks import bench_decode as bd
    from benchmarks import decode_workloads as dw

    wanted = WORKLOADS[:2] if quick else WORKLOADS[2:]
    if swap:
        wanted = SWAP_WORKLOADS
    workloads = [w for w in dw.default_workloads() if w.name in wanted]
    print("| workload | kernel | K/V | shipped graph TB/s | gluon TB/s (slots) | bits | FA4 det "
          "paged TB/s |")  # fmt: skip
    print("| --- | --- | --- | ---: | --- | --- | ---: |")
    with torch.no_grad():
        for w in workloads:
            for kernel in ("varlen",) if swap else ("varlen", "fixed_order"):
                for page in PAGES[:3] if swap else PAGES:
                    print(gpu_row(bd, w, kernel, page, swap), flush=True)
    return 0


def compile_variant(kernel: str, d: int, page: int, slots: int, swap: bool = False) -> dict:
    """The sm90 compile of one variant on this machine (CPU tensors; nothing runs): its
    registers, spill bytes, shared memory, TMA copies and wgmma instructions in the PTX.
    Module-level and JSON in, JSON out, for ``ci.golden_dev.keys.in_compiler_process``."""
    import tempfile

    from portattn.families import FAMILIES
    from portattn.kernels.decode_ws import attn_decode_ws_kernel
    from portattn.tools.compile_artifacts import resource_usage
    from portattn.tools.compile_inputs import pinned_knobs
    from portattn.tools.compile_launches import bind_launch
    from portattn.tools.compilecheck import compile_launch

    family = FAMILIES["sm90"]
    block_n, _ = variants(kernel, d)
    b, hq, hk = 2, 32, 8
    q = torch.randn(b, hq, d, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(b, hq)
    if page:
        k, table = torch.randn(4, page, hk, d, dtype=torch.bfloat16), torch.zeros(b, 2).int()
    else:
        k, table = torch.randn(256, hk, d, dtype=torch.bfloat16), None
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    plan = plan_decode_ws(q, k, k.clone(), out, lse, cu, cu * 100, 1, table, d**-0.5, True,
                          kernel == "fixed_order", block_n, slots, swap=swap)  # fmt: skip
    launch = bind_launch(
        "decode_ws", attn_decode_ws_kernel, plan.args, plan.params, plan.descriptors
    )
    with tempfile.TemporaryDirectory() as cache, pinned_knobs(cache):
        art = compile_launch(launch, family)
    use = resource_usage(art, family)
    return dict(registers=use["regs"], spills=use["spills"], shared=art.shared,
                tma_copies=art.asm.count("cp.async.bulk.tensor"),
                wgmma=art.asm.count("wgmma.mma_async"))  # fmt: skip


def layout_probe(block_n: int) -> int:
    """Compile (sm90; for tests/test_decode_ws.py) a kernel that converts a [64, block_n]
    tile in ``ws.acc_layout`` to ``decode_swap.prefill_rows_layout``'s bases with the 64-row
    layout's warps, asserting the conversion moves nothing; returns its shared stores."""
    import tempfile

    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from portattn.families import FAMILIES
    from portattn.kernels import ws_common as ws
    from portattn.kernels.decode_swap import prefill_rows_layout
    from portattn.tools.compile_inputs import pinned_knobs
    from portattn.tools.compile_launches import bind_launch
    from portattn.tools.compilecheck import compile_launch

    @gluon.constexpr_function
    def rows64(n):
        one = prefill_rows_layout(n)
        return gl.DistributedLinearLayout(one.reg_bases, one.lane_bases, [[16, 0], [32, 0]],
                                          [], [64, n])  # fmt: skip

    @gluon.jit
    def probe(x, y, BLOCK_N: gl.constexpr):
        s_layout: gl.constexpr = ws.acc_layout(BLOCK_N)
        o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        o_c = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        b_x = gl.load(x + o_r[:, None] * BLOCK_N + o_c[None, :])
        b_y = gl.convert_layout(b_x, rows64(BLOCK_N), assert_trivial=True)
        gl.store(y + gl.arange(0, 64, layout=gl.SliceLayout(1, rows64(BLOCK_N))), gl.sum(b_y, 1))

    x, y = torch.zeros(64, block_n), torch.zeros(64)
    launch = bind_launch("probe", probe, (x, y), {"BLOCK_N": block_n, "num_warps": 4}, ())
    with tempfile.TemporaryDirectory() as cache, pinned_knobs(cache):
        return compile_launch(launch, FAMILIES["sm90"]).asm.count("st.shared")


def compile_sm90() -> int:
    """Compile each variant for sm90 on this machine."""
    print("| kernel | d | K/V | slots | registers | spill B | shared B | TMA copies |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for kernel in ("varlen", "fixed_order"):
        for d in (128, 64):
            for page in PAGES:
                for n in variants(kernel, d)[1]:
                    try:
                        r = compile_variant(kernel, d, page, n)
                    except Exception as err:  # noqa: BLE001 - report and go on
                        r = dict(registers="error: " + str(err).splitlines()[-1][:200])
                    print(f"| {kernel} | {d} | {page or 'packed'} | {n} | {r['registers']} | "
                          f"{r.get('spills')} | {r.get('shared')} | {r.get('tma_copies')} |",
                          flush=True)  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="sm90 compile on this machine")
    parser.add_argument("--quick", action="store_true", help="B1 and B8 only (else the rest)")
    parser.add_argument(
        "--swap",
        action="store_true",
        help="the entry's slots unswapped and swapped (decode_swap.py)",
    )
    args = parser.parse_args()
    return compile_sm90() if args.compile else gpu(args.quick, args.swap)


if __name__ == "__main__":
    sys.exit(main())
