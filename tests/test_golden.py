"""The golden-hash commands on the DEV: verify and refresh (the store: test_golden_store.py).

Kernels run under Triton's interpreter on tiny cases; a made-up family ("fake") and a temporary
golden directory stand in for the hardware and the repository's golden/.
"""

from __future__ import annotations

import json

import pytest
import torch
from golden_helpers import (
    DEV,
    FAKE,
    REPO,
    TC,
    TINY,
    capture,
    fake_record,
    fake_result,
    refresh,
    verify_args,
    verify_reports_difference,
)

import portattn.tools.cli
import portattn.tools.golden.run as golden_run
from ci.golden_dev.__main__ import cmd_refresh
from ci.golden_dev.__main__ import main as golden_dev_main
from ci.golden_dev.fingerprints import results_fingerprints, update_fingerprints
from ci.golden_dev.merging import merge
from ci.golden_dev.write import atomic_write, update_file
from portattn.tools.golden.cli import Hardware, cmd_verify
from portattn.tools.golden.fingerprints import run_fingerprints
from portattn.tools.golden.layout import load
from portattn.tools.golden.records import stale_outputs
from portattn.tools.golden.verify import run_verify

# ----------------------------------------------------------------------------- verify / refresh


def _flip(name: str, tensor: str, row: int, head: int, value: float | None = None):
    """A run_kernels that changes one element of one output of case ``name``."""
    real = golden_run.run_kernels

    def run(case, inputs):
        outputs = real(case, inputs)
        if case.name == name:
            t = outputs[tensor].clone()
            cell = t[row, head, 0]
            if value is None:  # the next representable value: a one-ulp drift
                bits = cell.view(torch.int16) + 1
                t[row, head, 0] = bits.view(t.dtype)
            else:
                t[row, head, 0] = value
            outputs[tensor] = t
        return outputs

    return run


def test_refresh_then_verify_and_mismatch_localised(tmp_path, monkeypatch):
    lines, out = capture()
    assert refresh(tmp_path, out=out) == 0
    assert any("[ 1/2] tiny-varlen" in ln for ln in lines)  # one progress line per case
    doc = load(tmp_path / "fake.json")
    assert set(doc["toolchains"][TC]["outputs"]) == {"tiny-varlen", "tiny-fixed"}
    if DEV.type == "cpu":
        assert doc["toolchains"][TC]["provenance"]["devices"] == ["cpu (Triton interpreter)"]
    assert run_verify(FAKE, DEV, tmp_path, out=lambda line: None) == 0

    # Sequence 2 of tiny-varlen owns rows 1..17 (sequence 1: row 0). One ulp: drifted, accurate.
    monkeypatch.setattr(golden_run, "run_kernels", _flip("tiny-varlen", "dq", 5, 1))
    text = verify_reports_difference(tmp_path)
    assert "case tiny-varlen: dq: sequence 2, head 1 differ" in text
    assert "tiny-fixed" in text and "MISMATCH" in text
    assert "dq: rel error" in text and "drifted but accurate" in text

    monkeypatch.setattr(golden_run, "run_kernels", _flip("tiny-varlen", "out", 0, 0, 100.0))
    text = verify_reports_difference(tmp_path)
    assert "case tiny-varlen: out: sequence 1, head 0 differ" in text and "WRONG" in text

    # refresh refuses the changed hashes without --force and prints what differs
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out) == 1
    assert "refused" in lines[-3] or any("refused" in ln for ln in lines)
    assert any("out: sequence 1, head 0 differ" in ln for ln in lines)
    assert load(tmp_path / "fake.json") == doc
    assert refresh(tmp_path, cases=TINY[:1], force=True) == 0
    assert run_verify(FAKE, DEV, tmp_path, case_names=["tiny-varlen"], out=lambda s: None) == 0


