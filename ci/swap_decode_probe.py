"""A decode with swapped operands, against the shipped one: bits and K/V bandwidth (perf-notes
row 112; run ``ci/swap_ab_bits.py`` first, it says whether the products can keep the bits).

The shipped sm90 decode computes ``Q·Kᵀ`` and ``P·V`` on 64-row wgmma tiles whose rows are the
GQA group's query heads (4 of 64 at GQA 32/8). This probe's kernel, one program per (sequence,
kv head), puts the key tile on the product's M instead: ``Sᵀ = K·Qᵀ`` [BLOCK_N, 16] and ``Oᵀ =
Vᵀ·Pᵀ + Oᵀ`` [D, 16], the group's heads on N (padded to 16), through the key loop's own steps
(``primitives.mask_scores``, ``online_softmax_step`` on the transposed scores, ``split_p_lo``,
``row_state.normalize_rows``; ``ROW_SUM`` 0: the softmax's reductions over the keys' axis
instead, no transpose). Plain decode only: one query row per sequence (bottom-right causal:
every key visible), packed K/V [total_k, Hkv, D] read through host tensor descriptors (TMA),
no window, softcap or sink; fixed_order's split-P in ``primitives.mma_rounded``'s order (hi,
then lo). Not part of the package.

Both kernels, each at the sm90 table's key tile of its forward (varlen d128: 128 keys; the
others 64), for each workload: whether the swapped decode's out (and lse) equals
``portattn.varlen_attention``'s bitwise, the largest difference, and both decodes' K/V TB/s
(``do_bench`` medians, L2 flushed, better of two passes in alternating order).

    python ci/swap_decode_probe.py [--quick]
    python ci/swap_decode_probe.py --compile    # on a CPU: the sm90 compile's resources

Run on an H100 in session 43 (perf-notes row 114): the row sums differ (lse on every row), the
partial-tile step is wrong at 4 warps and with split-P, and the d64 workload stopped on an
illegal address. Not a product path in Triton (row 114 says what a Gluon decode would need);
kept as the record of that run.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

if not __package__:  # run as `python ci/swap_decode_probe.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl

import portattn
from portattn.kernels.plan import LOG2E
from portattn.kernels.primitives import mask_scores, online_softmax_step, split_p_lo
from portattn.kernels.row_state import normalize_rows


@triton.jit
def _step(b_q, b_k, b_v, b_acc, b_m, b_l, m_n, scale_log2, MASKED: tl.constexpr,
          ROW_SUM: tl.constexpr, SPLIT_P: tl.constexpr):  # fmt: skip
    """One key tile, transposed: b_q [GP, D], b_k / b_v [BLOCK_N, D], b_acc [D, GP]; ``SPLIT_P``
    (fixed_order): P as hi + lo, both products, hi first (``primitives.mma_rounded``'s order).
    ``ROW_SUM`` 1: the key loop's own ``online_softmax_step`` on the transposed scores; 0: the
    same expressions with every reduction over the keys' axis 0 (no transpose)."""
    b_st = tl.dot(b_k, tl.trans(b_q))  # [BLOCK_N, GP]: the scores, keys on M
    if MASKED:
        b_st = mask_scores(b_st, m_n[:, None])
    if ROW_SUM == 1:
        b_p, b_alpha, b_m, b_l = online_softmax_step(tl.trans(b_st), b_m, b_l, scale_log2)
        b_pt = tl.trans(b_p)
    else:
        b_m_new = tl.maximum(b_m, tl.max(b_st, 0) * scale_log2)
        b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_pt = tl.exp2(b_st * scale_log2 - b_m_use[None, :])
        b_alpha = tl.exp2(b_m - b_m_use)
        b_l = b_l * b_alpha + tl.sum(b_pt, 0)
        b_m = b_m_new
    b_acc = b_acc * b_alpha[None, :]
    b_hi = b_pt.to(b_v.dtype)
    b_acc = tl.dot(tl.trans(b_v), b_hi, b_acc)  # [D, GP]
    if SPLIT_P:
        b_acc = tl.dot(tl.trans(b_v), split_p_lo(b_pt, b_hi), b_acc)
    return b_acc, b_m, b_l


@triton.jit
def swap_decode_kernel(
    q, k_desc, v_desc, o, lse, cu_seqlens_k,
    stride_qb, stride_qh, stride_ob, stride_oh, n_heads_q, scale_log2,
    GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr, ROW_SUM: tl.constexpr, SPLIT_P: tl.constexpr,
):  # fmt: skip
    """One program per (sequence, kv head). K and V through host descriptors of the packed
    [total_k, Hkv * D] caches, [BLOCK_N, D] blocks (copied to shared memory by TMA, where
    wgmma reads its A operand; as pointer loads they stayed in registers and spilled)."""
    i_b = tl.program_id(0)
    i_hk = tl.program_id(1)
    bos = tl.load(cu_seqlens_k + i_b)
    seqlen = tl.load(cu_seqlens_k + i_b + 1) - bos
    o_g = tl.arange(0, GP)
    m_g = o_g < GROUP
    o_d = tl.arange(0, D)
    i_h = i_hk * GROUP + o_g
    p_q = q + i_b.to(tl.int64) * stride_qb + i_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_g[:, None], other=0.0)  # [GP, D]
    b_m = tl.full([GP], float("-inf"), tl.float32)
    b_l = tl.zeros([GP], tl.float32)
    b_acc = tl.zeros([D, GP], tl.float32)
    o_n0 = tl.arange(0, BLOCK_N)
    n_full = (seqlen // BLOCK_N) * BLOCK_N
    for start in tl.range(0, n_full, BLOCK_N, num_stages=STAGES):  # whole tiles, no mask
        b_k = k_desc.load([bos + start, i_hk * D])  # [BLOCK_N, D]
        b_v = v_desc.load([bos + start, i_hk * D])
        b_acc, b_m, b_l = _step(b_q, b_k, b_v, b_acc, b_m, b_l, o_n0 < BLOCK_N, scale_log2,
                                False, ROW_SUM, SPLIT_P)  # fmt: skip
    if n_full < seqlen:  # the last, partial tile: the next sequence's keys (or TMA's zeros
        m_n = n_full + o_n0 < seqlen  # past the cache) masked out of the scores
        b_k = k_desc.load([bos + n_full, i_hk * D])
        b_v = v_desc.load([bos + n_full, i_hk * D])
        b_acc, b_m, b_l = _step(b_q, b_k, b_v, b_acc, b_m, b_l, m_n, scale_log2, True, ROW_SUM,
                                SPLIT_P)  # fmt: skip
    b_out, b_lse = normalize_rows(tl.trans(b_acc), b_m, b_l)  # [GP, D], [GP]: the key loop's
    p_o = o + i_b.to(tl.int64) * stride_ob + i_h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, b_out.to(o.dtype.element_ty), mask=m_g[:, None])
    tl.store(lse + i_b.to(tl.int64) * n_heads_q + i_h, b_lse, mask=m_g)


