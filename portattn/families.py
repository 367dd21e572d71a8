"""GPU families: the sets of devices that run the same machine code for our kernels.

Detection reads the running device (compute capability on CUDA, ``gcnArchName`` on ROCm) and
never guesses from memory sizes. Nothing here touches a GPU at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch


@dataclass(frozen=True)
class Family:
    name: str
    vendor: str  # "cuda" or "hip"
    arch: int | str  # compute capability as int (90) or gfx name
    warp_size: int
    shared_mem_bytes: int  # per block (CUDA, opt-in maximum) / per workgroup LDS (ROCm)
    matrix_instruction: str  # what the compile check looks for in the machine code
    devices: str

    def target(self):
        """The Triton ``GPUTarget`` this family compiles for."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.vendor, self.arch, self.warp_size)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("sm80", "cuda", 80, 32, 166912, "mma.sync", "A100, A800, A30 (cc 8.0)"),
        Family("sm90", "cuda", 90, 32, 232448, "wgmma", "H100, H200, H20, GH200 (cc 9.0)"),
        Family("sm100", "cuda", 100, 32, 232448, "tcgen05", "B200, GB200 (cc 10.0)"),
        Family("sm120", "cuda", 120, 32, 101376, "mma.sync", "RTX 50xx, RTX PRO 6000 (cc 12.0)"),
        Family("cdna2", "hip", "gfx90a", 64, 65536, "v_mfma", "MI210, MI250X (gfx90a)"),
        Family("cdna3", "hip", "gfx942", 64, 65536, "v_mfma", "MI300X, MI300A, MI325X (gfx942)"),
        Family("cdna4", "hip", "gfx950", 64, 163840, "v_mfma", "MI350X, MI355X (gfx950)"),
    )
}

_CUDA_CC = {(8, 0): "sm80", (9, 0): "sm90", (10, 0): "sm100", (12, 0): "sm120"}
_HIP_ARCH = {"gfx90a": "cdna2", "gfx942": "cdna3", "gfx950": "cdna4"}


def family_from_properties(props) -> str | None:
    """Family name from ``torch.cuda.get_device_properties`` output, or None if not in the table.

    On ROCm ``gcnArchName`` may carry feature suffixes (``gfx942:sramecc+:xnack-``)."""
    arch_name = getattr(props, "gcnArchName", None) or ""
    if torch.version.hip is not None or arch_name.startswith("gfx"):
        return _HIP_ARCH.get(arch_name.split(":")[0])
    return _CUDA_CC.get((props.major, props.minor))


def nearest_family(props) -> str:
    """The family whose configuration an unknown device runs (it reports no golden family).

    ROCm: gfx95x -> cdna4, gfx94x -> cdna3, any other gfx -> cdna2 (64 KiB LDS, which every
    CDNA entry fits). CUDA: the CUDA family of the highest compute capability at or below the
    device's whose shared-memory limit the device's opt-in maximum per block reaches (a device
    that does not report it is taken to), e.g. cc 10.3 -> sm100, cc 12.1 with 99 KiB -> sm120,
    cc 9.x -> sm90; else sm80, whose entries fit in 99 KiB (cc 8.6, 8.9; below 8.0 nothing is
    promised). Triton still compiles for the device's own target; only the tiles are taken."""
    arch_name = getattr(props, "gcnArchName", None) or ""
    if torch.version.hip is not None or arch_name.startswith("gfx"):
        gfx = arch_name.split(":")[0]
        if gfx.startswith("gfx95"):
            return "cdna4"
        return "cdna3" if gfx.startswith("gfx94") else "cdna2"
    capability = props.major * 10 + props.minor
    optin = getattr(props, "shared_memory_per_block_optin", None)
    cuda = sorted((f for f in FAMILIES.values() if f.vendor == "cuda"), key=lambda f: -f.arch)
    for fam in cuda:
        if fam.arch <= capability and (optin is None or optin >= fam.shared_mem_bytes):
            return fam.name
    return "sm80"


@cache
def _family_of_index(index: int) -> str | None:
    return family_from_properties(torch.cuda.get_device_properties(index))


