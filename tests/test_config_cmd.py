"""``python -m portattn config``: the entry a call runs, each field with the row it comes from
(``portattn.configs.sources``, ``portattn.tools.config_cmd``)."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

from portattn import configs
from portattn.configs import rows
from portattn.configs.sources import entry_sources
from portattn.tools.cli import build_parser
from portattn.tools.config_cmd import resolve, run_config

SINCE_39 = "rows.SINCE_TRITON[(3, 9)][('sm90', 'varlen', 128)]"


def _run(*args, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    return run_config(*args, out=out, **kwargs), out.getvalue()


def test_prints_the_installed_tritons_entry_with_its_hash():
    code, text = _run("sm90", "varlen", 128, "bf16")
    assert code == 0
    cfg = configs.entry_config("sm90", "varlen", 128, torch.bfloat16)
    assert f"content hash: {cfg.content_hash()}" in text
    major, minor = configs.supported_triton_version()
    assert f"Triton {major}.{minor}" in text
    for field in dataclasses.fields(configs.KernelConfig):
        assert any(line.startswith(field.name + " ") for line in text.splitlines()), field.name


def test_json_has_every_field_with_its_value_and_source():
    code, text = _run("sm90", "fixed_order", 128, "fp16", as_json=True)
    assert code == 0
    doc = json.loads(text)
    cfg = configs.entry_config("sm90", "fixed_order", 128, torch.float16)
    assert doc["content_hash"] == cfg.content_hash() and doc["dtype"] == "float16"
    assert list(doc["fields"]) == [f.name for f in dataclasses.fields(configs.KernelConfig)]
    assert configs.Tiles(**doc["fields"]["fwd"]["value"]) == cfg.fwd  # unset AMD knobs left out
    assert doc["fields"]["dq_ws"] == {"value": True, "source": "rows.FIXED_ORDER['sm90'][128]"}


def test_a_triton_version_row_is_named_where_it_changes_a_field():
    """Triton 3.9 turns off sm90 varlen d128's warp-specialised forward and dK/dV (its row in
    SINCE_TRITON); the other fields still come from the family's row."""
    entry = resolve("sm90", "varlen", 128, "bf16", triton="3.9")
    assert entry.config == configs.table_for((3, 9))[("sm90", "varlen", 128, torch.bfloat16)]
    sources = {f.name: f.source for f in entry.fields}
    assert sources["fwd_ws"] == sources["bwd_ws"] == SINCE_39
    assert sources["dq_ws"] == sources["fwd"] == "rows.SM90[128]"
    assert entry.steps == ("rows.SM90[128]", SINCE_39, "rows.PAGE_BLOCK['sm90']")
    base = resolve("sm90", "varlen", 128, "bf16", triton="3.6")
    assert base.steps == ("rows.SM90[128]", "rows.PAGE_BLOCK['sm90']")
    assert base.config.content_hash() != entry.config.content_hash()


def test_the_family_page_block_is_named():
    """sm90's paged decode reads the block table a block of key tiles at a time, from the
    family's ``rows.PAGE_BLOCK``; a family without one keeps its row's default (0)."""
    sm90 = {f.name: f for f in resolve("sm90", "fixed_order", 80, "bf16", triton="3.9").fields}
    assert sm90["page_block"].value == rows.PAGE_BLOCK["sm90"]
    assert sm90["page_block"].source == "rows.PAGE_BLOCK['sm90']"
    sm80 = {f.name: f for f in resolve("sm80", "varlen", 64, "fp16", triton="3.6").fields}
    assert sm80["page_block"].value == 0 and sm80["page_block"].source == "rows.SM80[64]"


def test_borrowed_tiles_and_a_derived_decode_kernel():
    """sm90 varlen d200 runs d256's row with a forward of its own; the decode kernel, derived
    from the forward, says so."""
    entry = resolve("sm90", "varlen", 200, "bf16", triton="3.6")
    sources = {f.name: f.source for f in entry.fields}
    own = "rows.BORROWED_TILES[('sm90', 'varlen', 200)]"
    assert entry.row_head_dim == 256 and sources["fwd"] == own
    assert sources["bwd_dq"] == "rows.SM90[256]"
    assert sources["decode"] == f"derived from fwd ({own})"


def test_a_pairs_tiles_after_a_version_row():
    entry = resolve("sm80", "fixed_order", 192, "bf16", head_dim_v=128, triton="3.9")
    assert len(entry.steps) == 3 and entry.steps[1].startswith("rows.SINCE_TRITON[(3, 9)]")
    fwd_chunks = next(f for f in entry.fields if f.name == "fwd_chunks")
    assert fwd_chunks.value == 1 and fwd_chunks.source.startswith("rows.PAIR_SINCE_TRITON")


def test_sources_retrace_every_entry_and_name_real_rows():
    """For every family, kernel, head dim (and the value-head-dim pairs) and Triton version's
    table, the steps build the lookup's entry (``entry_sources`` checks it), each step's label
    is an expression of ``rows`` that names that row (or those tiles), and a field's value is
    that of the step its source names."""
    namespace = {"rows": rows}
    dims = [(d, d) for d in configs.SUPPORTED_HEAD_DIMS] + list(configs.VALUE_HEAD_DIM_PAIRS)
    for triton in configs.table_versions():
        for family in rows.BY_FAMILY:
            for kernel in configs.KERNELS:
                for d, dv in dims:
                    entry = entry_sources(family, kernel, d, torch.bfloat16, dv, triton)
                    built = [eval(label, namespace) for label in entry.steps]  # noqa: S307
                    assert isinstance(built[0], configs.KernelConfig), entry.steps
                    for f in entry.fields:
                        if f.source.startswith("derived"):
                            continue
                        named = built[entry.steps.index(f.source)]
                        if isinstance(named, configs.KernelConfig):
                            assert getattr(named, f.name) == f.value, (entry.steps, f)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sm99", "varlen", 128, "bf16"), "unknown family 'sm99'"),
        (("sm90", "flash", 128, "bf16"), "unknown kernel 'flash'"),
        (("sm90", "varlen", 100, "bf16"), "got 100"),
        (("sm90", "varlen", 128, "fp32"), "unknown dtype 'fp32'"),
    ],
)
def test_unknown_input_is_exit_2_with_a_message(args, message, capsys):
    code, text = _run(*args)
    assert code == 2 and text == ""
    assert message in capsys.readouterr().err


def test_unsupported_version_or_pair_is_exit_2(capsys):
    assert _run("sm90", "varlen", 128, "bf16", triton="3.10")[0] == 2
    assert "3.6 to 3.9" in capsys.readouterr().err
    assert _run("sm90", "varlen", 128, "bf16", head_dim_v=72)[0] == 2
    assert "v head dim" in capsys.readouterr().err


def test_the_command_line():
    """``python -m portattn config`` in a process of its own, as the docs spell it."""
    assert (
        build_parser().parse_args(["config", "--family", "sm90", "--head-dim", "64"]).json is False
    )
    cmd = [sys.executable, "-m", "portattn", "config", "--family", "sm90", "--kernel", "varlen"]
    cmd += ["--head-dim", "128", "--dtype", "bf16", "--json"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    cfg = configs.entry_config("sm90", "varlen", 128, torch.bfloat16)
    assert doc["content_hash"] == cfg.content_hash()
    assert doc["fields"]["fwd"]["source"] == "rows.SM90[128]"