def swap_decode(q, k, v, cu_seqlens_k, scale, block_n, warps, stages, row_sum, split_p):
    """q [B, Hq, D] (one row per sequence), k/v packed [total_k, Hkv, D] contiguous -> out,
    lse [B, Hq]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    batch, n_heads_q, dim = q.shape
    total, n_heads_k = k.shape[:2]
    group = n_heads_q // n_heads_k
    k_desc = TensorDescriptor.from_tensor(k.view(total, n_heads_k * dim), [block_n, dim])
    v_desc = TensorDescriptor.from_tensor(v.view(total, n_heads_k * dim), [block_n, dim])
    out = torch.empty_like(q)
    lse = torch.empty(batch, n_heads_q, dtype=torch.float32, device=q.device)
    swap_decode_kernel[(batch, n_heads_k)](
        q, k_desc, v_desc, out, lse, cu_seqlens_k,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), n_heads_q, scale * LOG2E,
        GROUP=group, GP=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=block_n,
        STAGES=stages, ROW_SUM=row_sum, SPLIT_P=split_p, num_warps=warps,
    )  # fmt: skip
    return out, lse


def workloads(quick: bool):
    """(name, lengths, Hq, Hkv, D)."""
    g = torch.Generator().manual_seed(0)

    def lengths(b):
        return torch.randint(512, 8193, (b,), generator=g).tolist()

    rows = [("B1 32k gqa32/8 d128", [32768], 32, 8, 128),
            ("B8 gqa32/8 d128", lengths(8), 32, 8, 128),
            ("B64 gqa32/8 d128", lengths(64), 32, 8, 128)]  # fmt: skip
    if not quick:
        rows += [("B256 gqa32/8 d128", lengths(256), 32, 8, 128),
                 ("B64 gqa8/1 d128", lengths(64), 8, 1, 128),
                 ("B64 gqa32/8 d64", lengths(64), 32, 8, 64)]  # fmt: skip
    return rows


def probe(name, lens, hq, hkv, dim, dtype, device, variants, timer) -> None:
    """One workload: for each kernel the shipped decode's output and time, then each
    variant's."""
    g = torch.Generator().manual_seed(len(lens))
    total = sum(lens)
    cu_k = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    cu_q = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)
    q = torch.randn(len(lens), hq, dim, generator=g).to(dtype).to(device)
    k = torch.randn(total, hkv, dim, generator=g).to(dtype).to(device)
    v = torch.randn(total, hkv, dim, generator=g).to(dtype).to(device)
    scale = dim**-0.5
    kv_bytes = 2 * total * hkv * dim * 2
    for kernel in ("varlen", "fixed_order"):
        # the sm90 table's key tile for the kernel's forward (the decode's bits are the prefill's)
        block_n = 128 if (dim, kernel) == (128, "varlen") else 64

        def shipped(kernel=kernel):
            return portattn.varlen_attention(q, k, v, cu_q, cu_k, 1, max(lens), causal=True,
                                             softmax_scale=scale, return_lse=True,
                                             kernel=kernel)  # fmt: skip

        ref_out, ref_lse = shipped()
        for var in variants:

            def swapped(var=var, block_n=block_n, split_p=kernel == "fixed_order"):  # fmt: skip
                return swap_decode(q, k, v, cu_k, scale, block_n, var["warps"], var["stages"],
                                   var["row_sum"], split_p)  # fmt: skip

            out, lse = swapped()
            same_out = torch.equal(out, ref_out)
            same_lse = torch.equal(lse, ref_lse)
            diff = (out.float() - ref_out.float()).abs().max().item()
            tbps = ["—", "—"]
            if timer is not None:
                times: list[list[float]] = [[], []]
                for order in ((0, 1), (1, 0)):
                    for i in order:
                        times[i].append(timer(shipped if i == 0 else swapped))
                tbps = [f"{kv_bytes / min(t) / 1e9:.2f}" for t in times]
            summed = "sum of Pᵀ over keys" if var["row_sum"] == 0 else "sum of trans(Pᵀ)"
            label = f"{kernel}, {var['warps']} warps {var['stages']} stages, {summed}"
            print(f"| {name} | {label} | {'same' if same_out else 'DIFFER'} | "
                  f"{'same' if same_lse else 'DIFFER'} | {diff:.3g} | {tbps[0]} | {tbps[1]} |",
                  flush=True)  # fmt: skip


