"""Host checks that need a device-to-host copy, run at the last moment before a launch.

The eager forward checks the values of ``cu_seqlens`` on the host (design §1 in docs/design.md:
bad input raises before any launch). Reading them waits for the GPU to finish the work queued
before, and the GPU then idles until the kernel is launched. Run as a plain call before
``kernel[grid](...)``, that idle time includes Triton's own launch work in Python (argument
binding and specialisation, the cache lookup, launch metadata, the descriptor scratch): on the
H200 the eager forward's time exceeded its kernel's by 150-250 us (perf-notes row 57).
``checks_at_launch`` runs the check from Triton's launch-enter hook instead, which the driver's
launcher calls right before ``cuLaunchKernel`` / ``hipModuleLaunchKernel``; an exception there
aborts the launch, so the errors still come before any launch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from portattn.configs import interpreter_active

# Off only for measurements (perf-notes row 57): then the check runs before the launch call.
CHECK_IN_LAUNCH_HOOK = True


def _launch_hooks():
    """Triton's launch-enter hook chain (``triton.knobs``, Triton >= 3.4), or None."""
    try:
        from triton import knobs
    except ImportError:
        return None
    chain = getattr(knobs.runtime, "launch_enter_hook", None)
    return chain if hasattr(chain, "add") and hasattr(chain, "remove") else None


@contextlib.contextmanager
def checks_at_launch(check: Callable[[], object] | None) -> Iterator[None]:
    """Run ``check`` (it may raise) right before the first kernel launched in this block by
    this thread, from Triton's launch-enter hook; if nothing was launched, at the end of the
    block. Under the CPU interpreter (which calls no hook), without a hook chain, or with
    ``CHECK_IN_LAUNCH_HOOK`` off, ``check`` runs first."""
    if check is None:
        yield
        return
    chain = _launch_hooks()
    if chain is None or interpreter_active() or not CHECK_IN_LAUNCH_HOOK:
        check()
        yield
        return
    owner = threading.get_ident()
    done = False

    def hook(_metadata) -> None:
        nonlocal done
        if not done and threading.get_ident() == owner:  # another thread's launch: not ours
            done = True
            check()

    chain.add(hook)
    try:
        yield
    finally:
        chain.remove(hook)
    if not done:
        check()
