"""``python -m portattn compile`` prints its progress and table, nothing else (issue 39, item
6): under Triton 3.9 each worker process used to end with about 50 lines of nanobind's
"leaked ... instances" report (portattn.tools.compilecheck.quiet_exit). Runs one small entry
with the installed Triton; the report is 3.9's, so `nox -s tests_newest` runs this too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton_version

ROOT = Path(__file__).resolve().parents[1]


def test_compile_output_has_no_nanobind_report():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = ["compile", "--family", "sm90", "--kernel", "varlen", "--head-dim", "64", "-j", "1"]
    argv += ["--dtype", "bf16"]
    proc = subprocess.run(
        [sys.executable, "-m", "portattn", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "[  1/1] sm90  varlen/d64/bf16        ok" in proc.stdout
    # the five of golden/, three repair passes and the four of the key chunk (design §3.1)
    assert "12 kernels, 0 failed" in proc.stdout
    assert "nanobind" not in output and "leaked" not in output, output