def compile_sm90() -> None:
    """Compile the kernel for sm90 on this machine (no GPU: Triton's compiler with a
    ``GPUTarget``, portattn's pinned knobs) at each variant, and print what ptxas reports and
    which instructions the PTX holds: registers, spill stores, shared memory, wgmma, TMA."""
    import contextlib
    import io
    import re
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from portattn.tools.compilecheck import pinned_knobs

    target = GPUTarget("cuda", 90, 32)
    scalars = ("stride_qb", "stride_qh", "stride_ob", "stride_oh", "n_heads_q")
    for dim, block_n, split_p in ((128, 128, 0), (128, 64, 1), (64, 64, 1)):
        desc = f"tensordesc<bf16[{block_n}, {dim}]>"
        signature = dict(q="*bf16", k_desc=desc, v_desc=desc, o="*bf16", lse="*fp32",
                         cu_seqlens_k="*i32", **dict.fromkeys(scalars, "i32"),
                         scale_log2="fp32")  # fmt: skip
        for warps, stages in itertools.product((4, 8), (2, 3)):
            constants = dict(GROUP=4, GP=16, D=dim, BLOCK_N=block_n, STAGES=stages, ROW_SUM=0,
                             SPLIT_P=split_p)  # fmt: skip
            signature.update(dict.fromkeys(constants, "constexpr"))
            src = ASTSource(fn=swap_decode_kernel, signature=signature, constexprs=constants)
            log = io.StringIO()
            with (tempfile.TemporaryDirectory() as cache, pinned_knobs(cache),
                  contextlib.redirect_stdout(log)):  # fmt: skip
                kernel = triton.compile(src, target=target, options=dict(num_warps=warps))
            report, ptx = log.getvalue(), kernel.asm["ptx"]
            regs = re.search(r"Used (\d+) registers", report)
            spills = re.search(r"(\d+) bytes spill stores", report)
            print(f"d{dim} {block_n} keys split-P {split_p}, {warps} warps {stages} stages: "
                  f"registers {regs and regs.group(1)}, "
                  f"spill stores {spills and spills.group(1)} B, "
                  f"shared {kernel.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
                  f"mma.sync {ptx.count('mma.sync')}, "
                  f"TMA {ptx.count('cp.async.bulk.tensor')}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B1 x 32k, B8 and B64 only")
    parser.add_argument(
        "--compile", action="store_true", help="compile for sm90 here (CPU): its resources"
    )
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                        help="fp16 for a check of the kernel's values under the interpreter, "
                        "whose bf16 products are wrong")  # fmt: skip
    args = parser.parse_args()
    if args.compile:
        compile_sm90()
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    gpu = torch.cuda.is_available()
    timer = None
    variants = [dict(warps=w, stages=s, row_sum=r)
                for w, s, r in itertools.product((4, 8), (2, 3), (0, 1))]  # fmt: skip
    if gpu:
        import triton.testing

        def timer(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
    else:
        variants = variants[:1]  # the interpreter only checks that it runs

    print("| workload | variant | out bits | lse bits | max diff | shipped TB/s | swapped TB/s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for name, lens, hq, hkv, dim in workloads(args.quick or not gpu):
        if not gpu:
            lens = [min(n, 300) for n in lens[:2]]  # the interpreter: a small sanity run
        probe(name, lens, hq, hkv, dim, dtype, "cuda" if gpu else "cpu", variants, timer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