def test_verify_exit_codes(tmp_path, capsys):
    here = Hardware(FAKE, DEV, "cpu")
    # no GPU at all, and the real command line on this machine
    assert cmd_verify(verify_args(golden_dir=tmp_path), Hardware(None, None, "no GPU")) == 2
    assert "interpreter is not a family" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert portattn.tools.cli.main(["golden", "verify", "--golden-dir", str(tmp_path)]) == 2
        with pytest.raises(SystemExit) as exit_:  # a usage error: refresh is ci/golden_dev's
            portattn.tools.cli.main(["golden", "refresh", "--golden-dir", str(tmp_path)])
        assert exit_.value.code == 2
    # wrong hardware for --family
    assert cmd_verify(verify_args(golden_dir=tmp_path, family="sm90"), here) == 2
    assert "not a sm90 GPU" in capsys.readouterr().out
    # no golden file, then one with fingerprints only
    assert cmd_verify(verify_args(golden_dir=tmp_path), here) == 2
    assert "does not exist" in capsys.readouterr().out
    fps = {"varlen/d32/fp16": {"fwd": "f1"}}
    assert (
        update_fingerprints([FAKE], tmp_path, out=lambda s: None, fingerprint_fn=lambda fam: fps)
        == 0
    )
    assert cmd_verify(verify_args(golden_dir=tmp_path), here) == 2
    assert "fingerprints only" in capsys.readouterr().out
    # recorded: match, then a one-element change
    assert cmd_refresh(verify_args(golden_dir=tmp_path, case=["tiny"]), here) == 2  # unknown case
    assert refresh(tmp_path, cases=TINY[:1], fingerprint_fn=lambda fam: fps) == 0
    assert cmd_verify(verify_args(golden_dir=tmp_path), here) == 0
    doc = load(tmp_path / "fake.json")
    rec = doc["toolchains"][TC]["outputs"]["tiny-varlen"]["tensors"]["lse"]
    rec["sha256"] = "0" * 64
    rec["seqs"][1] = "0" * 16 + " " + rec["seqs"][1].split()[1]
    atomic_write(tmp_path / "fake.json", doc)
    assert cmd_verify(verify_args(golden_dir=tmp_path), here) == 1
    assert "lse: sequence 1, head 0 differ" in capsys.readouterr().out
    # other toolchains only
    assert run_verify(FAKE, DEV, tmp_path, toolchain="triton-0.0", out=print) == 2
    assert "recorded toolchains: " + TC in capsys.readouterr().out


def test_verify_fingerprints_only_file_says_so(tmp_path, capsys):
    """A family whose file holds compile fingerprints and no output hashes (every family
    but sm90 today): verify exits 2 with one plain line, and runs nothing."""
    fps = {"varlen/d32/fp16": {"fwd": "f1"}}
    code = update_fingerprints([FAKE], tmp_path, out=print, fingerprint_fn=lambda f: fps)
    assert code == 0
    section = load(tmp_path / "fake.json")["toolchains"][TC]
    assert section["fingerprints"] == fps and not section.get("outputs")
    capsys.readouterr()
    assert (
        cmd_verify(verify_args(golden_dir=tmp_path, family=FAKE), Hardware(FAKE, DEV, "dev")) == 2
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"no output hashes recorded for {TC} in ")
    assert "it holds compile fingerprints only" in lines[0]
    assert "nox -s \"golden_refresh(family='fake')\"" in lines[0]


def test_verify_without_the_family_hardware(tmp_path, capsys):
    """`golden verify --family sm80` on a machine without an sm80 GPU: exit 2, one line."""
    sm90 = Hardware("sm90", DEV, "NVIDIA H200")
    assert cmd_verify(verify_args(golden_dir=tmp_path, family="sm80"), sm90) == 2
    assert capsys.readouterr().out.splitlines() == [
        "golden verify: this machine has NVIDIA H200 (family sm90), not a sm80 GPU"
    ]
    if not torch.cuda.is_available():
        argv = ["golden", "verify", "--family", "sm80", "--golden-dir", str(REPO / "golden")]
        assert portattn.tools.cli.main(argv) == 2
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 1 and lines[0].startswith("golden verify: no GPU here")


def test_repository_files_without_outputs_verify_to_exit_2():
    """Every golden/<family>.json of the repository that holds no output hashes for this
    Triton says so (exit 2, one line) instead of running anything."""
    from portattn.families import FAMILIES

    checked = 0
    for family in FAMILIES:
        doc = load(REPO / "golden" / f"{family}.json")
        if doc is None or doc["toolchains"].get(TC, {}).get("outputs"):
            continue
        lines, out = capture()
        assert run_verify(family, DEV, REPO / "golden", out=out) == 2
        assert len(lines) == 1 and lines[0].startswith(f"no output hashes recorded for {TC}")
        assert f"golden_refresh(family='{family}')" in lines[0]
        checked += 1
    if TC != "triton-3.6.0":
        assert checked == sum((REPO / "golden" / f"{f}.json").exists() for f in FAMILIES)


