"""The golden store's parts: the input generator, the canonical cases, hashing, merging and
file safety (atomic writes, locks). Verify and refresh: test_golden.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from golden_helpers import (
    DEV,
    REPO,
    TINY,
    fake_record,
    fake_result,
    sha,
    words,
)

from ci.golden_dev.merging import GoldenConflict, merge
from ci.golden_dev.write import atomic_write, dumps
from portattn.tools.golden.cases import CASES, Case
from portattn.tools.golden.inputs import (
    GAMMA,
    MASK64,
    _mul_const,
    generate,
    mix64,
    splitmix64_words,
    stream_base,
)
from portattn.tools.golden.layout import GoldenError, load
from portattn.tools.golden.records import output_differences
from portattn.tools.golden.run import CaseResult, compute_case, make_inputs

# ----------------------------------------------------------------------------- generator


def splitmix64_scalar(seed: int, tensor_id: int, index: int) -> int:
    """Raw 64-bit word of element ``index``: the slow, obviously correct definition
    (portattn.tools.golden.inputs' docstring) that the limb arithmetic must equal."""
    return mix64(stream_base(seed, tensor_id) + (index + 1) * GAMMA)


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
            output_differences(first.case.name, first.output_record(), again.output_record()) == []
        )


def test_records_have_per_sequence_and_head_digests(tiny_results):
    rec = tiny_results[0].tensors
    assert set(rec) == {"out", "lse", "dq", "dk", "dv"}
    assert len(rec["out"]["seqs"]) == 3 and len(rec["out"]["seqs"][0].split()) == 2
    assert len(rec["dk"]["seqs"][2].split()) == 1  # one kv head
    assert rec["out"]["sha256"] == sha(tiny_results[0].outputs["out"])


# ----------------------------------------------------------------------------- merge


def test_merge_never_drops_toolchains_or_cases():
    doc, _ = merge(None, fake_record([fake_result("a")], "triton-1"))
    doc, _ = merge(doc, fake_record([fake_result("b")], "triton-1"))
    doc, changes = merge(doc, fake_record([fake_result("a", salt="new")], "triton-2"))
    assert set(doc["toolchains"]) == {"triton-1", "triton-2"}
    assert set(doc["toolchains"]["triton-1"]["outputs"]) == {"a", "b"}
    assert set(doc["toolchains"]["triton-2"]["outputs"]) == {"a"}
    assert set(doc["cases"]) == {"a", "b"}
    assert "[triton-2] new toolchain section" in changes


def test_merge_refuses_differing_hashes_without_force():
    doc, _ = merge(None, fake_record([fake_result("a"), fake_result("b")]))
    with pytest.raises(GoldenConflict) as info:
        merge(doc, fake_record([fake_result("a"), fake_result("b", salt="x")]))
    text = "\n".join(info.value.conflicts)
    assert "case b: dq: sequence 1, heads 0, 1 differ" in text and "case a" not in text
    forced, changes = merge(doc, fake_record([fake_result("b", salt="x")]), force=True)
    assert forced["toolchains"]["triton-x"]["outputs"]["b"]["tensors"]["out"]["seqs"][0] == (
        "out0ax out0bx"
    )
    assert (
        forced["toolchains"]["triton-x"]["outputs"]["a"]
        == (doc["toolchains"]["triton-x"]["outputs"]["a"])
    )
    assert any("replaced (--force)" in c for c in changes)


def test_merge_replaces_stale_outputs_and_keeps_provenance():
    doc, _ = merge(None, fake_record([fake_result("a")], config="c1"))
    newer = fake_record([fake_result("a", salt="y")], config="c2")
    newer["toolchains"]["triton-x"]["provenance"]["devices"] = ["other"]
    doc2, changes = merge(doc, newer)  # another configuration: expected to differ
    assert any("stale" in c for c in changes)
    assert doc2["toolchains"]["triton-x"]["provenance"]["devices"] == ["dev", "other"]


