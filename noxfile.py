"""nox sessions for portattn.

- ``tests``: the CPU suite, in its own virtualenv, on every core (pytest-xdist; kernels run
  under Triton's interpreter: the test harness ``tests/conftest.py`` sets TRITON_INTERPRET=1,
  nox does not; every family's configuration entries run there too,
  ``tests/test_family_tiles.py``), followed by the compile-key check of every guarded entry of
  every family against ``golden/<family>.json`` (``python -m ci.golden_dev keycheck``, from the
  checkout's root: entries whose compile inputs are unchanged are not compiled; the others are
  compiled and checked, and fail until ``golden/`` is updated). This is the README's test
  command with ``tests_newest``, and what ``.ci/run`` runs. It pins Triton 3.6, the GPU
  machine's.
- ``tests_newest``: with the newest supported Triton (3.9), whose configuration table has its
  own rows where it must (``portattn.configs.rows.SINCE_TRITON``) and whose fingerprints and keys
  ``golden/`` keeps beside 3.6's: the tests marked ``triton_version`` (of the family entries
  under the interpreter only that version's own rows), then its key check.
- ``quick``: for iteration, a few minutes: lint, the key check naming what changed without
  compiling (``python -m ci.golden_dev keycheck --no-compile``), and a smoke subset of the tests
  (or those named after ``--``).
- ``lint``: ruff check and ruff format --check.
- ``compile``: the full ahead-of-time compile of every guarded entry, checked; CPU only.
- ``fingerprints``: that compile under both Tritons, recorded into ``golden/`` with the compile
  keys (``python -m ci.golden_dev fingerprints --update``; run it after any change under
  ``portattn/kernels/`` or to ``portattn/configs/``).
- ``gpu(family=...)``: the test suite on a GPU of that family, then ``python -m portattn golden
  verify`` (the stored golden hashes, bitwise), in the *current* Python environment (see the
  session's docstring).
- ``golden_refresh(family=...)``: record that family's golden hashes on its GPU (current
  environment too; ``python -m ci.golden_dev refresh``); see docs/golden.md.
- ``bench``: the benchmark on the GPU in front of it (current environment too), written to
  ``docs/bench-h200.{json,md}``, then the chart ``docs/bench-h200.png`` if matplotlib is there;
  see docs/performance.md.

Default (plain ``nox``): lint and tests.
"""

from __future__ import annotations

import contextlib
import os
import time

import nox

# The CPU CI and the GPU toolchain use the same Triton (TRITON); TRITON_NEWEST is the newest one
# pyproject.toml allows (`triton>=3.6,<3.10`), checked by `tests_newest`. torch is installed
# first and alone: a bare torch requirement can pull a multi-GB CUDA build, while this pin
# resolves to the CPU build the CI machine keeps on local disk (elsewhere add `--index-url
# https://download.pytorch.org/whl/cpu` as PIP_EXTRA_INDEX_URL).
TORCH_CPU = "torch==2.13.0"
TRITON = "triton==3.6.0"
TRITON_NEWEST = "triton==3.9.0"
FAMILIES = ("sm80", "sm90", "sm100", "sm120", "cdna2", "cdna3", "cdna4")
# pytest-xdist workers for the CPU suite: one per core (the CI machine has two). Each test seeds
# its own generators, so a test's inputs do not depend on the worker that runs it.
CPU_WORKERS = "auto"
LINT_PATHS = ("portattn", "tests", "benchmarks", "ci", "noxfile.py")

nox.options.sessions = ["lint", "tests"]
# A failed session ends the run: `tests` failing on a changed compile key has already compiled
# the changed entries under Triton 3.6 (about 13 minutes when every entry changed); compiling
# them again under 3.9 would only repeat the verdict and keep a red CI going past 45 minutes.
nox.options.stop_on_first_error = True


# numpy's AVX-512 loops (SVML's exp2, tanh, ... on AVX512_SKX) round some float32 results
# differently from the loops every x86-64 CPU has, and Triton's interpreter computes the kernels'
# exponentials with numpy: the interpreter's bits would depend on the CI machine's CPU
# (tests/test_interpreter_bits.py records them). The CPU sessions turn those loops off (numpy
# < 2.4's names; X86_V4 is numpy 2.4's, which numpy 2.3 ignores: the pin is < 2.4).
NUMPY_SAME_BITS = {
    "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX "
    "AVX512_CNL AVX512_ICL AVX512_SPR X86_V4"
}


def _install_cpu_stack(session: nox.Session, extras: str = "", triton: str = TRITON) -> None:
    session.install(TORCH_CPU)
    session.install(triton, "-e", f".{extras}")


