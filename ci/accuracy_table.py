"""Accuracy of both kernels against float64 (design §2 in docs/design.md): share of correctly
rounded elements and Frobenius error over the rounding floor, printed as a markdown table.

Run on a GPU (bfloat16 and float16) or under TRITON_INTERPRET=1 on the CPU (float16)."""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from helpers import make_pack  # noqa: E402
from test_fixed_order import accuracy_table  # noqa: E402

dtypes = [torch.bfloat16, torch.float16] if torch.cuda.is_available() else [torch.float16]
print("| dtype | causal | D | kernel | out | dq | dk | dv | lse max abs err |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for dtype in dtypes:
    for causal in (False, True):
        for d in (64, 128):
            lens = [63, 17, 1000, 1, 333, 2048] if torch.cuda.is_available() else [63, 17, 100, 1]
            p = make_pack(lens, lens[::-1], 8, 2, d, dtype, seed=90 + d)
            t = accuracy_table(p, causal)
            for kernel in ("varlen", "fixed_order"):
                cells = [
                    f"{100 * t[(kernel, n)][0]:.2f}% / {t[(kernel, n)][1]:.3f}x"
                    for n in ("out", "dq", "dk", "dv")
                ]
                print(
                    f"| {str(dtype)[6:]} | {causal} | {d} | {kernel} | "
                    + " | ".join(cells)
                    + f" | {t[(kernel, 'lse')]:.2e} |"
                )
print("\ncells: correctly rounded share / relative Frobenius error over the rounding floor")
