"""Launch a planned kernel as an older NVIDIA family's PTX, JIT-compiled by the driver.

This is the execution half of the family override (``$PORTATTN_FAMILY_OVERRIDE``, see
:func:`portattn.families.family_override`): an H200 runs the sm80 table entries through the
code path an A100 would take. Triton compiles the kernel for the older target
(``knobs.runtime.override_arch``: sm80's TTGIR, mma.sync, its pipelining), and instead of the
cubin, which only loads on that architecture, the CUDA driver is handed the PTX
(``cuModuleLoadData`` takes PTX text) and compiles it for the GPU in front of it. The machine
code therefore differs from a real sm80 GPU's (another ptxas, another SASS), which is why the
hashes made this way are provisional (docs/golden.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from portattn.kernels.descriptors import with_descriptors

if TYPE_CHECKING:
    from portattn.kernels.plan import KernelLaunch


def launch_through_ptx(launch: KernelLaunch, arch: int) -> None:
    """Compile ``launch`` for ``sm{arch}``, load its PTX on the current GPU, launch it."""
    from triton import knobs

    args = with_descriptors(launch.args, launch.descriptors)
    with knobs.runtime.scope():
        knobs.runtime.override_arch = f"sm{arch}"
        compiled = launch.kernel.warmup(*args, grid=launch.grid, **launch.params)
        _load_as_ptx(compiled, arch)
        launch.kernel[launch.grid](*args, **launch.params)


def _load_as_ptx(compiled, arch: int) -> None:
    """Make Triton's lazy module load read the PTX instead of the cubin (before it loads)."""
    if getattr(compiled, "_portattn_ptx_arch", None) == arch:
        return
    # metadata.arch is the option the compile ran with ("sm80"); metadata.target stays the GPU's
    if compiled.module is not None or getattr(compiled.metadata, "arch", None) != f"sm{arch}":
        raise RuntimeError(
            f"{compiled.name}: this process already loaded the kernel for another target; "
            "the family override must be set before the process's first launch"
        )
    compiled.kernel = family_ptx(compiled, arch).encode() + b"\0"  # cuModuleLoadData: PTX text
    compiled._portattn_ptx_arch = arch


def family_ptx(compiled, arch: int) -> str:
    """The PTX a compile for ``sm{arch}`` makes (``.target sm_{arch}``), from the kernel's
    LLVM IR. ``override_arch`` makes Triton lower the kernel for that architecture down to the
    LLVM IR, but its last two stages run for the GPU in front of it (sm_90a PTX, then an sm_90a
    cubin); Triton's own PTX stage, run by a backend of the older target, gives exactly the PTX
    of a compile for that target (tests/test_family_override.py compares them)."""
    from triton._C.libtriton import llvm
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend, CUDAOptions

    # Triton initialises LLVM's targets in its LLVM-IR stage, which a kernel taken from the
    # on-disk cache never ran in this process (translating without them segfaults).
    llvm.init_targets()
    backend = CUDABackend(GPUTarget("cuda", arch, 32))
    metadata = compiled.metadata._asdict()
    options = backend.parse_options(
        {k: _hashable(metadata[k]) for k in CUDAOptions.__dataclass_fields__ if k in metadata}
    )
    return backend.make_ptx(compiled.asm["llir"], {}, options, arch)


def _hashable(value):
    """JSON metadata holds lists where the options hold tuples (the backend caches on them)."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value
