"""Compile keys: one content key per compiled kernel of every guarded entry, computed without
compiling, so that CI compiles only what changed (docs/golden.md, "Fingerprints guard the
goldens": what a key hashes, and why no path or process history enters it).

A key hashes the Triton installation and backend, the kernel's source as Triton's JIT hashes it
(with its specialised signature and constexprs: ``portattn.tools.compile_inputs``, as the compile
check compiles it), the launch options with the pinned options and knobs, the family's target and
limits, and the source of :mod:`portattn.tools.compile_artifacts` (the checks and the
fingerprint's definition): an unchanged key also means "passed the checks it passes today". A
stage of several launches hashes its launches in order. :func:`keyed_records` attaches the keys
to a compile's records, for ``fingerprints --update`` to record them.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from portattn.families import FAMILIES, Family
from portattn.tools import compile_artifacts
from portattn.tools.compile_inputs import (
    PINNED_KNOBS,
    compile_source,
    guarded_entries,
    pinned_knobs,
)
from portattn.tools.compile_launches import (
    GUARDED_STAGES,
    Entry,
    Launch,
    compiler_env,
    entry_stages,
    record_launches,
)

CHECKOUT = Path(__file__).resolve().parents[2]  # ci/golden_dev/ -> the checkout
# Bump when what goes into a key changes (every key then changes, every entry compiles once).
KEY_VERSION = 1


@functools.cache
def toolchain_identity() -> str:
    """SHA-256 of Triton's own cache key of the installation (version, compiler, language and
    ``libtriton``): another Triton, or another build of one, changes every key."""
    from triton.runtime.cache import triton_key

    return hashlib.sha256(triton_key().encode()).hexdigest()


@functools.cache
def checks_identity() -> str:
    """SHA-256 of the source of the checks and the fingerprint's definition."""
    return hashlib.sha256(inspect.getsource(compile_artifacts).encode()).hexdigest()


@functools.cache
def _backend(family_name: str) -> tuple[Any, str]:
    from triton.compiler.compiler import make_backend

    backend = make_backend(FAMILIES[family_name].target())
    return backend, backend.hash()


def launch_inputs(launch: Launch, family: Family) -> dict[str, Any]:
    """What one launch's machine code (and its check) is a function of, as plain data."""
    backend, backend_hash = _backend(family.name)
    src, options = compile_source(launch, backend)
    return {
        "key_version": KEY_VERSION,
        "triton": toolchain_identity(),
        "backend": backend_hash,
        "family": [family.vendor, family.arch, family.warp_size, family.shared_mem_bytes],
        "matrix_instruction": family.matrix_instruction,
        "checks": checks_identity(),
        "source": src.hash(),
        "options": sorted((k, repr(v)) for k, v in options.items()),
        "knobs": repr(sorted((g, sorted(s.items())) for g, s in PINNED_KNOBS.items())),
    }


def stage_key(launches: Iterable[Launch], family: Family) -> str:
    """The key of one stage: SHA-256 of its launches' inputs, in launch order (call inside
    :func:`pinned_knobs`, as the compile does)."""
    inputs = []
    for launch in launches:
        _forget_jit_hashes()
        inputs.append(launch_inputs(launch, family))
    blob = json.dumps(inputs, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _forget_jit_hashes() -> None:
    """Clear the hash every jit function of ``portattn.kernels`` caches, so that a kernel's
    source hash is the one a fresh process computes, whatever this process hashed before.
    Triton 3.6 to 3.8 merge a callee's constexpr globals into its caller's hash only when the
    callee was hashed before (``DependenciesFinder._update_hash`` reads them before hashing
    it; 3.9 hashes it first): sm90's d128 Gluon kernels hashed differently in a process that
    had hashed other entries first."""
    from triton.runtime.jit import JITCallable

    for name, module in list(sys.modules.items()):
        if name.startswith("portattn.kernels") and module is not None:
            for value in vars(module).values():
                if isinstance(value, JITCallable):
                    value.hash = None
                    value.used_global_vals = {}


def entry_keys(entry: Entry) -> dict[str, str]:
    """stage -> key of ``entry`` (its launches recorded by the real planners, not compiled)."""
    import tempfile

    family = FAMILIES[entry.family]
    cfg = entry.config()
    launches = record_launches(entry, cfg)
    stages = entry_stages(cfg, GUARDED_STAGES)
    with tempfile.TemporaryDirectory(prefix="portattn-key-") as cache_dir, pinned_knobs(cache_dir):
        return {stage: stage_key(launches[stage], family) for stage in stages}


def family_keys(family: str) -> dict[str, dict[str, str]]:
    """entry label -> stage -> key, for every guarded entry of ``family`` (none for a family
    the table does not have). Needs Triton's compiler (not the interpreter): under
    ``TRITON_INTERPRET=1`` it runs in a child process."""
    if family not in FAMILIES:
        return {}
    return in_compiler_process(_family_keys, family)


def _family_keys(family: str) -> dict[str, dict[str, str]]:
    return {entry.label: entry_keys(entry) for entry in guarded_entries(family)}


def in_compiler_process(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)``, which needs Triton's compiler: here, or, when this process runs Triton's
    interpreter (``TRITON_INTERPRET=1``, as the test harness sets it), in a child process
    without it. ``func`` is a module-level function; its arguments and result are JSON."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return func(*args)
    import subprocess
    import tempfile

    code = (
        "import importlib, json, pathlib, sys; module, name, args, path = sys.argv[1:]; "
        "func = getattr(importlib.import_module(module), name); "
        "pathlib.Path(path).write_text(json.dumps(func(*json.loads(args))))"
    )
    env = compiler_env()  # portattn's checkout first on PYTHONPATH, then this one (for ci/)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(CHECKOUT)])
    with tempfile.TemporaryDirectory(prefix="portattn-child-") as tmp:
        path = os.path.join(tmp, "result.json")
        argv = [func.__module__, func.__name__, json.dumps(args), path]
        cmd = [sys.executable, "-c", code, *argv]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode or not os.path.exists(path):
            raise RuntimeError(
                f"{func.__name__} child failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        with open(path) as f:
            return json.load(f)


def keyed_records(family: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The compile records of every guarded entry of ``family`` (``golden fingerprints``' full
    compile, each record with its fingerprint and checks), each with its kernel's compile key
    (``"key"``) attached: what ``fingerprints --update`` records."""
    from portattn.tools.golden.fingerprints import compile_records

    records = compile_records(family)
    keys = family_keys(family)
    for label, stages in records.items():
        for stage, record in stages.items():
            record["key"] = keys.get(label, {}).get(stage)
    return records