@cache
def _config_family_of_index(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return family_from_properties(props) or nearest_family(props)


def family(device: torch.device | str | int | None = None) -> str | None:
    """The family of ``device`` (default: the current CUDA/ROCm device), e.g. ``"sm90"``;
    None when no GPU is present, for a CPU device, or for a device outside the family table.
    ``device`` may be a ``torch.device``, a string such as ``"cuda:1"``, or an index; any
    other type (bools included) is a TypeError, a string that names no device or a negative
    index a ValueError, with or without a GPU."""
    device = _as_device(device)
    if not torch.cuda.is_available():
        return None
    if device is None:
        return _family_of_index(torch.cuda.current_device())
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _family_of_index(index)


def _as_device(device) -> torch.device | None:
    """``family``'s argument as a torch.device (None stays None), checked before anything
    asks whether a GPU is present: a wrong argument is wrong on every machine."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"a device index must be >= 0, got {device}")
        return torch.device("cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError:
            raise ValueError(f"{device!r} names no device (e.g. 'cuda', 'cuda:1')") from None
    raise TypeError(
        f"device must be a torch.device, a str such as 'cuda:1', an int index or None, got "
        f"{type(device).__qualname__}"
    )


def config_family(device: torch.device) -> str:
    """The family whose configuration runs on ``device``: the override's family when
    :data:`OVERRIDE_ENV` is set (:func:`family_override`), else the device's own family (the
    nearest one for unknown devices)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return family_override(index) or _config_family_of_index(index)


# An explicit, opt-in override for evidence runs (never automatic): a newer NVIDIA GPU runs an
# older NVIDIA family's table entries as that family's PTX, which the driver JIT-compiles for
# the GPU in front of it (sm80's mma.sync code, tiles and pipelining on an H200: no TMA, no
# warp specialisation). Hashes made so are provisional evidence for the older family.
OVERRIDE_ENV = "PORTATTN_FAMILY_OVERRIDE"


def family_override(device: torch.device | int | None = None) -> str | None:
    """The family named by ``$PORTATTN_FAMILY_OVERRIDE`` for this CUDA ``device``, or None
    when it is unset, empty, or the device's own family (nothing to override).

    Raises ValueError for a value that cannot run here: not a family, not an NVIDIA family, a
    ROCm build, or a family newer than the device (PTX runs only on its own or a newer
    compute capability)."""
    value = override_setting()
    if not value:
        return None
    index = _device_index(device)
    return _checked_override(value, index)


@cache
def override_setting() -> str:
    """``$PORTATTN_FAMILY_OVERRIDE`` as the process first read it: the override holds for the
    whole process, because Triton's in-process kernel cache does not key on the target (a
    kernel compiled under the override would otherwise run, silently, without it)."""
    return os.environ.get(OVERRIDE_ENV, "").strip()


def _device_index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


def check_override_name() -> str | None:
    """The override's value (None when unset or empty) if it names an NVIDIA family; else
    ValueError, on every device: a misspelt value must not pass silently where the override
    does not apply (CPU tensors, the interpreter), as the docs promise it raises."""
    value = override_setting()
    if value:
        _nvidia_family(value)
    return value or None


def _nvidia_family(value: str) -> Family:
    """The NVIDIA family an override value names (ValueError for any other value)."""
    wanted = FAMILIES.get(value)
    if wanted is None or wanted.vendor != "cuda":
        nvidia = ", ".join(n for n, f in FAMILIES.items() if f.vendor == "cuda")
        raise ValueError(f"{OVERRIDE_ENV}={value!r}: expected an NVIDIA family ({nvidia})")
    return wanted


@cache
def _checked_override(value: str, index: int) -> str | None:
    wanted = _nvidia_family(value)
    if torch.version.hip is not None:
        raise ValueError(
            f"{OVERRIDE_ENV}={value!r}: this is a ROCm build; the override runs "
            "NVIDIA PTX on NVIDIA GPUs only"
        )
    props = torch.cuda.get_device_properties(index)
    capability = props.major * 10 + props.minor
    if capability < int(wanted.arch):
        raise ValueError(
            f"{OVERRIDE_ENV}={value!r}: {props.name} has compute capability "
            f"{props.major}.{props.minor}; {value}'s PTX needs {int(wanted.arch) / 10:.1f} or newer"
        )
    if int(wanted.arch) >= 90 and capability != int(wanted.arch):
        raise ValueError(  # Triton targets sm_90a there: arch-specific PTX (wgmma, TMA)
            f"{OVERRIDE_ENV}={value!r}: {value}'s PTX is arch-specific (sm_{wanted.arch}a) "
            f"and does not run on compute capability {props.major}.{props.minor}"
        )
    return None if _family_of_index(index) == value else value
