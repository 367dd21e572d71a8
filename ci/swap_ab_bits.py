"""Does a product with its operands swapped give the same float32 bits (perf-notes row 112)?

The sm90 decode runs ``Q·Kᵀ`` and ``P·V`` as 64-row wgmma tiles of which a GQA-4 decode uses 4
rows. With the operands swapped (``Sᵀ = K·Qᵀ``: 128 keys on M, the query rows on N, padded to
16; ``Oᵀ = Vᵀ·Pᵀ``) the padding work goes, but the decode must keep the prefill's bits. This
probe compares, bitwise, each element of ``tl.dot(a, bᵀ, acc)`` with the same element of
``tl.dot(b, aᵀ, accᵀ)ᵀ`` on random operands (float32 accumulators that are not zero, as the
key loop's), at the decode's shapes, for 4 and 8 warps and d64 / d128, bf16 and fp16, and says
which instruction each kernel compiled to (wgmma expected on sm90: a 16-row product may compile
to ``mma.sync``, which row 85 found to sum in another order), and whether the row sums of the
softmax numerators (``tl.sum`` of the swapped tile over its keys) keep the prefill layout's
bits.

    python ci/swap_ab_bits.py          # on the GPU; prints one line per case and a verdict

Under ``TRITON_INTERPRET=1`` it runs too (numpy's products: not a statement about the GPU).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

if not __package__:  # run as `python ci/swap_ab_bits.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl


@triton.jit
def _product(a, b, acc, out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
             TRANS_B: tl.constexpr):  # fmt: skip
    """out [M, N] = acc + a [M, K] @ (b [N, K]ᵀ if TRANS_B else b [K, N]), float32."""
    o_m, o_n, o_k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    b_a = tl.load(a + o_m[:, None] * K + o_k[None, :])
    if TRANS_B:
        b_b = tl.trans(tl.load(b + o_n[:, None] * K + o_k[None, :]))
    else:
        b_b = tl.load(b + o_k[:, None] * N + o_n[None, :])
    b_acc = tl.load(acc + o_m[:, None] * N + o_n[None, :])
    b_acc = tl.dot(b_a, b_b, b_acc)
    tl.store(out + o_m[:, None] * N + o_n[None, :], b_acc)


@triton.jit
def _row_sums(q, k, out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
              SWAPPED: tl.constexpr, TRANSPOSE_FIRST: tl.constexpr):  # fmt: skip
    """The key loop's row sum of one tile, ``sum_j exp2(s_ij - max_j s_ij)`` for the M query
    rows of q [M, K] against the N keys of k [N, K], float32 [M]: from ``s = q·kᵀ`` (the
    prefill's layout, ``tl.sum`` over axis 1), or ``SWAPPED`` from ``sᵀ = k·qᵀ`` (``tl.sum``
    over axis 0, or ``TRANSPOSE_FIRST`` over axis 1 of its ``tl.trans``)."""
    o_m, o_n, o_k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    b_q = tl.load(q + o_m[:, None] * K + o_k[None, :])
    b_k = tl.load(k + o_n[:, None] * K + o_k[None, :])
    if SWAPPED:
        b_st = tl.dot(b_k, tl.trans(b_q))  # [N, M]
        b_pt = tl.exp2(b_st - tl.max(b_st, 0)[None, :])
        if TRANSPOSE_FIRST:
            b_l = tl.sum(tl.trans(b_pt), 1)
        else:
            b_l = tl.sum(b_pt, 0)
    else:
        b_s = tl.dot(b_q, tl.trans(b_k))  # [M, N]
        b_p = tl.exp2(b_s - tl.max(b_s, 1)[:, None])
        b_l = tl.sum(b_p, 1)
    tl.store(out + o_m, b_l)


def row_sums(q, k, warps: int) -> dict[str, bool]:
    """Whether the swapped tile's row sums (both spellings) equal the prefill layout's, for
    the first 16 rows of q [64, K]."""
    rows, keys, dim = 16, k.shape[0], k.shape[1]
    ref = torch.empty(64, dtype=torch.float32, device=q.device)
    _row_sums[(1,)](q, k, ref, 64, keys, dim, False, False, num_warps=warps)
    q16 = q[:rows].contiguous()
    same = {}
    for name, first in (("axis 0", False), ("trans", True)):
        got = torch.empty(rows, dtype=torch.float32, device=q.device)
        _row_sums[(1,)](q16, k, got, rows, keys, dim, True, first, num_warps=warps)
        same[name] = torch.equal(ref[:rows], got)
    return same


def product(a, b, acc, trans_b: bool, warps: int) -> tuple[torch.Tensor, str]:
    """``acc + a @ bᵀ`` (``trans_b``) or ``acc + a @ b``, and the product instruction used."""
    m, k = a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    out = torch.empty(m, n, dtype=torch.float32, device=a.device)
    compiled = _product[(1,)](a, b, acc, out, m, n, k, trans_b, num_warps=warps)
    asm = getattr(compiled, "asm", {}).get("ptx", "")
    kind = "wgmma" if "wgmma" in asm else "mma.sync" if "mma.sync" in asm else "?"
    return out, kind


def case(rows: int, keys: int, dim: int, dtype: torch.dtype, warps: int, device: str) -> dict:
    """One shape: the scores (``Q·Kᵀ`` against ``(K·Qᵀ)ᵀ``) and the output product (``P·V``
    against ``(Vᵀ·Pᵀ)ᵀ``), each with a random float32 accumulator."""
    g = torch.Generator(device="cpu").manual_seed(rows * 1000 + keys + dim + warps)

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt).to(device)

    q, k = rand(64, dim), rand(keys, dim)  # 64 query rows as the decode tile has
    acc_s = rand(64, keys, dt=torch.float32)
    s, s_kind = product(q, k, acc_s, True, warps)  # [64, keys]
    q16 = q[:rows].contiguous()  # the rows the swapped product keeps (padded to 16)
    s_t, st_kind = product(k, q16, acc_s[:rows].t().contiguous(), True, warps)  # [keys, rows]
    p, v = rand(64, keys), rand(keys, dim)
    acc_o = rand(64, dim, dt=torch.float32)
    o, o_kind = product(p, v, acc_o, False, warps)  # [64, dim]
    v_t = v.t().contiguous()  # [dim, keys]
    p16 = p[:rows].contiguous()  # [rows, keys]: Pᵀ as b [N, K] with trans_b
    o_t, ot_kind = product(v_t, p16, acc_o[:rows].t().contiguous(), True, warps)  # [dim, rows]
    sums = row_sums(q, k, warps)
    return dict(
        sums=sums,
        scores=torch.equal(s[:rows], s_t.t()),
        output=torch.equal(o[:rows], o_t.t()),
        kinds=f"{s_kind}/{st_kind}, {o_kind}/{ot_kind}",
        scores_max_diff=(s[:rows] - s_t.t()).abs().max().item(),
        output_max_diff=(o[:rows] - o_t.t()).abs().max().item(),
    )


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (interpreter)'}, "
          f"triton {triton.__version__}")  # fmt: skip
    same = True
    for rows, keys, dim, dtype, warps in itertools.product(
        (16,), (64, 128), (64, 128), (torch.bfloat16, torch.float16), (4, 8)
    ):
        r = case(rows, keys, dim, dtype, warps, device)
        same &= r["scores"] and r["output"]
        print(f"rows {rows} keys {keys:3d} d{dim:3d} {str(dtype)[6:]:8s} warps {warps}: "
              f"scores {'same' if r['scores'] else 'DIFFER'} ({r['scores_max_diff']:.3g}), "
              f"output {'same' if r['output'] else 'DIFFER'} ({r['output_max_diff']:.3g}); "
              f"row sums {r['sums']}; {r['kinds']}")  # fmt: skip
    print("verdict:", "swapped products keep every bit" if same else "some products differ",
          "(the row sums: see each line; where they differ the decode converts P to the "
          "prefill's layout before summing)")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
