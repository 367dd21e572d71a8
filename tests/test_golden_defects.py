"""The golden-hash commands on the DEV when something is wrong: a device outside the family,
malformed or read-only golden files, failed writes, per-toolchain configuration hashes (the
commands themselves: test_golden.py).

Kernels run under Triton's interpreter on tiny cases; a made-up family ("fake") and a temporary
golden directory stand in for the hardware and the repository's golden/.
"""

from __future__ import annotations

import json

import pytest
from golden_helpers import (
    DEV,
    FAKE,
    TC,
    TINY,
    capture,
    fake_record,
    fake_result,
    refresh,
    verify_args,
)

import portattn.tools.cli
from ci.golden_dev.__main__ import cmd_refresh
from ci.golden_dev.fingerprints import update_fingerprints
from ci.golden_dev.merging import build_record, merge
from ci.golden_dev.refresh import run_refresh
from ci.golden_dev.write import atomic_write, update_file
from portattn.tools.golden.cases import CASES
from portattn.tools.golden.cli import Hardware, cmd_verify
from portattn.tools.golden.fingerprints import run_fingerprints
from portattn.tools.golden.layout import GoldenError, load
from portattn.tools.golden.records import config_hashes_of
from portattn.tools.golden.run import make_inputs
from portattn.tools.golden.verify import run_verify

# ----------------------------------------------------------------------------- defects


@pytest.fixture
def no_compute(monkeypatch):
    """run_refresh must refuse before computing anything: any case computed fails the test."""
    import ci.golden_dev.refresh as refresh_module

    def computed(case, device):
        raise AssertionError(f"computed {case.name} before refusing")

    monkeypatch.setattr(refresh_module, "compute_case", computed)


def test_refresh_refuses_a_device_outside_the_family(tmp_path, monkeypatch):
    """run_refresh for a family of the table on another device (here the CPU) replaced the
    recorded hashes as "stale" (recorded with another configuration) without --force; the CLI
    refuses it, and so does the library function: exit 2, one line, nothing computed, the file
    unchanged, --force or not."""
    import ci.golden_dev.refresh as refresh_module
    from portattn.families import FAMILIES
    from portattn.families import family as family_of
    from portattn.tools.golden.verify import emulated_family

    computed: list[str] = []
    real = refresh_module.compute_case
    monkeypatch.setattr(
        refresh_module,
        "compute_case",
        lambda case, dev: computed.append(case.name) or real(case, dev),
    )
    # not this device's family, nor the one it runs under $PORTATTN_FAMILY_OVERRIDE
    other = next(f for f in FAMILIES if f not in (family_of(DEV), emulated_family(DEV)))
    recorded = fake_result("tiny-varlen", salt="recorded")
    recorded.case = TINY[0]  # the same definition and inputs, hashes of other hardware
    recorded.inputs_sha256 = make_inputs(TINY[0]).sha256()
    record = build_record(other, TC, [recorded], None, None, {TINY[0].entry: "its-config"}, 1)
    path = tmp_path / f"{other}.json"
    atomic_write(path, record)
    before = path.read_text()
    for force in (False, True):
        lines, out = capture()
        code = run_refresh(
            other, DEV, tmp_path, force, cases=TINY[:1], out=out, repeat=1, fingerprint_fn=None
        )
        assert path.read_text() == before, "recorded hashes replaced"
        assert code == 2 and len(lines) == 1
        assert lines[0].startswith("error: ") and f"is not a {other} GPU" in lines[0]
    assert computed == []


def _malformed_files() -> dict[str, bytes]:
    good = {"schema": 1, "family": FAKE, "cases_version": 1, "cases": {}, "toolchains": {}}
    fps = {TC: {"fingerprints": {"varlen/d32/fp16": {"fwd": "f1"}}}}
    variants = {
        "schema-string": {"schema": "1"},
        "schema-bool": {"schema": True, "family": FAKE},
        "family-number": good | {"family": 3},
        "toolchains-list": good | {"toolchains": []},
        "toolchains-null": good | {"toolchains": None},
        "toolchain-null": good | {"toolchains": {TC: None}},
        "outputs-list": good | {"toolchains": {TC: {"outputs": []}}},
        "output-number": good | {"toolchains": {TC: {"outputs": {"a": 5}}}},
        "output-no-tensors": good | {"toolchains": {TC: {"outputs": {"a": {"entry": "e"}}}}},
        "fingerprints-list": good | {"toolchains": {TC: {"fingerprints": {"e": ["f"]}}}},
        "provenance-devices": good | {"toolchains": {TC: fps[TC] | {"provenance": {"devices": 1}}}},
        "cases-list": good | {"cases": []},
        "case-number": good | {"cases": {"x": 5}},
        "case-no-lens": good | {"cases": {"x": TINY[0].to_json() | {"lens_q": None}}},
        "case-bad-dtype": good | {"cases": {"x": TINY[0].to_json() | {"dtype": "fp8"}}},
        "case-no-kv-heads": good | {"cases": {"x": TINY[0].to_json() | {"heads_kv": 0}}},
        "config-hashes-list": good | {"config_hashes": ["c"]},
    }
    files = {name: json.dumps(doc).encode() for name, doc in variants.items()}
    files["not-utf8"] = b'{"schema": 1, "family": "fake", "x": "\xff\xfe"}'
    return files


