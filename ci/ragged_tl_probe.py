"""CPU probe (no GPU): does a ``tl`` kernel read tiles through host-made ragged descriptors
(triton/tools/ragged_tma.py's 5-d construction, as ``kernels/descriptors.py`` makes them) as
cheaply as through the per-program descriptors of ``addressing.row_tiles``? Compiles three
small sm90 kernels, one Q K^T product each, and prints their PTX counts (perf-notes rows 105
and 106): with the Gluon kernels' layout ([.., rows, head, D]: the block's unit head dim
between rows and columns) the reshape to 2-d sends both operands through registers
(``ldmatrix``); with the head first (``descriptors.ragged_tl_descriptor``, [head, .., rows,
D]) it is a view and wgmma reads shared memory, as with the program's own descriptors.

Usage: python ci/ragged_tl_probe.py
"""

from __future__ import annotations

import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

RAGGED_ROWS = tl.constexpr(0x40000000)  # 2**30, as kernels/descriptors.py


@triton.jit
def ragged_qk(
    q_desc,
    k_desc,
    out,
    bos,
    seqlen,
    head,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    HEAD_FIRST: tl.constexpr,
):
    if HEAD_FIRST:  # descriptors.ragged_tl_descriptor's order
        coords = [head, RAGGED_ROWS, bos + seqlen, RAGGED_ROWS - seqlen, 0]
    else:  # the Gluon kernels' (descriptors.ragged_descriptor)
        coords = [RAGGED_ROWS, bos + seqlen, RAGGED_ROWS - seqlen, head, 0]
    b_q = q_desc.load(coords)
    b_k = k_desc.load(coords)
    b_s = tl.dot(tl.reshape(b_q, [BLOCK_M, D]), tl.trans(tl.reshape(b_k, [BLOCK_N, D])))
    o = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(out + o, b_s)


@triton.jit
def program_qk(
    q,
    k,
    out,
    bos,
    seqlen,
    head,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
):
    q_desc = tl.make_tensor_descriptor(
        q + bos * stride + head * D, [seqlen, D], [stride, 1], [BLOCK_M, D]
    )
    k_desc = tl.make_tensor_descriptor(
        k + bos * stride + head * D, [seqlen, D], [stride, 1], [BLOCK_N, D]
    )
    b_s = tl.dot(q_desc.load([0, 0]), tl.trans(k_desc.load([0, 0])))
    o = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(out + o, b_s)


def main() -> None:
    tiles = {"BLOCK_M": 64, "BLOCK_N": 64, "D": 64}
    scalars = {"out": "*fp32", "bos": "i32", "seqlen": "i32", "head": "i32"}
    desc = "tensordesc<bf16[1,1,64,1,64]>"
    head_first = "tensordesc<bf16[1,1,1,64,64]>"
    kernels = (  # (label, kernel, signature, constexprs beside the tiles)
        ("ragged_qk", ragged_qk, {"q_desc": desc, "k_desc": desc, **scalars},
         {"HEAD_FIRST": False}),
        ("head_first_qk", ragged_qk, {"q_desc": head_first, "k_desc": head_first, **scalars},
         {"HEAD_FIRST": True}),
        ("program_qk", program_qk, {"q": "*bf16", "k": "*bf16", **scalars, "stride": "i32"}, {}),
    )  # fmt: skip
    for label, fn, signature, flags in kernels:
        constexprs = dict(tiles, **flags)
        signature = dict(signature, **dict.fromkeys(constexprs, "constexpr"))
        compiled = triton.compile(
            ASTSource(fn, signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4},
        )
        ptx = compiled.asm["ptx"]
        counts = {
            p: len(re.findall(re.escape(p), ptx))
            for p in ("tensormap", "cp.async.bulk.tensor", "ldmatrix", "wgmma.mma_async")
        }
        print(label, ptx.count("\n"), "PTX lines,", counts)


if __name__ == "__main__":
    main()
