"""The golden cases of the model features (case list version 3: a sliding window, a softcap,
attention sinks, the borrowed head dim 80, and a paged decode with all three; version 4: v's own
head dim, (192, 128) in both kernels): definitions that
leave the older cases' records byte-compatible, the runner passing each feature through, and
the ``dsinks`` record. Without a GPU each feature case runs as defined but in float16 (the
interpreter mis-computes bfloat16 products)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from golden_helpers import DEV, FAKE, REPO, TC, refresh, verify_reports_difference

import portattn.kernels.buffers as buffers
import portattn.tools.golden.run as golden_run
from ci.golden_dev.merging import case_definition
from portattn.accuracy import rel_err
from portattn.configs import BORROWED_HEAD_DIMS
from portattn.families import FAMILIES
from portattn.reference import reference_varlen_attention
from portattn.tools.golden.cases import CASES, FEATURE_CASES, FEATURE_DEFAULTS, OUTPUTS, Case
from portattn.tools.golden.layout import load
from portattn.tools.golden.run import CaseResult, accuracy, compute_case
from portattn.tools.golden.verify import device_config_hash, family_config_hash, run_verify

FEATURES = ("window_left", "window_right", "softcap", "sinks")  # the fields a feature turns on
SHAPE_FIELDS = ("head_dim_v",)  # fields of a definition that change a shape, not the scores
# Input hashes of the larger cases take seconds each to generate on the CPU; their definitions
# are still compared field by field.
HASHED_ELEMENTS = 500_000


def _elements(case: Case) -> int:
    q_side = sum(case.lens_q) * case.heads_q * (case.head_dim + case.value_dim)
    return q_side + sum(case.lens_k) * case.heads_kv * (case.head_dim + case.value_dim)


def _on(case: Case) -> list[str]:
    return [f for f in FEATURES if getattr(case, f) != FEATURE_DEFAULTS[f]]


# ----------------------------------------------------------------------------- definitions


def test_repository_files_hold_the_current_definitions():
    """Every case a golden/<family>.json lists is still canonical, with the definition it was
    recorded with: new fields at their "off" value are left out of a definition, so the 22
    cases of version 2 serialise (and hash their inputs) exactly as stored."""
    index = {c.name: c for c in CASES}
    for family in FAMILIES:
        doc = load(REPO / "golden" / f"{family}.json")
        if doc is None:
            continue
        for name, stored in doc["cases"].items():
            assert name in index, f"{family}: {name} is no longer a canonical case"
            case = index[name]
            assert Case.from_json(name, stored) == case, (family, name)
            if _elements(case) <= HASHED_ELEMENTS:
                assert case_definition(case) == stored, (family, name)
            else:
                assert case.to_json() | {"inputs_sha256": stored["inputs_sha256"]} == stored


def test_feature_cases_cover_each_feature():
    unpaged = [c for c in FEATURE_CASES if not c.page_size]
    assert any(c.window_left >= 0 or c.window_right >= 0 for c in unpaged)
    assert any(c.softcap > 0 for c in unpaged)
    assert any(c.sinks for c in unpaged)
    assert any(c.head_dim in BORROWED_HEAD_DIMS for c in unpaged)
    assert {c.kernel for c in unpaged if c.head_dim_v} == {"varlen", "fixed_order"}
    assert any(c.page_size and len(_on(c)) == 3 for c in FEATURE_CASES)  # window, cap, sinks
    assert {c.kernel for c in FEATURE_CASES} == {"varlen", "fixed_order"}
    names = {c.name for c in CASES}
    assert len(names) == len(CASES) and set(FEATURE_CASES) <= set(CASES)
    for c in FEATURE_CASES:
        data = c.to_json()
        shaped = {f for f in SHAPE_FIELDS if getattr(c, f) != FEATURE_DEFAULTS[f]}
        assert {k for k in FEATURE_DEFAULTS if k in data} == set(_on(c)) | shaped | (
            {"page_size"} if c.page_size else set()
        )
        assert Case.from_json(c.name, data) == c
        want = OUTPUTS[:2] if c.page_size else OUTPUTS + (("dsinks",) if c.sinks else ())
        assert c.outputs == want


def test_borrowed_head_dim_entry_has_its_rows_configuration_hash():
    """The d80 case's entry hashes as the d96 row it runs with, both from the table of a family
    (what ``golden fingerprints`` compares on the CPU) and from a device (what refresh records),
    so a change of that row marks its outputs stale."""
    for family in FAMILIES:
        by_family = family_config_hash(family)
        assert by_family("fixed_order/d80/bf16") == by_family("fixed_order/d96/bf16") is not None
    here = device_config_hash(DEV)
    assert here("varlen/d48/fp16") == here("varlen/d64/fp16")


def test_value_head_dim_entry_has_its_pair_configuration_hash():
    """A (192, 128) case's entry is labelled as the compile check labels it and hashes as the
    pair entry it runs (the d256 row with the pair's own tiles where it has them, e.g. sm80's
    fixed_order under Triton 3.9), from a family's table and from a device alike."""
    from portattn.configs import entry_config
    from portattn.tools.golden.verify import parse_entry

    case = next(c for c in CASES if c.head_dim_v)
    assert case.entry == f"{case.kernel}/d192v128/{case.dtype}"
    assert parse_entry(case.entry) == (case.kernel, 192, case.torch_dtype, 128)
    assert parse_entry("varlen/d80/fp16") == ("varlen", 80, torch.float16, None)
    for family in FAMILIES:
        want = entry_config(family, "fixed_order", 192, torch.bfloat16, 128).content_hash()
        assert family_config_hash(family)("fixed_order/d192v128/bf16") == want
    here = device_config_hash(DEV)
    assert here("varlen/d192v128/fp16") == here("varlen/d256/fp16")  # no pair tiles here


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(window_left=-2), "window_left / window_right"),
        (dict(window_right=-5), "window_left / window_right"),
        (dict(softcap=-1.0), "softcap"),
        (dict(softcap=float("inf")), "softcap"),
    ],
    ids=str,
)
def test_bad_feature_fields_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        Case("x", "varlen", (3,), (3,), 2, 1, 32, "fp16", True, 1, **bad)


