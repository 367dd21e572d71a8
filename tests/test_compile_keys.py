"""Compile keys (ci.golden_dev.keys) and the key check CI runs (python -m ci.golden_dev keycheck).

A key must be honest: an edit of one jit function changes the keys of exactly the kernels that
reach it, another Triton changes every key, and a clone at another path computes the same keys.
Keys need Triton's compiler (not the interpreter), so they are computed in child processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from golden_helpers import FAKE, TC, capture

from ci.golden_dev import key_check, keys
from ci.golden_dev.fingerprints import update_fingerprints
from ci.golden_dev.key_check import run_key_check
from ci.golden_dev.merging import merge
from portattn.tools.compile_inputs import GUARDED_PAIRS, guarded_entries
from portattn.tools.compile_launches import CHUNK_STAGES, STAGES
from portattn.tools.golden.layout import load

pytestmark = pytest.mark.triton_version  # keys hash the installed Triton

ROOT = Path(__file__).resolve().parents[1]
# sm90 has the Gluon (warp-specialised) kernels, cdna3 the AMD backend.
KEY_FAMILIES = ("sm90", "cdna3")
_KEYS = """
import json, sys
import ci.golden_dev.keys as ck
families = sys.argv[1].split(",")
keys = {f: ck.family_keys(f) for f in families}
if len(sys.argv) > 2:  # another Triton: its installation's identity differs
    ck.toolchain_identity = lambda: "another Triton"
    ck.toolchain_identity.cache_clear = lambda: None
    keys = {"base": keys, "other": {f: ck.family_keys(f) for f in families}}
json.dump(keys, sys.stdout)
"""


def _keys(tree: Path, *extra: str) -> dict:
    """Compile keys of KEY_FAMILIES computed by a fresh process importing portattn and
    ci.golden_dev from ``tree``, run from ``tree`` (so paths differ when ``tree`` is a copy)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(tree)
    argv = [sys.executable, "-c", _KEYS, ",".join(KEY_FAMILIES), *extra]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def base_keys() -> dict:
    return _keys(ROOT)


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "clone"
    for part in ("portattn", "ci/golden_dev"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("*.pyc"))
    return tree


def _changed(a: dict, b: dict) -> set[tuple[str, str, str]]:
    return {(f, e, s) for f in a for e in a[f] for s in a[f][e] if a[f][e][s] != b[f][e][s]}


def test_keys_cover_every_guarded_kernel(base_keys):
    for family in KEY_FAMILIES:
        labels = {e.label for e in guarded_entries(family)}
        assert set(base_keys[family]) == labels
        assert any(f"v{dv}" in label for _, dv in GUARDED_PAIRS for label in labels)
        for stages in base_keys[family].values():
            # an entry with a key chunk (design §3.1; sm90's d64 / d128) has its chunk stages
            chunked = set(stages) & set(CHUNK_STAGES)
            assert set(stages) - chunked == set(STAGES)
            assert chunked in (set(), set(CHUNK_STAGES)), stages
            assert all(len(k) == 64 for k in stages.values())
        # Every kernel has a key of its own (stage, dtype, head dim, kernel all enter it).
        flat = [k for stages in base_keys[family].values() for k in stages.values()]
        assert len(set(flat)) == len(flat)


