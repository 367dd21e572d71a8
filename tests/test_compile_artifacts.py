"""The compile check's checks of compiled artifacts, on hand-written ptxas reports, AMDGCN
metadata and assembly (no compiling): resources and spills, the family's matrix instruction,
the fingerprint's definition, and launches against the table's tiles
(``portattn.tools.compile_artifacts``, ``compile_launches.table_mismatches``). The compiles
themselves are tests/test_compilecheck.py's.
"""

from __future__ import annotations

import hashlib

import pytest

from portattn.configs import Tiles
from portattn.families import FAMILIES
from portattn.tools import compilecheck as cc
from portattn.tools.compile_artifacts import resource_usage

# The installed Triton's table and Gluon launch options: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version


PTXAS_LOG = """\
ptxas info    : Compiling entry function 'attn_fwd_kernel' for 'sm_80'
ptxas info    : Function properties for attn_fwd_kernel
    24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 488 bytes cmem[0]
"""
AMDGCN_META = """\
  - .agpr_count:     256
    .private_segment_fixed_size: 180
    .sgpr_count:     72
    .sgpr_spill_count: 3
    .vgpr_count:     512
    .vgpr_spill_count: 44
"""


def test_resource_usage_parsing():
    cuda = cc.Artifacts(49152, b"", "", PTXAS_LOG)
    assert resource_usage(cuda, FAMILIES["sm80"]) == {"regs": 255, "spills": 24, "scratch": 24}
    hip = cc.Artifacts(16384, b"", AMDGCN_META)
    assert resource_usage(hip, FAMILIES["cdna3"]) == {
        "regs": 512,
        "spills": 44,
        "sgpr_spills": 3,
        "scratch": 180,
    }


def test_sgpr_spills_to_vgpr_lanes_pass_but_scratch_fails():
    entry = cc.Entry("cdna3", "varlen", 64, "bf16")
    asm = AMDGCN_META.replace("180", "0").replace("spill_count: 44", "spill_count: 0")
    asm += "v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], 0\n"
    result = cc.KernelResult(entry, "fwd", "0")
    cc.check_artifacts(result, cc.Artifacts(16384, b"x", asm), FAMILIES["cdna3"])
    assert result.ok and result.sgpr_spills == 3 and result.mma == 1
    result = cc.KernelResult(entry, "fwd", "0")
    cc.check_artifacts(result, cc.Artifacts(16384, b"x", AMDGCN_META), FAMILIES["cdna3"])
    assert not result.ok


NO_SPILLS_LOG = PTXAS_LOG.replace("24 bytes", "0 bytes").replace("16 bytes", "0 bytes")
NO_SPILLS_LOG = NO_SPILLS_LOG.replace("8 bytes", "0 bytes")
MMA_SYNC = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r4}, {%r5}, {%f2};\n"
WGMMA = "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1;\n"
TCGEN05 = "tcgen05.mma.cta_group::1.kind::f16 [%r6], %rd1, %rd2, %r7, 1;\n"
# Blackwell's tensor-memory allocation and loads, which are not products.
TMEM = (
    "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r1], 128;\n"
    "tcgen05.ld.sync.aligned.32x32b.x64.b32 {%r2}, [%r3];\n"
)


@pytest.mark.parametrize(
    ("family", "asm", "count", "ok"),
    [
        ("sm100", TMEM + TCGEN05 * 2, 2, True),
        ("sm100", TMEM + MMA_SYNC, 0, False),  # Triton's code for 32-row query tiles there
        ("sm100", TMEM + TCGEN05 + MMA_SYNC, 1, False),  # one product fell back
        ("sm90", WGMMA * 3, 3, True),
        ("sm90", WGMMA + MMA_SYNC, 1, False),
        ("sm80", MMA_SYNC * 2, 2, True),
        ("sm120", MMA_SYNC, 1, True),
        ("sm120", "fma.rn.f32 %f1, %f2, %f3, %f4;\n", 0, False),
    ],
)
def test_family_matrix_instruction_and_no_fallback(family, asm, count, ok):
    """A kernel passes with its family's matrix instruction (sm100: the ``tcgen05.mma``
    products, not its tensor-memory loads) and, on sm90 / sm100, no ``mma.sync`` beside it: a
    product that fell back fails even where the others did not."""
    entry = cc.Entry(family, "varlen", 64, "bf16")
    result = cc.KernelResult(entry, "fwd", "0")
    cc.check_artifacts(result, cc.Artifacts(4096, b"x", asm, NO_SPILLS_LOG), FAMILIES[family])
    assert result.mma == count and result.ok == ok, result.failures
    if not ok and count:
        assert result.failures == [
            "1 mma.sync instruction(s) beside " + FAMILIES[family].matrix_instruction
        ]