# ----------------------------------------------------------------------------- running them


def _as_run_here(case: Case) -> Case:
    return case if DEV.type == "cuda" else dataclasses.replace(case, dtype="fp16")


@pytest.fixture(scope="module")
def feature_results() -> dict[str, CaseResult]:
    """Each feature case computed once by the runner, its output buffers NaN-filled (the
    autouse poison fixture is function-scoped, so it is set here by hand)."""
    saved, buffers.POISON = buffers.POISON, True
    try:
        return {c.name: compute_case(_as_run_here(c), DEV) for c in FEATURE_CASES}
    finally:
        buffers.POISON = saved


def _forward_reference(case: Case, result: CaseResult, **off) -> torch.Tensor:
    """out of the float64 reference with the case's features as its fields say (each one in
    ``off`` replaced), built here rather than through the runner, whose plumbing is tested."""
    fields = {f: getattr(case, f) for f in FEATURES} | off
    i = result.inputs
    out, _ = reference_varlen_attention(
        i.q,
        i.k,
        i.v,
        i.cu_q,
        i.cu_k,
        causal=case.causal,
        window_size=(fields["window_left"], fields["window_right"]),
        softcap=fields["softcap"],
        sinks=i.sinks if fields["sinks"] else None,
    )
    return out


@pytest.mark.parametrize("name", [c.name for c in FEATURE_CASES])
def test_feature_case_runs_accurate_with_its_features(feature_results, name):
    """The runner's outputs are accurate by the package's rule (2x eager + margin, float64
    reference, no NaN: every element written), dsinks included; and the kernels got every
    feature: out is far closer to the reference with each feature than to the reference with
    that one feature turned off (so a feature dropped on the way fails here)."""
    result = feature_results[name]
    case = result.case
    assert set(result.tensors) == set(case.outputs)
    report = accuracy(result)
    assert [a.tensor for a in report] == list(case.outputs)
    assert all(a.accurate for a in report), [a.describe() for a in report]
    out = result.outputs["out"]
    ref = _forward_reference(case, result)
    err = rel_err(out, ref)
    for feature in _on(case):
        away = rel_err(
            _forward_reference(case, result, **{feature: FEATURE_DEFAULTS[feature]}), ref
        )
        assert away > 10 * err, (feature, away, err)
    if case.sinks:
        assert result.inputs.sinks.dtype == torch.float32
        assert result.inputs.sinks.abs().max() > 2  # twice the generator's values
    if "dsinks" in case.outputs:
        record = result.tensors["dsinks"]
        assert record["shape"] == [case.heads_q] and record["dtype"] == "float32"
        assert len(record["seqs"]) == 1 and len(record["seqs"][0].split()) == case.heads_q


# ----------------------------------------------------------------------------- records

# Tiny feature cases for the refresh / verify round trip (the canonical ones are larger).
TINY_FEATURES = [
    Case(
        "tiny-window-cap-sinks",
        *("varlen", (0, 1, 17), (3, 1, 17), 2, 1, 32, "fp16", True, 8),
        window_left=5,
        softcap=2.0,
        sinks=True,
    ),
    Case(
        "tiny-paged-window-cap-sinks",
        *("fixed_order", (1, 2), (20, 5), 2, 1, 32, "fp16", True, 9),
        dlse=False,
        page_size=16,
        window_left=6,
        softcap=2.0,
        sinks=True,
    ),
]


def _nudge_dsinks(head: int):
    """A run_kernels whose dsinks of ``head`` is one float32 ulp off."""
    real = golden_run.run_kernels

    def run(case, inputs):
        outputs = real(case, inputs)
        if "dsinks" in outputs:
            d = outputs["dsinks"].clone()
            d[head] = torch.nextafter(d[head], torch.tensor(float("inf"), device=d.device))
            outputs["dsinks"] = d
        return outputs

    return run


def test_feature_records_round_trip_and_dsinks_mismatch_is_named(tmp_path, monkeypatch):
    """refresh stores the feature fields and dsinks; verify reads the cases back from the file
    (features included) and matches; a one-ulp change of one head's dsinks is reported as that
    head of dsinks, drifted but accurate."""
    assert refresh(tmp_path, cases=TINY_FEATURES) == 0
    doc = load(tmp_path / f"{FAKE}.json")
    for case in TINY_FEATURES:
        assert Case.from_json(case.name, doc["cases"][case.name]) == case
        assert set(doc["toolchains"][TC]["outputs"][case.name]["tensors"]) == set(case.outputs)
    assert run_verify(FAKE, DEV, tmp_path, out=lambda line: None) == 0

    monkeypatch.setattr(golden_run, "run_kernels", _nudge_dsinks(1))
    text = verify_reports_difference(tmp_path)
    assert "case tiny-window-cap-sinks: dsinks: sequence 0, head 1 differ" in text
    assert "dsinks: rel error" in text and "drifted but accurate" in text
    assert "tiny-paged-window-cap-sinks" in text and "1 of 2 case(s) differ" in text