def test_fingerprints_from_compile_results(tmp_path):
    """``ci.golden_dev fingerprints --results PATH`` compares the fingerprints of a compile check's
    JSON (what CI compiles once for both the checks and the fingerprints) as if compiled: equal
    ones match, a changed one differs, a family or kernel the results lack differs too."""
    fps = {"varlen/d32/fp16": {"fwd": "f1", "bwd_dq": "g1"}}
    made = lambda family: fps  # noqa: E731
    assert update_fingerprints([FAKE], tmp_path, out=print, fingerprint_fn=made) == 0
    record = {"fingerprint": "f1", "ok": True, "shared": 0}
    for fwd, dq, code in (("f1", "g1", 0), ("f2", "g1", 1), ("f1", None, 1)):
        stages = {"fwd": dict(record, fingerprint=fwd)}
        if dq is not None:
            stages["bwd_dq"] = dict(record, fingerprint=dq)
        path = tmp_path / "results.json"
        path.write_text(json.dumps({FAKE: {"varlen/d32/fp16": stages}}))
        lines, out = capture()
        made = results_fingerprints(path)
        assert run_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=made) == code, lines
    path.write_text(json.dumps({"sm80": {"varlen/d32/fp16": {"fwd": record}}}))
    assert results_fingerprints(path)(FAKE) == {}
    assert (
        run_fingerprints([FAKE], tmp_path, out=print, fingerprint_fn=results_fingerprints(path))
        == 1
    )


@pytest.mark.parametrize(
    "text, match",
    [
        (None, "cannot be read"),
        ('{"sm80": {"varlen/d32/fp16": {"fwd": {"fingerp', "not valid JSON"),
        ("[1, 2]", "compile --json): the top level is an array"),
        ('{"sm80": {"varlen/d32/fp16": {"fwd": {"ok": true}}}}', "sm80 / varlen/d32/fp16 / fwd"),
        ('{"sm80": {"varlen/d32/fp16": []}}', "sm80 / varlen/d32/fp16"),
    ],
    ids=["missing", "truncated", "array", "no-fingerprint", "entry-array"],
)
def test_fingerprints_results_file_unusable(tmp_path, capsys, text, match):
    """``python -m ci.golden_dev fingerprints --results FILE`` with a file that is missing,
    truncated or not a compile check's results: one error line, exit 2 (it printed a
    traceback)."""
    path = tmp_path / "results.json"
    if text is not None:
        path.write_text(text)
    argv = ["fingerprints", "--results", str(path), "--golden-dir", str(tmp_path)]
    assert golden_dev_main(argv) == 2
    said = capsys.readouterr().out
    assert said.startswith("error: ") and str(path) in said and match in said, said


def test_fingerprint_change_marks_outputs_stale(tmp_path):
    fps = {"varlen/d32/fp16": {"fwd": "f1", "bwd_dq": "g1"}}
    assert refresh(tmp_path, cases=TINY[:1], fingerprint_fn=lambda fam: fps) == 0
    lines, out = capture()
    assert run_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=lambda fam: fps) == 0
    assert "match" in lines[-1]
    changed = {"varlen/d32/fp16": {"fwd": "f2", "bwd_dq": "g1"}}
    lines, out = capture()
    assert run_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=lambda fam: changed) == 1
    assert "varlen/d32/fp16/fwd" in lines[-1]
    lines, out = capture()
    assert update_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=lambda fam: changed) == 0
    assert any("stale: re-record on fake hardware" in ln for ln in lines)
    doc = load(tmp_path / "fake.json")
    assert set(stale_outputs(doc, TC, lambda e: None)) == {"tiny-varlen"}
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 2
    assert lines[-1].startswith("stale: re-record on fake hardware")
    # a hardware refresh with the new machine code replaces them without --force
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out, fingerprint_fn=lambda fam: changed) == 0
    assert any("stale" in ln for ln in lines)
    assert run_verify(FAKE, DEV, tmp_path, out=lambda s: None) == 0


def test_update_file_rereads_inside_lock(tmp_path):
    path = tmp_path / "fake.json"
    update_file(path, lambda old: merge(old, fake_record([fake_result("a")]))[0])
    update_file(path, lambda old: merge(old, fake_record([fake_result("b")]))[0])
    assert set(load(path)["cases"]) == {"a", "b"}
