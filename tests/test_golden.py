"""The golden-hash machinery on the DEV: generator, hashing, files, merging, verify and refresh.

Kernels run under Triton's interpreter on tiny cases; a made-up family ("fake") and a temporary
golden directory stand in for the hardware and the repository's golden/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import portattn.cli
import portattn.golden.run as golden_run
from portattn.golden import (
    CASES,
    Case,
    GoldenConflict,
    GoldenError,
    build_record,
    compute_case,
    merge,
    run_fingerprints,
    run_refresh,
    run_verify,
    verify_against,
)
from portattn.golden.cli import Hardware, cmd_refresh, cmd_verify
from portattn.golden.hashing import tensor_bytes
from portattn.golden.inputs import (
    GAMMA,
    MASK64,
    _mul_const,
    generate,
    mix64,
    splitmix64_scalar,
    splitmix64_words,
)
from portattn.golden.provenance import toolchain_key
from portattn.golden.run import CaseResult, make_inputs
from portattn.golden.store import (
    atomic_write,
    config_hashes_of,
    dumps,
    load,
    stale_outputs,
    update_file,
)

REPO = Path(__file__).resolve().parents[1]
# The device the kernels run on here: the GPU when there is one, else the DEV interpreter.
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FAKE = "fake"
TC = toolchain_key()
# Tiny cases: fast under the interpreter, still with a zero-length sequence, a single token, a
# partial tile, GQA, causal and not, both kernels, both dtypes, with and without dlse.
TINY = [
    Case("tiny-varlen", "varlen", (0, 1, 17), (0, 1, 17), 2, 1, 32, "fp16", True, 5),
    Case("tiny-fixed", "fixed_order", (3, 5), (9, 0), 2, 2, 32, "bf16", False, 6, False),
]


def words(hi: torch.Tensor, lo: torch.Tensor) -> list[int]:
    return [(int(h) << 32) | int(l) for h, l in zip(hi.tolist(), lo.tolist())]


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def capture() -> tuple[list[str], callable]:
    lines: list[str] = []
    return lines, lines.append


def refresh(tmp_path, cases=TINY, **kw) -> int:
    kw.setdefault("out", lambda line: None)
    kw.setdefault("fingerprint_fn", None)
    return run_refresh(FAKE, DEV, tmp_path, cases=cases, repeat=1, **kw)


# ----------------------------------------------------------------------------- generator


def test_splitmix64_known_values():
    # SplitMix64 seeded with state 0 (Vigna's reference): the first three outputs.
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [mix64((i + 1) * GAMMA) for i in range(3)] == expected


def test_limb_arithmetic_matches_python_ints():
    gen = torch.Generator().manual_seed(0)  # only picks test values; the generator has no RNG
    values = [int(x) & MASK64 for x in torch.randint(-(2**63), 2**63 - 1, (200,), generator=gen)]
    values += [0, 1, MASK64, 2**32 - 1, 2**32, 2**63]
    hi = torch.tensor([v >> 32 for v in values])
    lo = torch.tensor([v & 0xFFFFFFFF for v in values])
    for const in (GAMMA, 0xBF58476D1CE4E5B9, MASK64, 1):
        assert words(*_mul_const((hi, lo), const)) == [(v * const) & MASK64 for v in values]


def test_generator_words_match_scalar_definition():
    hi, lo = splitmix64_words(seed=7, tensor_id=3, n=3000)
    got = words(hi, lo)
    assert all(got[i] == splitmix64_scalar(7, 3, i) for i in range(0, 3000, 7))


def test_generator_known_hashes():
    """Literal values and hashes: any change of the generator (hence of every golden input)
    fails here."""
    first = [0.7734375, 1.8828125, -0.296875, 1.21875, -0.5703125, 1.375, 1.3046875, -0.8515625]
    assert generate((8,), seed=1, tensor_id=1).tolist() == first
    assert sha(generate((3, 5, 7), seed=1, tensor_id=1)) == (
        "b9fe2d94271134177931f941a7a499753cd2f3a97a4a4882c4cf6a3fd1418659"
    )
    assert sha(generate((4, 2, 64), seed=1000, tensor_id=2, dtype=torch.bfloat16)) == (
        "36d08a379c73fbf805d623c67eaf5f8854b69f94304e5ad1f92eda9ff8fa08f5"
    )
    assert make_inputs(TINY[0]).sha256() == (
        "033cf79cde3aef7c1f927f60ebb9fb477e59879689779ce1e5ac1fccaf67ba99"
    )


def test_generator_values_exact_in_bf16_and_fp16():
    x = generate((64, 8, 32), seed=3, tensor_id=4)
    assert x.dtype == torch.float32
    assert x.min().item() >= -2.0 and x.max().item() < 2.0
    steps = x * 128
    assert torch.equal(steps, steps.round())  # multiples of 2**-7
    assert steps.unique().numel() == 512  # every value of the range occurs
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(x.to(dtype).float(), x)
        assert torch.equal(generate((64, 8, 32), seed=3, tensor_id=4, dtype=dtype).float(), x)


def test_generator_streams_differ_and_repeat():
    a = generate((100,), seed=1, tensor_id=1)
    assert torch.equal(a, generate((100,), seed=1, tensor_id=1))
    assert not torch.equal(a, generate((100,), seed=2, tensor_id=1))
    assert not torch.equal(a, generate((100,), seed=1, tensor_id=2))
    # Element i does not depend on the shape: the generator is counter-based.
    assert torch.equal(generate((10, 10), seed=1, tensor_id=1).flatten(), a)


@pytest.mark.gpu
def test_generator_same_on_gpu():
    for case in CASES[:3]:
        on_gpu, on_cpu = make_inputs(case, "cuda"), make_inputs(case)
        assert on_gpu.q.is_cuda and on_gpu.sha256() == on_cpu.sha256()


# ----------------------------------------------------------------------------- cases


def test_canonical_cases_cover_the_spec():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names) and len({c.seed for c in CASES}) == len(CASES)
    assert 8 <= len(CASES) <= 40
    assert {c.kernel for c in CASES} == {"varlen", "fixed_order"}
    assert {c.causal for c in CASES} == {True, False}
    assert {c.dtype for c in CASES} == {"bf16", "fp16"}
    assert {64, 128} < {c.head_dim for c in CASES}
    assert any(c.heads_q > c.heads_kv > 0 for c in CASES)  # GQA
    lens = {n for c in CASES for n in c.lens_q}
    assert {0, 1} <= lens and any(n % 16 and n > 16 for n in lens)
    assert any(0 < q < k for c in CASES for q, k in zip(c.lens_q, c.lens_k))  # decode
    assert any(not c.dlse for c in CASES) and any(c.dlse for c in CASES)
    for c in CASES:
        assert Case.from_json(c.name, c.to_json()) == c


# ----------------------------------------------------------------------------- hashing


@pytest.fixture(scope="module")
def tiny_results() -> list[CaseResult]:
    return [compute_case(c, DEV) for c in TINY]


def test_hashes_run_to_run_identical(tiny_results):
    for first in tiny_results:
        again = compute_case(first.case, DEV)
        assert again.tensors == first.tensors
        assert again.inputs_sha256 == first.inputs_sha256
        assert (
            verify_against({"inputs_sha256": first.inputs_sha256, "tensors": first.tensors}, again)
            == []
        )


def test_records_have_per_sequence_and_head_digests(tiny_results):
    rec = tiny_results[0].tensors
    assert set(rec) == {"out", "lse", "dq", "dk", "dv"}
    assert len(rec["out"]["seqs"]) == 3 and len(rec["out"]["seqs"][0].split()) == 2
    assert len(rec["dk"]["seqs"][2].split()) == 1  # one kv head
    assert rec["out"]["sha256"] == sha(tiny_results[0].outputs["out"])


# ----------------------------------------------------------------------------- merge


def _result(name: str, salt: str = "", kernel: str = "varlen") -> CaseResult:
    case = Case(name, kernel, (2, 1), (2, 1), 2, 1, 32, "fp16", True, 1)
    tensors = {
        t: {
            "sha256": hashlib.sha256(f"{name}{t}{salt}".encode()).hexdigest(),
            "shape": [3, 2],
            "dtype": "float16",
            "seqs": [f"{t}0a{salt} {t}0b{salt}", f"{t}1a{salt} {t}1b{salt}"],
        }
        for t in ("out", "lse", "dq", "dk", "dv")
    }
    return CaseResult(case, None, {}, "in-" + name, tensors)


def _record(results, toolchain="triton-x", config="c1", fingerprints=None) -> dict:
    hashes = {r.case.entry: config for r in results}
    prov = {"devices": ["dev"], "drivers": [], "torch": ["t"], "portattn": "0", "date": "d"}
    return build_record(FAKE, toolchain, results, prov, fingerprints, hashes, 1)


def test_merge_never_drops_toolchains_or_cases():
    doc, _ = merge(None, _record([_result("a")], "triton-1"))
    doc, _ = merge(doc, _record([_result("b")], "triton-1"))
    doc, changes = merge(doc, _record([_result("a", salt="new")], "triton-2"))
    assert set(doc["toolchains"]) == {"triton-1", "triton-2"}
    assert set(doc["toolchains"]["triton-1"]["outputs"]) == {"a", "b"}
    assert set(doc["toolchains"]["triton-2"]["outputs"]) == {"a"}
    assert set(doc["cases"]) == {"a", "b"}
    assert "[triton-2] new toolchain section" in changes


def test_merge_refuses_differing_hashes_without_force():
    doc, _ = merge(None, _record([_result("a"), _result("b")]))
    with pytest.raises(GoldenConflict) as info:
        merge(doc, _record([_result("a"), _result("b", salt="x")]))
    text = "\n".join(info.value.conflicts)
    assert "case b: dq: sequence 1, heads 0, 1 differ" in text and "case a" not in text
    forced, changes = merge(doc, _record([_result("b", salt="x")]), force=True)
    assert forced["toolchains"]["triton-x"]["outputs"]["b"]["tensors"]["out"]["seqs"][0] == (
        "out0ax out0bx"
    )
    assert (
        forced["toolchains"]["triton-x"]["outputs"]["a"]
        == (doc["toolchains"]["triton-x"]["outputs"]["a"])
    )
    assert any("replaced (--force)" in c for c in changes)


def test_merge_replaces_stale_outputs_and_keeps_provenance():
    doc, _ = merge(None, _record([_result("a")], config="c1"))
    newer = _record([_result("a", salt="y")], config="c2")
    newer["toolchains"]["triton-x"]["provenance"]["devices"] = ["other"]
    doc2, changes = merge(doc, newer)  # another configuration: expected to differ
    assert any("stale" in c for c in changes)
    assert doc2["toolchains"]["triton-x"]["provenance"]["devices"] == ["dev", "other"]


def test_merge_case_definition_conflict_and_family():
    doc, _ = merge(None, _record([_result("a")]))
    other = _record([_result("a", kernel="fixed_order")])
    with pytest.raises(GoldenConflict, match="conflicting"):
        merge(doc, other)
    alien = _record([_result("z")])
    alien["family"] = "sm90"
    with pytest.raises(GoldenError):
        merge(doc, alien)


# ----------------------------------------------------------------------------- files


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "fake.json"
    old, _ = merge(None, _record([_result("a")]))
    atomic_write(path, old)
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(path, merge(old, _record([_result("b")]))[0])
    assert path.read_text() == before and load(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json"]  # temp file removed
    assert dumps(json.loads(before)) == before  # canonical formatting round-trips


def _python(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env)


_WRITER = """
import sys, hashlib
from portattn.golden.store import build_record, merge, update_file
from portattn.golden.cases import Case
from portattn.golden.run import CaseResult
path, prefix = sys.argv[1], sys.argv[2]
for i in range(8):
    name = f"{prefix}{i}"
    case = Case(name, "varlen", (1,), (1,), 1, 1, 32, "fp16", False, i)
    tensors = {"out": {"sha256": hashlib.sha256(name.encode()).hexdigest(), "seqs": ["x"]}}
    rec = build_record("fake", "triton-x", [CaseResult(case, None, {}, name, tensors)], None,
                       None, {case.entry: "c"}, 1)
    update_file(path, lambda old: merge(old, rec)[0])
