"""The built wheel carries the golden files (issue 39, item 5), and an installed portattn finds
them: ``golden verify`` reads the checkout's ``golden/`` when run from a checkout, else the copy
shipped as the package ``portattn.golden_data``.

The wheel is built offline from a copy of the files a build reads (``pip wheel --no-deps
--no-build-isolation``, with the setuptools of this environment: the ``test`` extra brings it),
so the checkout gets no ``build/`` or ``*.egg-info`` of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = sorted(p.name for p in (ROOT / "golden").glob("*.json"))


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_package_list_names_every_package_folder():
    """pyproject.toml lists the packages (one of them is golden/, mapped): a new folder of
    portattn/ with an __init__.py that the list lacks would be missing from the wheel."""
    setuptools_cfg = _pyproject()["tool"]["setuptools"]
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "portattn").rglob("__init__.py")
    }
    assert set(setuptools_cfg["packages"]) == folders | {"portattn.golden_data"}
    assert setuptools_cfg["package-dir"] == {"portattn.golden_data": "golden"}
    assert setuptools_cfg["package-data"] == {"portattn.golden_data": ["*.json"]}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")  # the build backend (the `test` extra installs it)
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    for name in ("portattn", "golden"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*cmd, "--no-index", "-q", "-w", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (built,) = out.glob("portattn-*.whl")
    return built


def test_wheel_holds_the_golden_files(wheel: Path):
    assert len(GOLDEN) == 7
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        shipped = sorted(n.split("/")[-1] for n in names if n.startswith("portattn/golden_data/"))
        assert shipped == GOLDEN
        for name in GOLDEN:  # byte for byte the checkout's
            data = zf.read(f"portattn/golden_data/{name}")
            assert data == (ROOT / "golden" / name).read_bytes()
        assert "portattn/tools/golden/verify.py" in names
        assert not any(n.startswith("ci/") for n in names)  # the recording stays in a checkout
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "portattn = portattn.tools.cli:main" in zf.read(entry_points).decode()


def test_installed_package_verifies_from_its_own_golden_files(wheel: Path, tmp_path: Path):
    """The wheel unpacked as a site-packages folder, no checkout around it: the default golden
    directory is the shipped copy, and verify reads it (a family without output hashes: exit 2
    with its one line, before anything runs)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    script = (
        "import json, sys\n"
        "from portattn.tools.golden.verify import default_golden_dir, run_verify\n"
        "d = default_golden_dir()\n"
        "lines = []\n"
        "code = run_verify('cdna3', 'cpu', d, out=lines.append)\n"
        "print(json.dumps({'dir': str(d), 'write': str(default_golden_dir(write=True)),\n"
        "                  'code': code, 'lines': lines}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PORTATTN_GOLDEN_DIR"}
    env["PYTHONPATH"] = str(site)
    env["TRITON_INTERPRET"] = "1"
    run = tmp_path / "elsewhere"
    run.mkdir()
    cmd = [sys.executable, "-c", script]
    proc = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(got["dir"]) == site / "portattn" / "golden_data"
    assert Path(got["write"]) == run / "golden"  # a refresh never writes into the package
    assert got["code"] == 2
    assert len(got["lines"]) == 1 and "no output hashes recorded" in got["lines"][0]
    assert str(site / "portattn" / "golden_data" / "cdna3.json") in got["lines"][0]


def test_missing_golden_dir_names_the_option(tmp_path: Path):
    from portattn.tools.golden.verify import run_verify

    lines: list[str] = []
    assert run_verify("sm90", "cpu", tmp_path / "none", out=lines.append) == 2
    assert len(lines) == 1 and "does not exist" in lines[0] and "--golden-dir" in lines[0]
