"""What one compilation produced and the checks on it, for the compile check
(:mod:`portattn.tools.compilecheck`, which re-exports these names): resources from the ptxas
report or the AMDGCN metadata, the fingerprint, the family's matrix instruction."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from portattn.configs.rows import CHUNK_SPILLS
from portattn.configs.types import table_head_dim
from portattn.families import Family
from portattn.tools.compile_launches import Entry

if TYPE_CHECKING:
    from portattn.tools.compilecheck import KernelResult

HAS_PRODUCT = {"fwd": True, "bwd_pre": False, "bwd_dkdv": True, "bwd_dq": True, "decode": True}
HAS_PRODUCT |= {f"{stage}_repair": True for stage in ("fwd", "bwd_dkdv", "bwd_dq", "decode")}
HAS_PRODUCT |= {"fwd_chunked": True, "decode_chunked": True, "decode_split": True}
HAS_PRODUCT["decode_combine"] = False  # it only merges the chunks' partials
# How each family's matrix instruction shows in the text the check searches.
MMA_PATTERNS = {
    "mma.sync": re.compile(r"\bmma\.sync\.aligned\."),
    "wgmma": re.compile(r"\bwgmma\.mma_async\."),
    "tcgen05": re.compile(r"\btcgen05\.mma\."),  # Blackwell's tensor-memory products
    "v_mfma": re.compile(r"\bv_mfma_"),
}
# Older matrix instructions that must not appear beside a family's own: one product of a kernel
# that fell back (to mma.sync, say, where a tile is too small for wgmma / tcgen05) would pass
# the presence check above. Measured absent from every sm90 and sm100 kernel (Triton 3.6, 3.9).
FALLBACK_MMA = {"wgmma": ("mma.sync",), "tcgen05": ("mma.sync", "wgmma")}
# Kernels allowed to use another matrix instruction than their family's (still not FMA):
# (family, kernel, stage, head_dim) -> instruction. Empty: every kernel of every entry must use
# its family's instruction; kept so that a documented exception has one place to live.
MMA_EXCEPTIONS: dict[tuple[str, str, str, int], str] = {}


def accepted_spills(entry: Entry, stage: str) -> int:
    """Bytes of spills the check accepts in ``stage`` of ``entry`` (``rows.CHUNK_SPILLS``)."""
    row = CHUNK_SPILLS.get((entry.family, table_head_dim(max(entry.head_dim, entry.value_dim))))
    return row.get(stage, 0) if row else 0


@dataclass
class Artifacts:
    """What one compilation produced."""

    shared: int
    binary: bytes
    asm: str  # PTX (CUDA) or AMDGCN assembly (ROCm)
    ptxas_log: str = ""


# ----------------------------------------------------------------------------- checks


def _int(pattern: str, text: str) -> int | None:
    """The largest match (a stage of several launches has one report per kernel)."""
    matches = re.findall(pattern, text)
    return max(int(m) for m in matches) if matches else None


def merge_artifacts(parts: list[Artifacts]) -> Artifacts:
    """One stage's artifacts from its launches: the largest shared memory, the binaries and
    texts concatenated (a single launch keeps its own bytes, so its fingerprint is the same)."""
    return Artifacts(
        max(a.shared for a in parts),
        b"".join(a.binary for a in parts),
        "\n".join(a.asm for a in parts),
        "\n".join(a.ptxas_log for a in parts),
    )


def resource_usage(art: Artifacts, family: Family) -> dict[str, int | None]:
    """Registers, spills and scratch: from the ptxas report (CUDA) or AMDGCN metadata."""
    if family.vendor == "cuda":
        log = art.ptxas_log
        stores = _int(r"(\d+) bytes spill stores", log)
        loads = _int(r"(\d+) bytes spill loads", log)
        spills = None if stores is None or loads is None else stores + loads
        return {
            "regs": _int(r"Used (\d+) registers", log),
            "spills": spills,
            "scratch": _int(r"(\d+) bytes stack frame", log),
        }
    asm = art.asm
    # .vgpr_count is the total (architectural + accumulation VGPRs) on CDNA.
    return {
        "regs": _int(r"\.vgpr_count:\s+(\d+)", asm),
        "spills": _int(r"\.vgpr_spill_count:\s+(\d+)", asm),
        "sgpr_spills": _int(r"\.sgpr_spill_count:\s+(\d+)", asm),
        "scratch": _int(r"\.private_segment_fixed_size:\s+(\d+)", asm),
    }


# From this CUDA compute capability (x10) on, a fingerprint is the PTX's: Triton assembles these
# targets with its bundled ``ptxas-blackwell`` (CUDA 12.9 in Triton 3.6, 13.4 in 3.9), whose
# register allocation follows its address-space layout. The same PTX of sm100's d64 forward
# gave two cubins, differing only in the names of two uniform registers, in about half the
# runs here; a CI machine's full compile then differed from golden/ in all three passes of the
# fingerprint check (2026-12-02), although a wrapper ran that ptxas with address-space
# randomisation off. A GPU's JIT runs ptxas normally too, so the cubin is not a record of what
# runs there either; the PTX is Triton's deterministic output, and the ptxas that assembles it
# is fixed by the Triton version each fingerprint section is recorded for.
PTX_FINGERPRINT_FROM_ARCH = 100


def fingerprint_of(art: Artifacts, family: Family) -> str:
    """SHA-256 of the machine code (cubin / hsaco), or of the PTX for Blackwell targets
    (:data:`PTX_FINGERPRINT_FROM_ARCH`)."""
    if family.vendor == "cuda" and family.arch >= PTX_FINGERPRINT_FROM_ARCH:
        return hashlib.sha256(art.asm.encode()).hexdigest()
    return hashlib.sha256(art.binary).hexdigest()


def check_artifacts(result: KernelResult, art: Artifacts, family: Family) -> None:
    """Fill ``result`` from the artifacts and append every failed check to its failures."""
    result.shared = art.shared
    result.fingerprint = fingerprint_of(art, family)
    result.__dict__.update(resource_usage(art, family))
    if family.vendor == "cuda":
        result.wgmma_serialized = "C7515" in art.ptxas_log
    if art.shared > family.shared_mem_bytes:
        result.failures.append(f"shared memory {art.shared} > {family.shared_mem_bytes}")
    accepted = accepted_spills(result.entry, result.stage)
    if result.spills is None or result.scratch is None:
        result.failures.append("no register/spill report found")
    elif max(result.spills, result.scratch) > accepted and not result.stage.endswith("_repair"):
        # A repair pass (design §3.2) computes only tiles that hold a NaN or an infinity: its
        # spills are reported, not failed. Its matrix instruction is checked: a row's bits
        # need its pass's. The key split's stages may spill what rows.CHUNK_SPILLS accepts.
        result.failures.append(f"register spills ({result.spills}) / scratch ({result.scratch})")
    if HAS_PRODUCT[result.stage]:
        instr = matrix_instruction(result.entry, result.stage, family)
        result.mma = len(MMA_PATTERNS[instr].findall(art.asm))
        if not result.mma:
            result.failures.append(f"no {instr} instruction")
        for other in FALLBACK_MMA.get(instr, ()):
            if found := len(MMA_PATTERNS[other].findall(art.asm)):
                result.failures.append(f"{found} {other} instruction(s) beside {instr}")


def matrix_instruction(entry: Entry, stage: str, family: Family) -> str:
    """The matrix instruction ``stage`` of ``entry`` must contain."""
    key = (entry.family, entry.kernel, stage, entry.head_dim)
    return MMA_EXCEPTIONS.get(key, family.matrix_instruction)