@pytest.mark.parametrize("family", ["sm80", "sm90", "sm100", "sm120", "cdna3"])
def test_fingerprint_is_the_ptx_on_blackwell(family):
    """Blackwell targets are fingerprinted by their PTX (ptxas-blackwell's register names follow
    its address-space layout), every other target by its machine code."""
    entry = cc.Entry(family, "varlen", 64, "bf16")
    result = cc.KernelResult(entry, "fwd", "0")
    asm = {"sm80": "mma.sync", "sm120": "mma.sync", "sm90": "wgmma.mma_async"}.get(family)
    asm = asm or ("tcgen05.mma" if family == "sm100" else "v_mfma")
    art = cc.Artifacts(4096, b"cubin", asm, NO_SPILLS_LOG)
    cc.check_artifacts(result, art, FAMILIES[family])
    blackwell = FAMILIES[family].vendor == "cuda" and FAMILIES[family].arch >= 100
    hashed = asm.encode() if blackwell else b"cubin"
    assert result.fingerprint == hashlib.sha256(hashed).hexdigest()
    assert blackwell == (family in ("sm100", "sm120"))


def test_preprocess_needs_no_matrix_instruction():
    entry = cc.Entry("sm90", "varlen", 64, "bf16")
    result = cc.KernelResult(entry, "bwd_pre", "0")
    log = PTXAS_LOG.replace("24 bytes", "0 bytes").replace("16 bytes", "0 bytes")
    cc.check_artifacts(
        result, cc.Artifacts(256, b"x", "", log.replace("8 bytes", "0 bytes")), FAMILIES["sm90"]
    )
    assert result.ok and result.mma is None


def test_table_mismatch_is_reported():
    entry = cc.Entry("sm90", "varlen", 128, "bf16")
    cfg = entry.config()
    launch = cc.Launch(
        "fwd",
        None,
        {"BLOCK_M": 64, "BLOCK_N": cfg.fwd.block_n},
        {"num_warps": 4, "num_stages": cfg.fwd.num_stages},
    )
    problems = cc.table_mismatches(launch, cfg)
    assert len(problems) == 2 and "BLOCK_M=64" in problems[1]
    good = cc.Launch(
        "fwd",
        None,
        {"BLOCK_M": cfg.fwd.block_m, "BLOCK_N": cfg.fwd.block_n},
        cfg.fwd.launch_kwargs(),
    )
    assert cc.table_mismatches(good, cfg) == []
    assert isinstance(cfg.fwd, Tiles)
    # The warp-specialised forward launches one consumer group's 4 warps (plus workers).
    from portattn.kernels.forward_ws import attn_fwd_ws_kernel
    from portattn.kernels.ws_common import ws_launch_options

    args = {"BLOCK_M": cfg.fwd.block_m, "BLOCK_N": cfg.fwd.block_n}
    ws = cc.Launch("fwd", attn_fwd_ws_kernel, args, ws_launch_options(cfg.fwd))
    assert cc.table_mismatches(ws, cfg) == []
    ws_as_triton = cc.Launch("fwd", attn_fwd_ws_kernel, args, cfg.fwd.launch_kwargs())
    assert len(cc.table_mismatches(ws_as_triton, cfg)) == 1


@pytest.mark.parametrize(
    ("head_dim", "stage", "spilled", "ok"),
    [
        (128, "decode_split", 40, True),  # within rows.CHUNK_SPILLS' 64 B
        (128, "decode_split", 100, False),
        (128, "decode_chunked", 744, True),
        (128, "decode", 24, False),  # the entry's plain stages spill nothing
        (64, "decode_split", 24, False),  # d64's split compiles spill-free: no allowance
        (112, "decode_chunked", 744, True),  # a borrowed head dim takes its row's allowance
    ],
)
def test_the_key_split_stages_may_spill_what_the_table_accepts(head_dim, stage, spilled, ok):
    """Spills fail a kernel, except in the key split's stages of the entries whose measured
    launch options spill (``rows.CHUNK_SPILLS``), up to the bytes recorded there."""
    entry = cc.Entry("sm90", "varlen", head_dim, "bf16")
    result = cc.KernelResult(entry, stage, "0")
    log = PTXAS_LOG.replace("24 bytes stack", f"{spilled} bytes stack")
    log = log.replace("16 bytes spill stores", f"{spilled // 2} bytes spill stores")
    log = log.replace("8 bytes spill loads", f"{spilled - spilled // 2} bytes spill loads")
    art = cc.Artifacts(4096, b"x", "wgmma.mma_async.sync.aligned", log)
    cc.check_artifacts(result, art, FAMILIES["sm90"])
    assert result.spills == spilled
    assert result.ok == ok, result.failures