def test_merge_case_definition_conflict_and_family():
    doc, _ = merge(None, fake_record([fake_result("a")]))
    other = fake_record([fake_result("a", kernel="fixed_order")])
    with pytest.raises(GoldenConflict, match="conflicting"):
        merge(doc, other)
    alien = fake_record([fake_result("z")])
    alien["family"] = "sm90"
    with pytest.raises(GoldenError):
        merge(doc, alien)


# ----------------------------------------------------------------------------- files


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "fake.json"
    old, _ = merge(None, fake_record([fake_result("a")]))
    atomic_write(path, old)
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(path, merge(old, fake_record([fake_result("b")]))[0])
    assert path.read_text() == before and load(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json"]  # temp file removed
    assert dumps(json.loads(before)) == before  # canonical formatting round-trips


def _python(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env)


_WRITER = """
import sys, hashlib
from ci.golden_dev.merging import build_record, merge
from ci.golden_dev.write import update_file
from portattn.tools.golden.cases import Case
from portattn.tools.golden.run import CaseResult
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
import ci.golden_dev.write as store
def half_then_hang(f, text):
    f.write(text[: len(text) // 2]); f.flush(); time.sleep(120)
store._write_text = half_then_hang
doc = store.load(sys.argv[1])
doc["cases_version"] = 99
store.atomic_write(sys.argv[1], doc)
"""


def test_process_killed_mid_write_leaves_old_file(tmp_path):
    path = tmp_path / "fake.json"
    old, _ = merge(None, fake_record([fake_result("a")]))
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


def test_write_through_a_symlinked_golden_file(tmp_path):
    """A golden file that is a symlink (a checkout sharing golden/ elsewhere) is written
    through, not replaced by a regular file."""
    from ci.golden_dev.write import write_record

    real = tmp_path / "elsewhere" / "fake.json"
    real.parent.mkdir()
    golden = tmp_path / "golden"
    golden.mkdir()
    link = golden / "fake.json"
    link.symlink_to(real)
    for salt in ("", "2"):
        record = fake_record([fake_result("a", salt)], toolchain=f"triton-{salt or 1}")
        assert write_record(link, record, False, lambda line: None) == 0
        assert link.is_symlink() and real.is_file()
    assert set(load(real)["toolchains"]) == {"triton-1", "triton-2"}


@pytest.mark.parametrize("family", ["../x", "a/b", "", ".hidden", "sm90.json"])
def test_golden_family_names_stay_in_the_golden_folder(tmp_path, family):
    """run_refresh / run_verify with a family that is no plain name (``../x``) refuse before
    building a path: refresh wrote outside the golden folder."""
    from golden_helpers import capture

    from ci.golden_dev.refresh import run_refresh
    from portattn.tools.golden.verify import run_verify

    golden = tmp_path / "golden"
    golden.mkdir()
    for run in (run_refresh, run_verify):
        lines, out = capture()
        kw = dict(cases=TINY[:1], repeat=1, fingerprint_fn=None) if run is run_refresh else {}
        assert run(family, DEV, golden, out=out, **kw) == 2
        assert "is not a family name" in "\n".join(lines)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["golden"]


def test_golden_file_of_another_family_is_named(tmp_path):
    """sm80's golden file saved as sm90.json: said so, not reported as differing hashes."""
    from golden_helpers import capture

    from portattn.tools.golden.fingerprints import run_fingerprints
    from portattn.tools.golden.verify import run_verify

    record = fake_record([fake_result("a")])
    record["family"] = "sm80"
    path = tmp_path / "sm90.json"
    atomic_write(path, record)
    with pytest.raises(GoldenError, match="holds the golden records of sm80 .*not sm90"):
        load(path, family="sm90")
    assert load(path)["family"] == "sm80"  # without a family to expect: as before
    lines, out = capture()
    assert run_verify("sm90", DEV, tmp_path, out=out) == 2
    assert "holds the golden records of sm80" in "\n".join(lines)
    lines, out = capture()  # the fingerprint check: not "fingerprints differ"
    made = lambda family: {}  # noqa: E731
    assert run_fingerprints(["sm90"], tmp_path, out=out, fingerprint_fn=made) == 2
    assert "holds the golden records of sm80" in "\n".join(lines)
