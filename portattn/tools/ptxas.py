"""Blackwell's ptxas run without address-space randomisation, for reproducible fingerprints.

For compute capability >= 10.0 Triton assembles with its bundled ``ptxas-blackwell`` (CUDA
12.9 in Triton 3.6, 13.4 in 3.9). Under 3.6 that ptxas allocates some registers in an order
that follows its address-space layout: the same PTX of sm100's varlen d64 bf16 forward gave two
cubins in separate processes, about half the runs each, whose SASS differs only in the names
of two uniform registers (UR40 / UR42 swapped, the same instructions in the same order). The
compile check therefore runs that ptxas through a wrapper that sets the Linux personality
``ADDR_NO_RANDOMIZE`` (as ``setarch -R``) and then execs it: every run gives the same cubin.
Older targets keep the plain invocation, so their fingerprints are what they were. A GPU's JIT
runs ptxas normally; the two cubins compute the same arithmetic.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from portattn.families import Family

DETERMINISTIC_PTXAS_FROM_ARCH = 100  # CUDA compute capability (x10) from which it applies
ADDR_NO_RANDOMIZE = 0x0040000  # <linux/personality.h>
NO_ASLR_WRAPPER = """#!{python}
# ptxas without address-space randomisation (portattn.tools.ptxas; see there).
import ctypes, os, sys
try:
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current == -1 or libc.personality(current | {flag:#x}) == -1:
        raise OSError(ctypes.get_errno(), "personality")
except (AttributeError, OSError) as exc:
    print(f"portattn: ptxas runs with a randomised address space ({{exc}})", file=sys.stderr)
os.execv({ptxas!r}, [{ptxas!r}, *sys.argv[1:]])
"""


def write_wrapper(path: Path, ptxas: str) -> Path:
    """Write the wrapper script that runs ``ptxas`` without address-space randomisation."""
    text = NO_ASLR_WRAPPER.format(python=sys.executable, ptxas=ptxas, flag=ADDR_NO_RANDOMIZE)
    path.write_text(text)
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def deterministic_ptxas(family: Family) -> Iterator[None]:
    """For a Blackwell target, Triton's ptxas-blackwell runs through the wrapper (written into
    Triton's cache directory, which ``compilecheck.pinned_knobs`` makes per check); nothing
    changes for other targets."""
    if family.vendor != "cuda" or family.arch < DETERMINISTIC_PTXAS_FROM_ARCH:
        yield
        return
    from triton import knobs

    real = knobs.nvidia.ptxas_blackwell.path  # the bundled one (pinned_knobs sets None)
    wrapper = Path(knobs.cache.dir) / "ptxas-blackwell-no-aslr"
    if not wrapper.exists():
        write_wrapper(wrapper, real)
    with knobs.nvidia.scope():
        knobs.nvidia.ptxas_blackwell = str(wrapper)
        yield