MALFORMED = _malformed_files()


@pytest.mark.parametrize("content", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_golden_file_is_a_one_line_error(tmp_path, capsys, content, no_compute):
    """Valid JSON of the wrong shape, or not UTF-8: load raises GoldenError naming the file,
    and verify / fingerprints / refresh (library and command line) exit 2 with one line."""
    path = tmp_path / "fake.json"
    path.write_bytes(content)
    with pytest.raises(GoldenError, match=f"^{path} is (malformed|not UTF-8)"):
        load(path)
    for run in (
        lambda out: run_verify(FAKE, DEV, tmp_path, out=out),
        lambda out: run_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=lambda f: {}),
        lambda out: update_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=lambda f: {}),
        lambda out: refresh(tmp_path, cases=TINY[:1], out=out),
    ):
        lines, out = capture()
        assert run(out) == 2
        assert len(lines) == 1 and f"error: {path} is " in lines[0], lines
    capsys.readouterr()
    assert cmd_verify(verify_args(golden_dir=tmp_path), Hardware(FAKE, DEV, "cpu")) == 2
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"error: {path} is ")
    assert path.read_bytes() == content


@pytest.mark.parametrize("name", ["schema-string", "not-utf8"])
def test_malformed_golden_file_through_the_command_line(tmp_path, capsys, name):
    """``python -m portattn golden fingerprints``: exit 2 and one line naming the file, before
    any compilation (on this machine, without a GPU)."""
    content = MALFORMED[name].replace(b'"fake"', b'"sm80"')
    path = tmp_path / "sm80.json"
    path.write_bytes(content)
    argv = ["golden", "fingerprints", "--family", "sm80", "--golden-dir", str(tmp_path)]
    assert portattn.tools.cli.main(argv) == 2
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"sm80: error: {path} is ")


def test_golden_file_without_family_is_malformed(tmp_path, capsys):
    """A file with no family is malformed, not a file that "holds compile fingerprints only"."""
    doc = {"schema": 1, "toolchains": {TC: {"fingerprints": {"varlen/d32/fp16": {"fwd": "f"}}}}}
    path = tmp_path / "fake.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(GoldenError, match="malformed: it names no family"):
        load(path)
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 2
    assert lines == [f"error: {path} is malformed: it names no family (the key 'family')"]
    assert cmd_verify(verify_args(golden_dir=tmp_path), Hardware(FAKE, DEV, "cpu")) == 2
    printed = capsys.readouterr().out
    assert "names no family" in printed and "fingerprints only" not in printed


@pytest.fixture
def read_only_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    yield ro
    ro.chmod(0o755)


def test_refresh_into_read_only_directory(read_only_dir, capsys, no_compute):
    """Writability is checked before any case is computed: exit 2, one line naming the file
    and the directory (library, command line, and a directory still to be made inside)."""
    for target in (read_only_dir, read_only_dir / "sub"):
        lines, out = capture()
        assert refresh(target, cases=TINY[:1], out=out) == 2
        assert lines == [
            f"error: cannot write {target / 'fake.json'}: the directory {read_only_dir} is not "
            "writable"
        ]
    args = verify_args(golden_dir=read_only_dir, case=[CASES[0].name])
    assert cmd_refresh(args, Hardware(FAKE, DEV, "cpu")) == 2
    assert capsys.readouterr().out.splitlines()[-1].startswith("error: cannot write ")
    lines, out = capture()
    fps = lambda f: pytest.fail("compiled before refusing")  # noqa: E731
    assert update_fingerprints([FAKE], read_only_dir, out=out, fingerprint_fn=fps) == 2
    assert len(lines) == 1 and "is not writable" in lines[0]
    assert list(read_only_dir.iterdir()) == []


