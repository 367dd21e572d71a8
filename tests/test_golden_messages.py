"""What ``golden verify`` tells a user for whom nothing can be compared (issue 39, item 2): a GPU
of a family whose hashes exist for another Triton than the installed one, or for none."""

from __future__ import annotations

from pathlib import Path

from portattn.tools.golden.verify import run_verify

ROOT = Path(__file__).resolve().parent.parent


def _verify(family: str, toolchain: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = run_verify(family, "cpu", ROOT / "golden", out=lines.append, toolchain=toolchain)
    return code, lines


def test_other_triton_than_the_recorded_one():
    """sm90's hashes are Triton 3.6.0's: under 3.9 verify compares nothing (exit 2, one line)
    and says which Triton has them, and both ways on."""
    code, lines = _verify("sm90", "triton-3.9.0")
    assert code == 2 and len(lines) == 1
    line = lines[0]
    assert line.startswith("no output hashes recorded for triton-3.9.0 in ")
    assert "sm90's hashes exist for Triton 3.6.0 only" in line
    assert "triton==3.6.0" in line
    assert "golden_refresh(family='sm90')" in line
    assert "python -m ci.golden_dev refresh --family sm90" in line


def test_family_without_any_hashes():
    code, lines = _verify("cdna3", "triton-3.6.0")
    assert code == 2 and len(lines) == 1
    assert "it holds compile fingerprints only" in lines[0]
    assert "no Triton's hashes exist for cdna3 yet" in lines[0]
    assert "golden_refresh(family='cdna3')" in lines[0]


def test_readme_quotes_the_messages():
    """README.md quotes both lines (an MI300's first run, another Triton): the quoted parts are
    the real messages' text."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    _, (other,) = _verify("sm90", "triton-3.9.0")
    _, (first,) = _verify("cdna3", "triton-3.6.0")
    for quoted, line in [
        ("nothing compared: sm90's hashes exist for Triton 3.6.0 only,", other),
        (
            "Verify in an environment with triton==3.6.0, or record triton-3.9.0's hashes on sm90 "
            "hardware",
            other,
        ),
        ("(recorded toolchains: triton-3.6.0);", other),
        ("(it holds compile fingerprints only;", first),
        (
            "nothing compared: record them on cdna3 hardware: nox -s "
            "\"golden_refresh(family='cdna3')\"",
            first,
        ),
    ]:
        assert quoted in line, (quoted, line)
        assert quoted in readme, quoted