def test_an_entry_hashed_alone_has_the_key_of_the_family_check(base_keys):
    """An entry's keys hashed alone, in a fresh process, are those of the family's keys, every
    entry hashed in one process. Under Triton 3.6 a jit function's hash depended on what the
    process hashed before (keys._forget_jit_hashes): sm90's d128 Gluon kernels showed it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    code = (
        "import json; from ci.golden_dev.keys import entry_keys; "
        "from portattn.tools.compile_launches import Entry; "
        "print(json.dumps(entry_keys(Entry('sm90', 'fixed_order', 128, 'fp16'))))"
    )
    argv = [sys.executable, "-c", code]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == base_keys["sm90"]["fixed_order/d128/fp16"]


def test_keys_are_the_same_from_a_clone_at_another_path(base_keys, tmp_path):
    assert _keys(_copy(tmp_path)) == base_keys


def test_editing_a_backward_helper_changes_only_the_backward_keys(base_keys, tmp_path):
    """``recompute_p`` (kernels/primitives.py) is reached by the dK/dV and dQ kernels alone:
    an edit of its body (same line count) changes exactly those keys, of every entry."""
    tree = _copy(tmp_path)
    path = tree / "portattn" / "kernels" / "primitives.py"
    src = path.read_text()
    body = "    return tl.exp2(b_qk * scale_log2 - b_lse2_row)\n"
    assert src.count(body) == 1, "recompute_p's body moved: update this test"
    path.write_text(src.replace(body, body.replace("return ", "return 1.0 * ")))
    changed = _changed(base_keys, _keys(tree))
    expected = {
        (f, e, s)
        for f in KEY_FAMILIES
        for e in base_keys[f]
        for s in STAGES
        if s in ("bwd_dkdv", "bwd_dq")
    }
    assert changed == expected


def test_editing_a_configuration_row_changes_only_its_entries(base_keys, tmp_path):
    """A table row's tiles are launch options and constexprs: doubling the warps of sm90's d64
    forward (configs.rows.SM90) changes the forward keys of the entries that run that row (varlen
    d64, and d40, which borrows it; fixed_order d64 and d40 too, which run the family row since
    perf-notes row 109) and decode's where it shares the forward's tiles, with their chunk stages
    (the entries' key chunk, design §3.1); nothing else."""
    tree = _copy(tmp_path)
    configs = tree / "portattn" / "configs" / "rows.py"
    row = "    64:  _cfg((64, 64, 4, 3),    (64, 128, 8, 2),  (128, 64, 8, 3), "
    row += "tma=(_FWD, _DKDV, _DQ),\n"
    src = configs.read_text()
    assert src.count(row) == 1, "sm90's d64 row moved: update this test"
    configs.write_text(src.replace(row, row.replace("(64, 64, 4, 3)", "(64, 64, 8, 3)")))
    changed = _changed(base_keys, _keys(tree))
    assert ("sm90", "varlen/d64/bf16", "fwd") in changed
    assert ("sm90", "fixed_order/d64/bf16", "fwd") in changed
    for family, label, stage in changed:
        assert family == "sm90" and label.startswith(("varlen/", "fixed_order/")), label
        assert stage in ("fwd", "decode", *CHUNK_STAGES), (label, stage)
        assert "/d64/" in label or "/d40/" in label, label


def test_another_triton_changes_every_key():
    keys = _keys(ROOT, "other")
    base, other = keys["base"], keys["other"]
    assert len(_changed(base, other)) == sum(len(s) for f in base for s in base[f].values())


# ----------------------------------------------------------------------------- the key check


def _record(fp: str, key: str, ok: bool = True) -> dict:
    return {"fingerprint": fp, "key": key, "ok": ok, "failures": [] if ok else ["spills (8)"]}


ENTRIES = {
    "varlen/d32/fp16": {"fwd": _record("f1", "k1"), "bwd_dq": _record("g1", "k2")},
    "fixed_order/d32/fp16": {"fwd": _record("f3", "k3"), "bwd_dq": _record("g3", "k4")},
}


def _keys_of(made: dict) -> dict:
    return {e: {s: r["key"] for s, r in stages.items()} for e, stages in made.items()}


def _check(tmp_path, keys: dict, compiled: dict) -> tuple[int, list[str], list]:
    calls = []

    def compile_fn(family, stages_of):
        calls.append(stages_of)
        return {label: {s: compiled[label][s] for s in st} for label, st in stages_of.items()}

    lines, out = capture()
    code = run_key_check(
        [FAKE], tmp_path, out=out, key_fn=lambda f: keys, compile_fn=compile_fn, toolchain=TC
    )
    return code, lines, calls


def test_key_check_compiles_only_changed_entries(tmp_path):
    made = lambda family: ENTRIES  # noqa: E731
    assert update_fingerprints([FAKE], tmp_path, fingerprint_fn=made, toolchain=TC) == 0
    assert load(tmp_path / f"{FAKE}.json")["toolchains"][TC]["keys"] == _keys_of(ENTRIES)

    # Nothing changed: nothing compiled, exit 0.
    code, lines, calls = _check(tmp_path, _keys_of(ENTRIES), ENTRIES)
    assert (code, calls) == (0, []) and "compile keys match" in lines[0]
    assert lines[-1].endswith("0 s compiling 0 entries whose keys changed")

    # One kernel's key changed, same machine code: compiled alone, the stale key fails.
    keys = _keys_of(ENTRIES) | {"varlen/d32/fp16": {"fwd": "k1x", "bwd_dq": "k2"}}
    code, lines, calls = _check(tmp_path, keys, ENTRIES)
    assert (code, calls) == (1, [{"varlen/d32/fp16": ["fwd"]}])
    assert any("machine code unchanged, recorded keys stale (1 kernels)" in ln for ln in lines)

    # Changed key and changed machine code: the kernel is named.
    changed = dict(ENTRIES, **{"varlen/d32/fp16": dict(ENTRIES["varlen/d32/fp16"])})
    changed["varlen/d32/fp16"]["fwd"] = _record("f2", "k1x")
    code, lines, calls = _check(tmp_path, keys, changed)
    assert code == 1 and any(
        "machine code differs (1 kernels): varlen/d32/fp16/fwd" in ln for ln in lines
    )

    # A failed check is reported and the entry is not keyed by --update.
    failing = dict(changed)
    failing["varlen/d32/fp16"] = dict(changed["varlen/d32/fp16"], bwd_dq=_record("g1", "k2", False))
    keys["varlen/d32/fp16"]["bwd_dq"] = "k2x"
    code, lines, _ = _check(tmp_path, keys, failing)
    assert code == 1 and any("check failed: varlen/d32/fp16/bwd_dq: spills" in ln for ln in lines)
    made = lambda family: failing  # noqa: E731
    assert update_fingerprints([FAKE], tmp_path, fingerprint_fn=made, toolchain=TC) == 1
    stored = load(tmp_path / f"{FAKE}.json")["toolchains"][TC]
    assert "varlen/d32/fp16" not in stored["keys"] and "fixed_order/d32/fp16" in stored["keys"]


def test_key_check_without_keys_or_with_a_new_entry(tmp_path):
    code, lines, _ = _check(tmp_path, _keys_of(ENTRIES), ENTRIES)
    assert code == 2 and lines == [lines[0]] and "no fingerprints" in lines[0]

    def fps_only(family):
        return {e: {s: r["fingerprint"] for s, r in st.items()} for e, st in ENTRIES.items()}

    assert update_fingerprints([FAKE], tmp_path, fingerprint_fn=fps_only, toolchain=TC) == 0
    code, lines, _ = _check(tmp_path, _keys_of(ENTRIES), ENTRIES)
    assert code == 2 and lines == [lines[0]] and "no compile keys" in lines[0]
    made = lambda family: ENTRIES  # noqa: E731
    assert update_fingerprints([FAKE], tmp_path, fingerprint_fn=made, toolchain=TC) == 0
    new = {"varlen/d40/bf16": {"fwd": _record("n1", "kn"), "bwd_dq": _record("n2", "kn2")}}
    code, lines, calls = _check(tmp_path, _keys_of(ENTRIES | new), ENTRIES | new)
    assert (code, calls) == (1, [{"varlen/d40/bf16": ["bwd_dq", "fwd"]}])
    assert any("varlen/d40/bf16/fwd" in ln for ln in lines)


def test_merge_drops_the_key_of_fingerprints_recorded_without_one():
    """A GPU refresh records fingerprints without keys: a changed fingerprint loses its stored
    key, so the key check compiles that entry again instead of trusting the old key."""
    doc = {"schema": 1, "family": FAKE, "cases": {}, "toolchains": {}}
    keyed = {"fingerprints": {"a": {"fwd": "f1"}, "b": {"fwd": "g1"}}}
    keyed["keys"] = {"a": {"fwd": "k1"}, "b": {"fwd": "k2"}}
    doc, _ = merge(doc, {"family": FAKE, "cases": {}, "toolchains": {TC: keyed}})
    refreshed = {"fingerprints": {"a": {"fwd": "f2"}, "b": {"fwd": "g1"}}}
    doc, changes = merge(doc, {"family": FAKE, "cases": {}, "toolchains": {TC: refreshed}})
    assert doc["toolchains"][TC]["keys"] == {"b": {"fwd": "k2"}}
    # A full compile (--update: it records keys) drops entries it no longer compiles.
    update = {"fingerprints": {"b": {"fwd": "g1"}}, "keys": {"b": {"fwd": "k2"}}}
    doc, changes = merge(doc, {"family": FAKE, "cases": {}, "toolchains": {TC: update}})
    assert set(doc["toolchains"][TC]["fingerprints"]) == {"b"}
    assert any("removed for 1 entries no longer compiled: a" in c for c in changes)


def test_keyed_records_attach_each_kernels_key(monkeypatch):
    """``fingerprints --update`` records the package's compile records (which hold no key)
    with the keys of ci.golden_dev.keys attached, kernel by kernel."""
    import portattn.tools.golden.fingerprints as package_fingerprints

    def compile_records(family):
        return {
            label: {s: {k: v for k, v in r.items() if k != "key"} for s, r in stages.items()}
            for label, stages in ENTRIES.items()
        }

    monkeypatch.setattr(package_fingerprints, "compile_records", compile_records)
    monkeypatch.setattr(keys, "family_keys", lambda family: _keys_of(ENTRIES))
    assert keys.keyed_records(FAKE) == ENTRIES


def test_a_family_outside_the_table_has_no_keys():
    assert keys.family_keys(FAKE) == {}


def test_compile_changed_compiles_whole_entries(monkeypatch):
    """The key check compiles each changed entry whole (its stages in order in one process, as
    when golden/ was recorded) and reads the changed stages' records."""
    calls = []

    def compile_entries(family, labels):
        calls.append((family, labels))
        return {label: ENTRIES[label] for label in labels if label in ENTRIES}

    monkeypatch.setattr(key_check, "compile_entries", compile_entries)
    changed = {"varlen/d32/fp16": ["fwd"], "varlen/d40/bf16": ["bwd_dq"]}
    made = key_check.compile_changed(FAKE, changed)
    assert calls == [(FAKE, ["varlen/d32/fp16", "varlen/d40/bf16"])]
    assert made == {
        "varlen/d32/fp16": {"fwd": ENTRIES["varlen/d32/fp16"]["fwd"]},
        "varlen/d40/bf16": {},
    }


def test_keycheck_command_without_recorded_keys(tmp_path, capsys):
    """``python -m ci.golden_dev keycheck``: exit 2 naming the recording command when golden/
    holds no fingerprints or keys for this Triton, before any key is computed."""
    from ci.golden_dev.__main__ import main

    argv = ["keycheck", "--no-compile", "--family", "sm80", "--golden-dir", str(tmp_path)]
    assert main(argv) == 2
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("sm80: no fingerprints for ")
    assert line.endswith("run python -m ci.golden_dev fingerprints --update")