def test_refresh_write_failure_is_an_error_line(tmp_path, monkeypatch):
    """A write that fails after the checks passed (a full disk, a race): exit 2, one line."""
    import ci.golden_dev.write as write

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write.tempfile, "mkstemp", no_space)
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out) == 2
    assert lines[-1] == (
        f"error: cannot write {tmp_path / 'fake.json'}: No space left on device; nothing written"
    )
    assert not (tmp_path / "fake.json").exists()


def test_read_only_golden_file_is_not_replaced(tmp_path, no_compute):
    """A 0444 golden file is refused (before computing anything), never replaced; a writable
    file that is replaced keeps its mode."""
    path = tmp_path / "fake.json"
    doc, _ = merge(None, fake_record([fake_result("a")]))
    atomic_write(path, doc)
    path.chmod(0o444)
    before = path.read_text()
    with pytest.raises(GoldenError, match=rf"^{path} is not writable \(mode 0444\)"):
        atomic_write(path, merge(doc, fake_record([fake_result("b")]))[0])
    with pytest.raises(GoldenError, match="not writable"):
        update_file(path, lambda old: merge(old, fake_record([fake_result("b")]))[0])
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out) == 2
    assert lines == [
        f"error: {path} is not writable (mode 0444); nothing written: make it writable to "
        "record into it"
    ]
    fps = lambda f: pytest.fail("compiled before refusing")  # noqa: E731
    assert update_fingerprints([FAKE], tmp_path, out=out, fingerprint_fn=fps) == 2
    assert path.read_text() == before and (path.stat().st_mode & 0o777) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json"]

    path.chmod(0o640)
    atomic_write(path, merge(doc, fake_record([fake_result("b")]))[0])
    assert set(load(path)["cases"]) == {"a", "b"} and (path.stat().st_mode & 0o777) == 0o640
    update_file(path, lambda old: merge(old, fake_record([fake_result("c")]))[0])
    assert (path.stat().st_mode & 0o777) == 0o640


def _fingerprints(tmp_path, toolchain: str, config_hash: str, update: bool = False) -> int:
    """``update_fingerprints`` (or ``run_fingerprints``) of FAKE under ``toolchain``, every
    entry's configuration hashing to ``config_hash``; returns the exit code (its last line is
    on stdout)."""
    return (update_fingerprints if update else run_fingerprints)(
        [FAKE],
        tmp_path,
        out=print,
        toolchain=toolchain,
        fingerprint_fn=lambda fam: {"varlen/d32/fp16": {"fwd": "f1"}},
        config_hash_fn=lambda fam: lambda entry: config_hash,
    )


def test_configuration_hashes_are_per_toolchain(tmp_path, capsys):
    """The table may have rows of its own for a Triton version (portattn.configs): recording a
    second toolchain's fingerprints keeps the first one's configuration hashes, and each
    toolchain is compared with its own."""
    assert _fingerprints(tmp_path, "triton-a", "cfg-a", update=True) == 0
    assert _fingerprints(tmp_path, "triton-b", "cfg-b", update=True) == 0
    doc = load(tmp_path / "fake.json")
    assert set(config_hashes_of(doc, "triton-a").values()) == {"cfg-a"}
    assert set(config_hashes_of(doc, "triton-b").values()) == {"cfg-b"}
    assert _fingerprints(tmp_path, "triton-a", "cfg-a") == 0
    assert _fingerprints(tmp_path, "triton-b", "cfg-b") == 0
    capsys.readouterr()
    assert _fingerprints(tmp_path, "triton-a", "cfg-b") == 1
    assert "configuration of " in capsys.readouterr().out


def test_section_without_its_own_hashes_reads_the_top_level_map(tmp_path):
    """A file recorded before sections had configuration hashes (golden/*.json of Triton 3.6):
    its section is compared with the top-level map, and the first merge that gives the section
    a map of its own starts from that one (a partial refresh drops no entry from the check)."""
    assert _fingerprints(tmp_path, "triton-a", "cfg-a", update=True) == 0
    doc = load(tmp_path / "fake.json")
    doc["config_hashes"] = doc["toolchains"]["triton-a"].pop("config_hashes")
    atomic_write(tmp_path / "fake.json", doc)
    assert _fingerprints(tmp_path, "triton-a", "cfg-a") == 0
    assert _fingerprints(tmp_path, "triton-a", "cfg-x") == 1
    one = sorted(doc["config_hashes"])[0]
    section = {"config_hashes": {one: "n"}}
    record = {"family": FAKE, "cases": {}, "toolchains": {"triton-a": section}}
    merged, _ = merge(doc, record)
    assert merged["toolchains"]["triton-a"]["config_hashes"] == doc["config_hashes"] | {one: "n"}
    assert merged["config_hashes"] == doc["config_hashes"]  # the top level is not written