def _pytest(
    session: nox.Session, *args: str, external: bool = False, env: dict | None = None
) -> None:
    """Run pytest; exit code 5 ("no tests collected") is an error with a clear message."""
    try:
        session.run("python", "-m", "pytest", *args, external=external, env=env)
    except nox.command.CommandFailed as exc:
        code = getattr(exc, "return_code", None)
        if code == 5 or (code is None and "code 5" in str(exc)):
            session.error(
                "pytest collected no tests (exit code 5): tests/ is missing or every test was "
                "deselected; the suite must not be empty, so this counts as a failure"
            )
        raise


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite under Triton's interpreter (every family's entries included), in
    parallel, then the compile-key check of every guarded entry of every family against
    ``golden/`` (compiles only the entries whose key changed; docs/golden.md); Triton 3.6."""
    _cpu_suite(session, TRITON, ["-m", "not gpu"])


@nox.session
def tests_newest(session: nox.Session) -> None:
    """With the newest supported Triton (``TRITON_NEWEST``): the tests that can differ by
    Triton version (marked ``triton_version``: compiles, keys, the version's table rows,
    Triton's APIs, and tests/test_interpreter_bits.py, which shows the interpreter's kernel
    arithmetic unchanged, so the rest of the suite would only repeat itself), then the key
    check of this version's fingerprints. ``nox -s tests_newest -- -m "not gpu"``: all."""
    _cpu_suite(session, TRITON_NEWEST, ["-m", "triton_version and not gpu"])


def _cpu_suite(session: nox.Session, triton: str, selection: list[str]) -> None:
    phases = _Phases(session, triton)
    with phases("install"):
        _install_cpu_stack(session, "[test,transformers]", triton)
    # tests/test_family_tiles.py runs every family's configuration entries under the
    # interpreter: all of them with TRITON, and with a newer Triton only those its table
    # changes (the rows of configs.rows.SINCE_TRITON that the interpreter sees).
    scope = {"PORTATTN_FAMILY_TILES": "all" if triton == TRITON else "versioned", **NUMPY_SAME_BITS}
    with phases("pytest"):
        args = session.posargs or [*selection, "-q", "-n", CPU_WORKERS, "--durations=20"]
        _pytest(session, *args, env=scope)
    # Every guarded entry's compile key against golden/: unchanged keys are the recorded
    # machine code, checked when it was recorded, and are not compiled; entries whose key
    # changed are compiled and checked, and fail until `ci.golden_dev fingerprints --update`.
    # `-m ci.golden_dev` finds ci/ in the session's working directory, the checkout's root.
    with phases("key check + compiles"):
        session.run("python", "-m", "ci.golden_dev", "keycheck")
    phases.report()


@nox.session
def quick(session: nox.Session) -> None:
    """Iteration, a few minutes: lint, the key check without compiling (which entries'
    machine code a change may move), and a smoke subset of the CPU suite (or the tests named:
    ``nox -s quick -- tests/test_kvcache.py``). Not a substitute for ``.ci/run`` before you stop.
    """
    phases = _Phases(session, TRITON)
    with phases("install"):
        _install_cpu_stack(session, "[test,transformers]", TRITON)
    with phases("lint"):
        session.run("ruff", "check", *LINT_PATHS)
        session.run("ruff", "format", "--check", *LINT_PATHS)
    with phases("key check"):
        key_check = ("python", "-m", "ci.golden_dev", "keycheck", "--no-compile")
        session.run(*key_check, success_codes=[0, 1])
    with phases("pytest"):
        _pytest(
            session, *(session.posargs or QUICK_TESTS), "-q", "-n", CPU_WORKERS, env=NUMPY_SAME_BITS
        )
    phases.report()


# The quick session's smoke subset: the public entry points and errors, both kernels against
# float64 on small packs, the interpreter's recorded bits, the key check's logic.
QUICK_TESTS = (
    "tests/test_imports.py",
    "tests/test_validation.py",
    "tests/test_interpreter_bits.py",
    "tests/test_compile_keys.py",
    "tests/test_ops.py",
    "tests/test_flash_compat.py",
)


class _Phases:
    """Wall time of a session's phases, printed as a table at its end and appended to
    ``$PORTATTN_CI_TIMES`` (one ``session<TAB>phase<TAB>seconds`` line each) for .ci/run."""

    def __init__(self, session: nox.Session, triton: str) -> None:
        self.session, self.name = session, f"{session.name} ({triton})"
        self.times: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.times.append((phase, time.monotonic() - start))

    def report(self) -> None:
        lines = [f"{phase:24s} {seconds:7.0f} s" for phase, seconds in self.times]
        total = sum(seconds for _, seconds in self.times)
        self.session.log(
            f"phases of {self.name}:\n" + "\n".join(lines) + f"\n{'total':24s} {total:7.0f} s"
        )
        path = os.environ.get("PORTATTN_CI_TIMES")
        if path:
            with open(path, "a") as f:
                f.writelines(
                    f"{self.name}\t{phase}\t{seconds:.0f}\n" for phase, seconds in self.times
                )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session
