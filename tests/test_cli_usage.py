"""The command line's usage names the way it was launched (``portattn`` console script or
``python -m portattn``), and ``compile --help`` says what the command does (issue 39, item 9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from portattn.tools.cli import build_parser, prog_name

ROOT = Path(__file__).resolve().parents[1]


def _help(argv: list[str], cwd: Path) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_prog_name():
    assert prog_name("/venv/bin/portattn") == "portattn"
    assert prog_name("/src/portattn/__main__.py") == "python -m portattn"
    assert prog_name("/usr/bin/pytest") == "python -m portattn"


def test_usage_of_each_launch(tmp_path: Path):
    # The console script: pip writes a file named portattn that calls portattn.tools.cli:main.
    script = tmp_path / "portattn"
    script.write_text("from portattn.tools.cli import main\nraise SystemExit(main())\n")
    assert _help([str(script)], tmp_path).startswith("usage: portattn [-h]")
    assert _help(["-m", "portattn"], ROOT).startswith("usage: python -m portattn [-h]")


def test_compile_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser("portattn").parse_args(["compile", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert text.startswith("usage: portattn compile [-h]")
    assert "see portattn.tools.compilecheck" not in text
    for needed in ("no GPU needed", "forward", "spills", "fingerprint", "Exit 0", "--guarded"):
        assert needed in text


@pytest.mark.parametrize(
    "argv",
    [
        ["golden", "refresh"],
        ["golden", "refresh", "--family", "sm90", "--force"],
        ["golden", "fingerprints", "--update"],
        ["golden", "fingerprints", "--results", "r.json"],
        ["golden", "fingerprints", "--no-compile", "--family", "sm90"],
    ],
)
def test_moved_golden_actions_are_usage_errors(capsys, argv):
    """Recording the golden files, and the compile-key check, moved to the checkout's
    ci/golden_dev (issue 38): the former spelling is a usage error (exit 2, argparse's message),
    having run nothing; ``golden --help`` names the new command."""
    from portattn.tools.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and ("invalid choice: 'refresh'" in err or "unrecognized arguments" in err)


def test_golden_help_names_the_moved_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser("portattn").parse_args(["golden", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "moved out of the package: python -m ci.golden_dev" in text
    assert "{refresh,fingerprints,keycheck}" in text


def test_golden_dev_runs_from_the_checkout():
    """``python -m ci.golden_dev --help`` from the checkout's root: the documented spelling."""
    assert "refresh" in _help(["-m", "ci.golden_dev"], ROOT)
    assert "--update" in _help(["-m", "ci.golden_dev", "fingerprints"], ROOT)
    assert "--no-compile" in _help(["-m", "ci.golden_dev", "keycheck"], ROOT)


def test_golden_fingerprints_help_names_the_key_check(capsys):
    """``golden fingerprints`` is the full compile; its help names the checkout's key check."""
    with pytest.raises(SystemExit) as exit_:
        build_parser("portattn").parse_args(["golden", "fingerprints", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "python -m ci.golden_dev keycheck" in text and "--no-compile" not in text
