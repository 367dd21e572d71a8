"""nox sessions for portattn.

- ``tests``: the CPU suite, in its own virtualenv (kernels run under Triton's interpreter; the
  test harness ``tests/conftest.py`` sets TRITON_INTERPRET=1, nox does not; every family's
  configuration entries run there too, ``tests/test_family_tiles.py``), followed by the
  ahead-of-time compile check of every configuration of every family (compiles, fits, no
  spills, matrix instructions; and the CI subset's borrowed head dims) and the golden
  fingerprint check of that compile (what every configuration of every family compiles to must
  match ``golden/<family>.json``). This is the README's test command, and what ``.ci/run`` runs.
  It pins Triton 3.6, the GPU machine's.
- ``tests_newest``: the same with the newest supported Triton (3.9), whose configuration
  table has its own rows where it must (``portattn.configs._SINCE_TRITON``) and whose
  fingerprints ``golden/`` keeps beside 3.6's; of the family entries under the interpreter it
  runs only those rows.
- ``lint``: ruff check and ruff format --check.
- ``compile``: the full ahead-of-time compile matrix (every family, kernel, head dim, dtype);
  CPU only, no GPU needed.
- ``gpu(family=...)``: the test suite on a GPU of that family, then ``python -m portattn golden
  verify`` (the stored golden hashes, bitwise), in the *current* Python environment (see the
  session's docstring).
- ``golden_refresh(family=...)``: record that family's golden hashes on its GPU (current
  environment too); see docs/golden.md.
- ``bench``: the benchmark on the GPU in front of it (current environment too), written to
  ``docs/bench-h200.{json,md}``, then the chart ``docs/bench-h200.png`` if matplotlib is there;
  see docs/performance.md.

Default (plain ``nox``): lint and tests.
"""

from __future__ import annotations

import os
import re

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
LINT_PATHS = ("portattn", "tests", "noxfile.py")

nox.options.sessions = ["lint", "tests"]


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
    """CPU test suite under Triton's interpreter, then the compile check of every entry of every
    family (and the CI subset's borrowed head dims), then the fingerprints of that compile
    against ``golden/`` (docs/golden.md); Triton 3.6."""
    _cpu_suite(session, TRITON)


@nox.session
def tests_newest(session: nox.Session) -> None:
    """``tests`` with the newest supported Triton (``TRITON_NEWEST``)."""
    _cpu_suite(session, TRITON_NEWEST)


def _cpu_suite(session: nox.Session, triton: str) -> None:
    _install_cpu_stack(session, "[test,transformers]", triton)
    # tests/test_family_tiles.py runs every family's configuration entries under the
    # interpreter: all of them with TRITON, and with a newer Triton only those its table
    # changes (the rows of configs._SINCE_TRITON that the interpreter sees).
    scope = {"PORTATTN_FAMILY_TILES": "all" if triton == TRITON else "versioned"}
    _pytest(session, "-m", "not gpu", *(session.posargs or ["-q"]), env=scope)
    # Every entry of every family compiled once and checked (spills, shared memory / LDS, the
    # family's matrix instruction), its results kept for the fingerprint check below, which
    # then compiles nothing; the CI subset's borrowed head dims (80: the d96 row, Phi-2's; 40
    # and 200: odd multiples of 8 on the d64 and d256 rows, 200 with sm90's own forward tiles,
    # configs._BORROWED_TILES) and its value-head-dim pair (192, 128: MLA, the d256 row with
    # v's own width).
    results = os.path.join(session.create_tmp(), "compile.json")
    session.run("python", "-m", "portattn", "compile", "--json", results)
    session.run("python", "-m", "portattn", "compile", "--subset", "ci", "--head-dim", "80")
    session.run(
        "python", "-m", "portattn", "compile", "--subset", "ci", "--head-dim", "40",
        "--head-dim", "200",
    )  # fmt: skip
    session.run(
        "python", "-m", "portattn", "compile", "--subset", "ci", "--head-dim", "192",
        "--head-dim-v", "128",
    )  # fmt: skip
    # A kernel or configuration change fails here until golden/ is updated on purpose
    # (`python -m portattn golden fingerprints --update`, then a hardware refresh of the
    # families whose output hashes it marks stale). Exit 1: a fingerprint differs; 2: a family
    # has no fingerprints for this Triton version (record them with --update under it; for
    # TRITON the pin must also equal the GPU's Triton, whose output hashes golden/ holds).
    fingerprints = ("python", "-m", "portattn", "golden", "fingerprints")
    # A compile can differ from run to run, so an entry fails only if it differs in every one
    # of up to three passes (a change of the code differs every time). The first pass reads
    # the compile above; the others compile the differing families again, alone. Seen: Triton
    # 3.9's AMD backend, where an entry compiled after others in one process got other machine
    # code (its codegen library keeps state; the compile check now gives every entry a fresh
    # process), and beyond that, rarely, one entry in one run (cdna4 varlen/d32/fp16 decode
    # once in a full run, 2026-12-01; five single compiles gave the recorded code); Triton
    # 3.6's sm100, three d64 forwards in one CI run's full compile (2026-12-02; the family's
    # own compile after it matched all 20 entries).
    differing: set[str] | None = None
    for attempt in range(3):
        if differing is None:
            reuse = ("--results", results)
        else:  # the differing families only, compiled again
            reuse = tuple(
                a for f in sorted({d.split(":")[0] for d in differing}) for a in ("--family", f)
            )
        out = session.run(*fingerprints, *reuse, silent=True, success_codes=[0, 1]) or ""
        print(out)
        found = set()
        for line in out.splitlines():
            match = re.match(r"(\w+): \d+ fingerprint\(s\) differ from .*?: (.*?); if the", line)
            if match:
                found |= {f"{match[1]}:{e.strip()}" for e in match[2].split(",")}
        differing = found if differing is None else differing & found
        if not differing:
            return
        session.warn(f"pass {attempt + 1} under {triton}: still differing {sorted(differing)}")
    session.error(f"fingerprints differ in every pass under {triton}: {sorted(differing)}")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session
def compile(session: nox.Session) -> None:
    """Full ahead-of-time compile matrix for every family (CPU only, no GPU needed)."""
    _install_cpu_stack(session)
    session.run("python", "-m", "portattn", "compile", *session.posargs)


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
    ``python -m portattn golden refresh`` (e.g. ``-- --force`` to overwrite differing hashes).
    """
    _require_family(session, "golden_refresh", family)
    refresh = ("python", "-m", "portattn", "golden", "refresh", "--family", family)
    session.run(*refresh, *session.posargs, external=True)


BENCH_STEM = "docs/bench-h200"


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """``python -m portattn bench`` into ``docs/bench-h200.json`` and ``.md``, then the chart.

    Same environment rule as ``gpu``: the current Python environment (``venv_backend="none"``),
    nothing installed. Extra arguments go to the benchmark (``nox -s bench -- --quick``). The
    chart needs matplotlib, which a GPU machine may lack: ``bench plot`` then exits 3, which
    does not fail the session; render the PNG elsewhere from the JSON with
    ``python -m portattn bench plot --json docs/bench-h200.json --png docs/bench-h200.png``.
    """
    json_path, md_path, png_path = (f"{BENCH_STEM}.{ext}" for ext in ("json", "md", "png"))
    run = ("python", "-m", "portattn", "bench")
    session.run(*run, "--json", json_path, "--markdown", md_path, *session.posargs, external=True)
    plot = (*run, "plot", "--json", json_path, "--png", png_path)
    session.run(*plot, external=True, success_codes=[0, 3])
