"""How the compile check's worker processes end: quietly.

Triton 3.9's Python bindings (nanobind) report, at interpreter shutdown, every binding object
and type still alive then ("nanobind: leaked 4 instances!", then one line per type and function:
about 50 lines per worker). A compile worker ends after one entry, so ``python -m portattn
compile`` printed them between its progress lines, where a reader takes them for a crash. They
say nothing about the compile: the objects are Triton's module-level caches, freed by the exit
anyway. So a worker, once multiprocessing has sent its result and run its own exit handlers,
flushes its output and leaves with ``os._exit``, before the interpreter's teardown prints them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys


def _leave_now() -> None:
    """At a worker's exit: flush what it printed, then exit without the interpreter teardown.
    Status 0: the pool reads a worker's results from its pipe, never its exit status, and a
    worker that dies before sending a result (a signal) runs no exit handler."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced
            stream.flush()
    os._exit(0)


def quiet_exit() -> None:
    """A ``ProcessPoolExecutor`` initializer: the worker's interpreter exits without its
    teardown. Registered last, the handler runs first among the ``atexit`` handlers, after
    the worker loop has returned (its results are already written to the parent's pipe)."""
    atexit.register(_leave_now)