"""


def test_concurrent_refreshes_lose_nothing(tmp_path):
    path = tmp_path / "fake.json"
    procs = [_python(_WRITER, str(path), prefix) for prefix in ("p", "q", "r")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    doc = load(path)
    expected = {f"{p}{i}" for p in "pqr" for i in range(8)}
    assert set(doc["cases"]) == expected
    assert set(doc["toolchains"]["triton-x"]["outputs"]) == expected


_SLOW_WRITER = """
import sys, time
import portattn.golden.store as store
def half_then_hang(f, text):
    f.write(text[: len(text) // 2]); f.flush(); time.sleep(120)
store._write_text = half_then_hang
doc = store.load(sys.argv[1])
doc["cases_version"] = 99
store.atomic_write(sys.argv[1], doc)
"""


def test_process_killed_mid_write_leaves_old_file(tmp_path):
    path = tmp_path / "fake.json"
    old, _ = merge(None, _record([_result("a")]))
    atomic_write(path, old)
    proc = _python(_SLOW_WRITER, str(path))
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".fake.json.*.tmp")):
        assert proc.poll() is None and time.monotonic() < deadline, "writer never started"
        time.sleep(0.05)
    while list(tmp_path.glob(".fake.json.*.tmp"))[0].stat().st_size == 0:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert load(path) == old


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
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 1
    text = "\n".join(lines)
    assert "case tiny-varlen: dq: sequence 2, head 1 differ" in text
    assert "tiny-fixed" in text and "MISMATCH" in text
    assert "dq: rel error" in text and "drifted but accurate" in text

    monkeypatch.setattr(golden_run, "run_kernels", _flip("tiny-varlen", "out", 0, 0, 100.0))
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 1
    text = "\n".join(lines)
    assert "case tiny-varlen: out: sequence 1, head 0 differ" in text and "WRONG" in text

    # refresh refuses the changed hashes without --force and prints what differs
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out) == 1
    assert "refused" in lines[-3] or any("refused" in ln for ln in lines)
    assert any("out: sequence 1, head 0 differ" in ln for ln in lines)
    assert load(tmp_path / "fake.json") == doc
    assert refresh(tmp_path, cases=TINY[:1], force=True) == 0
    assert run_verify(FAKE, DEV, tmp_path, case_names=["tiny-varlen"], out=lambda s: None) == 0


def _args(**kw) -> argparse.Namespace:
    base = {
        "family": None,
        "golden_dir": None,
        "case": None,
        "force": False,
        "repeat": 1,
        "skip_fingerprints": True,
    }
    return argparse.Namespace(**(base | kw))


def test_verify_exit_codes(tmp_path, capsys):
    here = Hardware(FAKE, DEV, "cpu")
    # no GPU at all, and the real command line on this machine
    assert cmd_verify(_args(golden_dir=tmp_path), Hardware(None, None, "no GPU")) == 2
    assert "interpreter is not a family" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert portattn.cli.main(["golden", "verify", "--golden-dir", str(tmp_path)]) == 2
        assert portattn.cli.main(["golden", "refresh", "--golden-dir", str(tmp_path)]) == 2
    # wrong hardware for --family
    assert cmd_verify(_args(golden_dir=tmp_path, family="sm90"), here) == 2
    assert "not a sm90 GPU" in capsys.readouterr().out
    # no golden file, then one with fingerprints only
    assert cmd_verify(_args(golden_dir=tmp_path), here) == 2
    assert "does not exist" in capsys.readouterr().out
    fps = {"varlen/d32/fp16": {"fwd": "f1"}}
    assert (
        run_fingerprints(
            [FAKE], tmp_path, update=True, out=lambda s: None, fingerprint_fn=lambda fam: fps
        )
        == 0
    )
    assert cmd_verify(_args(golden_dir=tmp_path), here) == 2
    assert "fingerprints only" in capsys.readouterr().out
    # recorded: match, then a one-element change
    assert cmd_refresh(_args(golden_dir=tmp_path, case=["tiny"]), here) == 2  # unknown case
    assert refresh(tmp_path, cases=TINY[:1], fingerprint_fn=lambda fam: fps) == 0
    assert cmd_verify(_args(golden_dir=tmp_path), here) == 0
    doc = load(tmp_path / "fake.json")
    rec = doc["toolchains"][TC]["outputs"]["tiny-varlen"]["tensors"]["lse"]
    rec["sha256"] = "0" * 64
    rec["seqs"][1] = "0" * 16 + " " + rec["seqs"][1].split()[1]
    atomic_write(tmp_path / "fake.json", doc)
    assert cmd_verify(_args(golden_dir=tmp_path), here) == 1
    assert "lse: sequence 1, head 0 differ" in capsys.readouterr().out
    # other toolchains only
    assert run_verify(FAKE, DEV, tmp_path, toolchain="triton-0.0", out=print) == 2
    assert "recorded toolchains: " + TC in capsys.readouterr().out


def test_verify_fingerprints_only_file_says_so(tmp_path, capsys):
    """A family whose file holds compile fingerprints and no output hashes (sm80 and cdna2/3/4
    today): verify exits 2 with one plain line, and runs nothing."""
    fps = {"varlen/d32/fp16": {"fwd": "f1"}}
    code = run_fingerprints([FAKE], tmp_path, update=True, out=print, fingerprint_fn=lambda f: fps)
    assert code == 0
    section = load(tmp_path / "fake.json")["toolchains"][TC]
    assert section["fingerprints"] == fps and not section.get("outputs")
    capsys.readouterr()
    assert cmd_verify(_args(golden_dir=tmp_path, family=FAKE), Hardware(FAKE, DEV, "dev")) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"no output hashes recorded for {TC} in ")
    assert "it holds compile fingerprints only" in lines[0]
    assert "nox -s \"golden_refresh(family='fake')\"" in lines[0]


def test_verify_without_the_family_hardware(tmp_path, capsys):
    """`golden verify --family sm80` on a machine without an sm80 GPU: exit 2, one line."""
    sm90 = Hardware("sm90", DEV, "NVIDIA H200")
    assert cmd_verify(_args(golden_dir=tmp_path, family="sm80"), sm90) == 2
    assert capsys.readouterr().out.splitlines() == [
        "golden verify: this machine has NVIDIA H200 (family sm90), not a sm80 GPU"
    ]
    if not torch.cuda.is_available():
        argv = ["golden", "verify", "--family", "sm80", "--golden-dir", str(REPO / "golden")]
        assert portattn.cli.main(argv) == 2
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
    assert (
        run_fingerprints([FAKE], tmp_path, update=True, out=out, fingerprint_fn=lambda fam: changed)
        == 0
    )
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
    update_file(path, lambda old: merge(old, _record([_result("a")]))[0])
    update_file(path, lambda old: merge(old, _record([_result("b")]))[0])
    assert set(load(path)["cases"]) == {"a", "b"}


# ----------------------------------------------------------------------------- defects


@pytest.fixture
def no_compute(monkeypatch):
    """run_refresh must refuse before computing anything: any case computed fails the test."""
    import portattn.golden.commands as commands

    def computed(case, device):
        raise AssertionError(f"computed {case.name} before refusing")

    monkeypatch.setattr(commands, "compute_case", computed)


def test_refresh_refuses_a_device_outside_the_family(tmp_path, monkeypatch):
    """run_refresh for a family of the table on another device (here the CPU) replaced the
    recorded hashes as "stale" (recorded with another configuration) without --force; the CLI
    refuses it, and so does the library function: exit 2, one line, nothing computed, the file
    unchanged, --force or not."""
    import portattn.golden.commands as commands
    from portattn.families import FAMILIES
    from portattn.families import family as family_of

    computed: list[str] = []
    real = commands.compute_case
    monkeypatch.setattr(
        commands, "compute_case", lambda case, dev: computed.append(case.name) or real(case, dev)
    )
    other = next(f for f in FAMILIES if f != family_of(DEV))
    recorded = _result("tiny-varlen", salt="recorded")
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
        lambda out: run_fingerprints(
            [FAKE], tmp_path, update=True, out=out, fingerprint_fn=lambda f: {}
        ),
        lambda out: refresh(tmp_path, cases=TINY[:1], out=out),
    ):
        lines, out = capture()
        assert run(out) == 2
        assert len(lines) == 1 and f"error: {path} is " in lines[0], lines
    capsys.readouterr()
    assert cmd_verify(_args(golden_dir=tmp_path), Hardware(FAKE, DEV, "cpu")) == 2
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
    assert portattn.cli.main(argv) == 2
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
    assert cmd_verify(_args(golden_dir=tmp_path), Hardware(FAKE, DEV, "cpu")) == 2
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
    args = _args(golden_dir=read_only_dir, case=[CASES[0].name])
    assert cmd_refresh(args, Hardware(FAKE, DEV, "cpu")) == 2
    assert capsys.readouterr().out.splitlines()[-1].startswith("error: cannot write ")
    lines, out = capture()
    fps = lambda f: pytest.fail("compiled before refusing")  # noqa: E731
    assert run_fingerprints([FAKE], read_only_dir, update=True, out=out, fingerprint_fn=fps) == 2
    assert len(lines) == 1 and "is not writable" in lines[0]
    assert list(read_only_dir.iterdir()) == []


def test_refresh_write_failure_is_an_error_line(tmp_path, monkeypatch):
    """A write that fails after the checks passed (a full disk, a race): exit 2, one line."""
    import portattn.golden.store as store

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.tempfile, "mkstemp", no_space)
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
    doc, _ = merge(None, _record([_result("a")]))
    atomic_write(path, doc)
    path.chmod(0o444)
    before = path.read_text()
    with pytest.raises(GoldenError, match=rf"^{path} is not writable \(mode 0444\)"):
        atomic_write(path, merge(doc, _record([_result("b")]))[0])
    with pytest.raises(GoldenError, match="not writable"):
        update_file(path, lambda old: merge(old, _record([_result("b")]))[0])
    lines, out = capture()
    assert refresh(tmp_path, cases=TINY[:1], out=out) == 2
    assert lines == [
        f"error: {path} is not writable (mode 0444); nothing written: make it writable to "
        "record into it"
    ]
    fps = lambda f: pytest.fail("compiled before refusing")  # noqa: E731
    assert run_fingerprints([FAKE], tmp_path, update=True, out=out, fingerprint_fn=fps) == 2
    assert path.read_text() == before and (path.stat().st_mode & 0o777) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json"]

    path.chmod(0o640)
    atomic_write(path, merge(doc, _record([_result("b")]))[0])
    assert set(load(path)["cases"]) == {"a", "b"} and (path.stat().st_mode & 0o777) == 0o640
    update_file(path, lambda old: merge(old, _record([_result("c")]))[0])
    assert (path.stat().st_mode & 0o777) == 0o640


def _fingerprints(tmp_path, toolchain: str, config_hash: str, update: bool = False) -> int:
    """``run_fingerprints`` of FAKE under ``toolchain``, every entry's configuration hashing to
    ``config_hash``; returns the exit code (its last line is on stdout)."""
    return run_fingerprints(
        [FAKE],
        tmp_path,
        update=update,
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
