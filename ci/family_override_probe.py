"""What the family override really ran: run both kernels (forward + backward, two head dims)
on the GPU under ``$PORTATTN_FAMILY_OVERRIDE`` and print, per loaded kernel, the target its
PTX was made for, the matrix instruction in it, and the registers / spills the driver's JIT
reported; then the accuracy against float64. Exit 1 if a kernel was not loaded from the
override's PTX or an accuracy check fails.

    PORTATTN_FAMILY_OVERRIDE=sm80 python ci/family_override_probe.py
"""

from __future__ import annotations

import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from helpers import assert_accurate, make_pack  # noqa: E402

import portattn.kernels.ptx_jit as ptx_jit  # noqa: E402
from portattn.families import FAMILIES, family, family_override  # noqa: E402

loaded: dict[str, object] = {}
_load = ptx_jit._load_as_ptx


def _recording_load(compiled, arch: int) -> None:
    _load(compiled, arch)
    loaded[compiled.name] = compiled


ptx_jit._load_as_ptx = _recording_load


def main() -> int:
    device = torch.device("cuda")
    override = family_override(device)
    print(f"device {torch.cuda.get_device_name()} (family {family()}), override {override}")
    if override is None:
        print("no override: set PORTATTN_FAMILY_OVERRIDE (e.g. sm80)")
        return 1
    failed = 0
    for kernel in ("varlen", "fixed_order"):
        for d in (64, 128):
            p = make_pack([63, 1, 300, 17], [63, 1, 300, 17], 8, 2, d, torch.bfloat16, seed=d)
            try:
                assert_accurate(p, kernel, causal=True)
                status = "accurate"
            except AssertionError as exc:
                failed += 1
                status = f"INACCURATE: {exc}"
            print(f"{kernel:12s} d{d:<4d} causal bf16 fwd+bwd: {status}")
    wanted = FAMILIES[override].matrix_instruction
    for name, compiled in sorted(loaded.items()):
        compiled._init_handles()
        ptx = ptx_jit.family_ptx(compiled, FAMILIES[override].arch)  # what the driver got
        target = re.search(r"\.target (\S+)", ptx).group(1)
        has = wanted in ptx
        wgmma = "wgmma" in ptx
        print(
            f"  {name:40s} PTX .target {target}, {wanted}: {has}, wgmma: {wgmma}, "
            f"registers {compiled.n_regs}, spills {compiled.n_spills}"
        )
        products = name != "attn_bwd_preprocess_kernel"  # rowsum(O * dO): no matrix product
        failed += (products and not has) or wgmma or target != f"sm_{FAMILIES[override].arch}"
    print(f"{len(loaded)} kernels loaded from {override} PTX; {failed} problem(s)")
    return 1 if failed or not loaded else 0


if __name__ == "__main__":
    sys.exit(main())
