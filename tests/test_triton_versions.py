"""Supported Triton versions: the range check at the first lookup, and the per-version rows of
the configuration table (``portattn.configs``)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from helpers import ROOT, python_stdout

from portattn import configs
from portattn.families import FAMILIES

# Compiles, Triton APIs or the installed Triton's table: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version

CPU = torch.device("cpu")


@pytest.fixture
def triton_version(monkeypatch):
    """Pretend the installed Triton is ``version`` (the table is rebuilt, then again after)."""

    def pretend(version: str) -> None:
        monkeypatch.setattr(configs.triton_gate, "installed_triton", lambda: version)
        configs.config_table.cache_clear()

    yield pretend
    configs.config_table.cache_clear()


# ----------------------------------------------------------------------------- the range


@pytest.mark.parametrize("version", ["3.5.1", "3.10.0", "4.0.0", "2.3.1"])
def test_unsupported_triton_fails_at_first_lookup(triton_version, version):
    """Outside the range the launch path's config lookup raises, naming the version found and
    the supported range, before any kernel is compiled; and again on the next call."""
    triton_version(version)
    for _ in range(2):
        with pytest.raises(configs.UnsupportedTritonError) as info:
            configs.resolve_config(CPU, "varlen", 64, torch.float16)
        message = str(info.value)
        assert version in message and ">=3.6,<3.10" in message, message
    assert isinstance(info.value, RuntimeError)


def test_unsupported_triton_fails_through_the_api(triton_version):
    """The public entry point reaches the check (on the CPU through the interpreter's row)."""
    from portattn import varlen_attention

    triton_version("3.5.0")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.zeros(8, 2, 64, dtype=torch.float16, device=device)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    with pytest.raises(configs.UnsupportedTritonError, match="3.5.0"):
        varlen_attention(q, q, q, cu, cu, 8, 8)


@pytest.mark.parametrize(
    ("version", "parsed"),
    [
        ("3.6.0", (3, 6)),
        ("3.7.1", (3, 7)),
        ("3.8.0", (3, 8)),
        ("3.9.0", (3, 9)),
        ("3.6.0+rocm7.0.0.git1234abcd", (3, 6)),  # ROCm's pytorch-triton-rocm
        ("3.9.0rc2", (3, 9)),
    ],
)
def test_supported_versions_pass(triton_version, version, parsed):
    triton_version(version)
    assert configs.supported_triton_version() == parsed
    assert configs.resolve_config(CPU, "varlen", 64, torch.float16) is not None


def test_unreadable_version_is_refused(triton_version):
    triton_version("unknown")
    with pytest.raises(configs.UnsupportedTritonError, match="unknown"):
        configs.config_table()


def test_check_runs_once(triton_version, monkeypatch):
    """The version is read at the first lookup only (the table is cached)."""
    calls = []
    monkeypatch.setattr(configs.triton_gate, "installed_triton", lambda: calls.append(1) or "3.9.0")
    configs.config_table.cache_clear()
    for _ in range(3):
        configs.get_config("sm90", "varlen", 128, torch.bfloat16)
    assert len(calls) == 1


def test_version_comes_from_the_module(monkeypatch):
    """``triton.__version__``, not package metadata (absent for pytorch-triton-rocm)."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.7.1+rocm")
    assert configs.installed_triton() == "3.7.1+rocm"


def test_import_checks_no_version():
    """Importing portattn under an unsupported Triton succeeds; the first lookup fails."""
    code = (
        "import triton; triton.__version__ = '3.5.0'; import portattn, portattn.configs as c\n"
        "try:\n    c.config_table()\nexcept c.UnsupportedTritonError as e:\n    print('raised', e)"
    )
    out = python_stdout(code)
    assert out.startswith("raised") and "3.5.0" in out


def test_pyproject_states_the_range():
    """The dependency bound and SUPPORTED_TRITON say the same."""
    # (a regex, not tomllib: Python 3.10 is supported and has none)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (triton,) = re.findall(r'^\s*"(triton\b[^"]*)",', pyproject, flags=re.M)
    (low_major, low_minor), (high_major, high_minor) = configs.SUPPORTED_TRITON
    assert triton.replace(" ", "") == f"triton>={low_major}.{low_minor},<{high_major}.{high_minor}"


# ----------------------------------------------------------------------------- per-version rows


def test_lowest_version_runs_the_base_rows():
    """Below the first override every entry is its base row (with its family's paged-decode
    block-table reads, ``rows.PAGE_BLOCK``): what Triton 3.6 compiles is the table without
    ``rows.SINCE_TRITON``."""
    base = configs.table_for(configs.SUPPORTED_TRITON[0])
    for (family, kernel, head_dim, _), cfg in base.items():
        row = configs.base_row(family, kernel, head_dim)
        assert cfg is configs.lookup.with_page_block(row, family)
        assert cfg.page_block == configs.rows.PAGE_BLOCK.get(family, 0)
    assert min(configs.rows.SINCE_TRITON) > configs.SUPPORTED_TRITON[0]


def test_overrides_are_real_entries_that_change_something():
    low, high = configs.SUPPORTED_TRITON
    for since, rows in configs.rows.SINCE_TRITON.items():
        assert low < since < high, since
        for (family, kernel, head_dim), cfg in rows.items():
            assert family in FAMILIES, family  # never the interpreter's row
            assert kernel in configs.KERNELS and head_dim in configs.HEAD_DIMS
            assert cfg != configs.base_row(family, kernel, head_dim), (since, family, head_dim)


def test_each_version_takes_its_latest_override():
    """An override holds from its version on, until a later one for the same entry."""
    versions = configs.table_versions()
    assert versions[0] == configs.SUPPORTED_TRITON[0] and list(versions) == sorted(versions)
    for version in versions:
        table = configs.table_for(version)
        for (family, kernel, head_dim, _), cfg in table.items():
            applying = [s for s in configs.rows.SINCE_TRITON if s <= version]
            rows = [
                configs.rows.SINCE_TRITON[s][(family, kernel, head_dim)]
                for s in sorted(applying)
                if (family, kernel, head_dim) in configs.rows.SINCE_TRITON[s]
            ]
            row = rows[-1] if rows else configs.base_row(family, kernel, head_dim)
            assert cfg == configs.lookup.with_page_block(row, family)


def test_retuned_keeps_the_amd_knobs():
    row = configs.rows.CDNA3[128]
    new = configs.retuned(row, fwd=(128, 64, 4, 1, 1))
    assert new.fwd == configs.Tiles(128, 64, 4, 1, waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1)
    assert (new.bwd_pre, new.bwd_dkdv, new.bwd_dq) == (row.bwd_pre, row.bwd_dkdv, row.bwd_dq)
    cuda = configs.retuned(configs.rows.SM90[128], fwd_ws=False)
    assert not cuda.fwd_ws and cuda.fwd == configs.rows.SM90[128].fwd


def test_triton_39_runs_sm90_d128_forward_and_dkdv_as_triton_kernels():
    """Triton 3.9's ptxas spills the warp-specialised forward and dK/dV at varlen d128: that
    entry turns them off (and keeps the warp-specialised dQ) from 3.9 on, not before."""
    key = ("sm90", "varlen", 128, torch.bfloat16)
    for version in ((3, 6), (3, 7), (3, 8)):
        cfg = configs.table_for(version)[key]
        assert cfg.fwd_ws and cfg.bwd_ws and cfg.dq_ws, version
    cfg = configs.table_for((3, 9))[key]
    assert not cfg.fwd_ws and not cfg.bwd_ws and cfg.dq_ws
    assert cfg.fwd == configs.table_for((3, 6))[key].fwd  # same tiles: the same bits


def test_sm80_decode_kernels_keep_the_forward_tiles():
    """On the H200 under the sm80 override, a decode kernel with other query rows and warps
    than its forward gave decode rows other lse bits than the prefill's; the key tile decides
    a row's bits too. So in every version's table, every sm80 decode kernel whose forward has
    at most 64 rows (the decode kernel's cap) keeps the forward's rows, warps and key tile;
    Triton 3.9's fixed_order d256 splits the head dim of both kernels instead (its decode
    kernel spills at the forward's tiles)."""
    for version in configs.table_versions():
        for (family, kernel, head_dim, _), cfg in configs.table_for(version).items():
            if family != "sm80" or cfg.fwd.block_m > 64:
                continue
            dec, fwd = cfg.decode_tiles(), cfg.fwd
            same = (dec.block_m, dec.num_warps, dec.block_n) == (
                fwd.block_m,
                fwd.num_warps,
                fwd.block_n,
            )
            assert same, (version, kernel, head_dim, dec, fwd)
    key = ("sm80", "fixed_order", 256, torch.float16)
    old, new = configs.table_for((3, 6))[key], configs.table_for((3, 9))[key]
    assert (old.fwd_chunks, new.fwd_chunks) == (1, 2)
    assert new == dataclasses.replace(old, fwd_chunks=2)