def compile(session: nox.Session) -> None:
    """The full ahead-of-time compile of every guarded entry of every family, checked (CPU only,
    no GPU needed); ``nox -s compile -- --family sm90 --kernel varlen`` for a part of the table."""
    _install_cpu_stack(session)
    session.run("python", "-m", "portattn", "compile", *(session.posargs or ["--guarded"]))


@nox.session
@nox.parametrize("triton", [TRITON, TRITON_NEWEST])
def fingerprints(session: nox.Session, triton: str) -> None:
    """Record golden/'s fingerprints and compile keys under each checked Triton: the full
    compile, ``python -m ci.golden_dev fingerprints --update``. Run it after any change under
    ``portattn/kernels/`` or to ``portattn/configs/`` (docs/golden.md); 13 minutes under
    Triton 3.6 and about 20 under 3.9 on two cores."""
    _install_cpu_stack(session, triton=triton)
    session.run("python", "-m", "ci.golden_dev", "fingerprints", "--update", *session.posargs)


_PROBE = (  # the family the GPU runs: its own, or the one $PORTATTN_FAMILY_OVERRIDE names
    "import torch, portattn; from portattn.families import family_override; "
    "gpu = torch.cuda.is_available(); "
    "print((family_override() if gpu else None) or portattn.family(), "
    "torch.cuda.get_device_name() if gpu else 'no GPU', sep='|')"
)


@nox.session(venv_backend="none")
@nox.parametrize("family", FAMILIES)
def gpu(session: nox.Session, family: str) -> None:
    """The test suite on a GPU of ``family`` (all tests, GPU-only ones included), then the
    golden hashes (``python -m portattn golden verify --family <family>``).

    Runs in the current Python environment (``venv_backend="none"``): GPU stacks (the vendor's
    torch build and its Triton: CUDA, or ROCm with pytorch-triton-rocm) are preinstalled per
    machine and must not be replaced by a fresh install, and GPU machines may have no network.
    The ``python`` on PATH must be that environment's, with pytest and hypothesis installed.
    portattn is imported from this checkout (pytest's ``pythonpath = ["."]``); no install needed.
    """
    _require_family(session, "gpu", family)
    _pytest(session, *(session.posargs or ["-q"]), external=True)
    # Then the stored golden hashes, bitwise, on this GPU (docs/golden.md). Exit 2 (no hashes
    # recorded for this family / Triton version, or stale ones) fails the session as well.
    session.run("python", "-m", "portattn", "golden", "verify", "--family", family, external=True)


def _require_family(session: nox.Session, name: str, family: str) -> None:
    """Fail the session unless the GPU in front of it belongs to ``family``."""
    probe = session.run("python", "-c", _PROBE, external=True, silent=True)
    found, device = probe.strip().splitlines()[-1].split("|", 1)
    if found != family:
        session.error(
            f"{name}(family={family!r}): this machine has {device} (family {found}), not a "
            f"{family} GPU; run the session of the family in front of you"
        )
    session.log(f"family {found}: {device}")


@nox.session(venv_backend="none")
@nox.parametrize("family", FAMILIES)
def golden_refresh(session: nox.Session, family: str) -> None:
    """Record the golden output hashes of ``family`` on its GPU into ``golden/<family>.json``.

    Same environment rule as ``gpu``: the current Python environment (``venv_backend="none"``),
    nothing installed. Runs every canonical case (twice, to check run-to-run determinism) and
    merges the hashes into the file under a lock; extra arguments go to
    ``python -m ci.golden_dev refresh`` (e.g. ``-- --force`` to overwrite differing hashes).
    """
    _require_family(session, "golden_refresh", family)
    refresh = ("python", "-m", "ci.golden_dev", "refresh", "--family", family)
    session.run(*refresh, *session.posargs, external=True)


BENCH_STEM = "docs/bench-h200"


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """``python benchmarks/bench.py`` into ``docs/bench-h200.json`` and ``.md``, then the chart.

    Same environment rule as ``gpu``: the current Python environment (``venv_backend="none"``),
    nothing installed. Extra arguments go to the benchmark (``nox -s bench -- --quick``). The
    chart needs matplotlib (the ``bench`` extra), which a GPU machine may lack: ``plot`` then
    exits 3, which does not fail the session; render the PNG elsewhere from the JSON with
    ``python benchmarks/bench.py plot --json docs/bench-h200.json --png docs/bench-h200.png``.
    """
    json_path, md_path, png_path = (f"{BENCH_STEM}.{ext}" for ext in ("json", "md", "png"))
    run = ("python", "benchmarks/bench.py")
    session.run(*run, "--json", json_path, "--markdown", md_path, *session.posargs, external=True)
    plot = (*run, "plot", "--json", json_path, "--png", png_path)
    session.run(*plot, external=True, success_codes=[0, 3])
