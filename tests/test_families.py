"""GPU families, detection from (mocked) device properties, and the configuration table."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, python_stdout

import portattn
from portattn import configs, families
from portattn.configs import DTYPES, HEAD_DIMS, INTERPRETER, KERNELS, KernelConfig, Tiles, rows
from portattn.families import FAMILIES, family_from_properties, nearest_family
from portattn.kernels import decode
from portattn.tools import compilecheck
from portattn.tools.compile_artifacts import MMA_PATTERNS
from portattn.tools.compile_launches import CHECKED_STAGES, entry_stages

# Compiles, Triton APIs or the installed Triton's table: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version

AMD_KNOBS = {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
CUDA_FAMILIES = ("sm80", "sm90", "sm100", "sm120")
HIP_FAMILIES = ("cdna2", "cdna3", "cdna4")


def cuda_props(major: int, minor: int, **extra) -> SimpleNamespace:
    return SimpleNamespace(major=major, minor=minor, name="NVIDIA test device", **extra)


def hip_props(arch: str) -> SimpleNamespace:
    # ROCm reports a CUDA-like (major, minor) too; detection must use gcnArchName only.
    return SimpleNamespace(major=9, minor=4, name="AMD test device", gcnArchName=arch)


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.fixture
def on_rocm(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")


# ----------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("cc", "expected"),
    [((8, 0), "sm80"), ((9, 0), "sm90"), ((10, 0), "sm100"), ((12, 0), "sm120")],
)
def test_cuda_detection(on_cuda, cc, expected):
    assert family_from_properties(cuda_props(*cc)) == expected


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gfx90a", "cdna2"),
        ("gfx942", "cdna3"),
        ("gfx950", "cdna4"),
        ("gfx942:sramecc+:xnack-", "cdna3"),
        ("gfx90a:sramecc-:xnack+", "cdna2"),
        ("gfx950:sramecc+:xnack-", "cdna4"),
    ],
)
def test_rocm_detection(on_rocm, arch, expected):
    assert family_from_properties(hip_props(arch)) == expected


def test_rocm_detection_ignores_compute_capability(on_rocm):
    # An MI300X reports major 9: it must not be taken for an H100.
    assert family_from_properties(SimpleNamespace(major=9, minor=0, gcnArchName="gfx942")) == (
        "cdna3"
    )


@pytest.mark.parametrize(
    ("cc", "extra", "nearest"),
    [
        ((8, 6), {}, "sm80"),
        ((8, 9), {}, "sm80"),
        ((7, 5), {}, "sm80"),
        ((9, 1), {}, "sm90"),
        ((9, 1), {"shared_memory_per_block_optin": 101376}, "sm80"),
        ((10, 3), {"shared_memory_per_block_optin": 232448}, "sm100"),  # B300
        ((10, 3), {}, "sm100"),
        ((11, 0), {"shared_memory_per_block_optin": 232448}, "sm100"),
        ((10, 3), {"shared_memory_per_block_optin": 101376}, "sm80"),
        ((12, 1), {"shared_memory_per_block_optin": 101376}, "sm120"),  # GB10
        ((12, 1), {}, "sm120"),
        ((12, 1), {"shared_memory_per_block_optin": 65536}, "sm80"),
    ],
)
def test_unknown_cuda_device(on_cuda, cc, extra, nearest):
    props = cuda_props(*cc, **extra)
    assert family_from_properties(props) is None
    assert nearest_family(props) == nearest


@pytest.mark.parametrize(
    ("arch", "nearest"),
    [
        ("gfx1100", "cdna2"),
        ("gfx908:sramecc+:xnack-", "cdna2"),
        ("gfx940", "cdna3"),
        ("gfx941:sramecc+:xnack-", "cdna3"),
        ("gfx955", "cdna4"),
    ],
)
def test_unknown_rocm_device(on_rocm, arch, nearest):
    props = hip_props(arch)
    assert family_from_properties(props) is None
    assert nearest_family(props) == nearest


def _fake_device(monkeypatch, props) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    families._family_of_index.cache_clear()
    families._config_family_of_index.cache_clear()


@pytest.fixture
def clear_family_caches(monkeypatch):
    """Fresh detection for a faked device, without the family override (the GPU suite also
    runs under ``$PORTATTN_FAMILY_OVERRIDE``; tests/test_family_override.py covers it)."""
    monkeypatch.setattr(families, "family_override", lambda device=None: None)
    yield
    families._family_of_index.cache_clear()
    families._config_family_of_index.cache_clear()


def test_family_reads_the_running_device(on_rocm, monkeypatch, clear_family_caches):
    _fake_device(monkeypatch, hip_props("gfx942:sramecc+:xnack-"))
    assert portattn.family() == "cdna3"
    assert families.config_family(torch.device("cuda", 0)) == "cdna3"


def test_unknown_device_runs_nearest_family(on_cuda, monkeypatch, clear_family_caches):
    _fake_device(monkeypatch, cuda_props(8, 9))
    assert portattn.family() is None  # no golden family
    assert families.config_family(torch.device("cuda", 0)) == "sm80"


def test_family_is_none_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert portattn.family() is None


def test_family_descriptions():
    assert set(FAMILIES) == set(CUDA_FAMILIES + HIP_FAMILIES)
    for name in CUDA_FAMILIES:
        fam = FAMILIES[name]
        assert (fam.vendor, fam.warp_size) == ("cuda", 32)
        assert fam.target().backend == "cuda" and fam.target().arch == fam.arch
    for name in HIP_FAMILIES:
        fam = FAMILIES[name]
        assert (fam.vendor, fam.warp_size, fam.matrix_instruction) == ("hip", 64, "v_mfma")
        assert fam.target().arch == fam.arch
    assert FAMILIES["sm80"].matrix_instruction == "mma.sync"
    assert FAMILIES["sm90"].matrix_instruction == "wgmma"
    assert FAMILIES["sm100"].matrix_instruction == "tcgen05"
    assert FAMILIES["sm120"].matrix_instruction == "mma.sync"
    assert FAMILIES["sm90"].shared_mem_bytes == FAMILIES["sm100"].shared_mem_bytes == 227 * 1024
    assert FAMILIES["sm120"].shared_mem_bytes == 99 * 1024
    for name in CUDA_FAMILIES:  # every instruction has its pattern in the compile check
        assert FAMILIES[name].matrix_instruction in MMA_PATTERNS
    assert FAMILIES["cdna2"].shared_mem_bytes == FAMILIES["cdna3"].shared_mem_bytes == 64 * 1024
    assert FAMILIES["cdna4"].shared_mem_bytes == 160 * 1024


# ----------------------------------------------------------------------------- the table


def test_table_is_complete():
    table = configs.config_table()
    expected = {
        (fam, kernel, d, dtype)
        for fam in (*FAMILIES, INTERPRETER)
        for kernel in KERNELS
        for d in HEAD_DIMS
        for dtype in DTYPES
    }
    assert set(table) == expected
    assert all(isinstance(cfg, KernelConfig) for cfg in table.values())


def all_tables() -> list[tuple[tuple[int, int], dict]]:
    """The table of every supported Triton version whose rows differ (configs.table_versions)."""
    return [(version, configs.table_for(version)) for version in configs.table_versions()]


def test_tiles_are_valid():
    def pow2(n: int) -> bool:
        return n > 0 and n & (n - 1) == 0

    for key, cfg in ((k, c) for _, table in all_tables() for k, c in table.items()):
        for tiles in [cfg.stage_tiles(stage) for stage in compilecheck.STAGES] + [cfg.bwd_dv]:
            if tiles is None:
                continue
            assert pow2(tiles.block_m) and pow2(tiles.block_n), key
            assert tiles.block_m >= 16 and tiles.block_n >= 16, key  # tl.dot's minimum
            assert pow2(tiles.num_warps) and tiles.num_stages >= 1, key


# The hashing scheme itself (canonical JSON of the entry): this literal must never change.
SCHEME_CONFIG = KernelConfig(
    Tiles(128, 64, 4, 3), Tiles(64, 64, 4, 1), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2)
)
SCHEME_HASH = "68256b6b84ac31a1"
# A table entry (of the base table, Triton 3.6's): changes only when that entry is retuned (then
# golden files are re-recorded; last: decode_ws set in session 48, golden/sm90.json refreshed).
SM90_VARLEN_D128 = "53e53156e28afe2e"


def test_config_hash_stability():
    assert SCHEME_CONFIG.content_hash() == SCHEME_HASH
    base = configs.table_for(configs.SUPPORTED_TRITON[0])
    assert base[("sm90", "varlen", 128, torch.bfloat16)].content_hash() == SM90_VARLEN_D128


def test_config_hash_identifies_content():
    configs_by_hash: dict[str, KernelConfig] = {}
    for cfg in (c for _, table in all_tables() for c in table.values()):
        assert configs_by_hash.setdefault(cfg.content_hash(), cfg) == cfg
    # Equal content, equal hash; any changed field, another hash.
    same = KernelConfig(*(Tiles(**vars(getattr(SCHEME_CONFIG, s))) for s in configs.TILE_FIELDS))
    assert same.content_hash() == SCHEME_HASH
    other = KernelConfig(
        Tiles(128, 64, 4, 2), SCHEME_CONFIG.bwd_pre, SCHEME_CONFIG.bwd_dkdv, SCHEME_CONFIG.bwd_dq
    )
    assert other.content_hash() != SCHEME_HASH
    amd = Tiles(128, 64, 4, 3, waves_per_eu=2)
    other = KernelConfig(amd, SCHEME_CONFIG.bwd_pre, SCHEME_CONFIG.bwd_dkdv, SCHEME_CONFIG.bwd_dq)
    assert other.content_hash() != SCHEME_HASH
    # dkdv_passes enters the hash only when it is not its default (older hashes stay valid).
    assert dataclasses.replace(SCHEME_CONFIG, dkdv_passes=1).content_hash() == SCHEME_HASH
    passes = {dataclasses.replace(SCHEME_CONFIG, dkdv_passes=n).content_hash() for n in (2, 4)}
    assert len(passes) == 2 and SCHEME_HASH not in passes


def test_page_block_in_no_hash():
    """``page_block`` is a family's way of reading a paged cache's block table, the same bits
    either way (tests/test_kvcache.py), so it enters no content hash: golden/'s hashes of sm90,
    recorded before the field, stay its entries' (the machine code is in the fingerprints)."""
    for blocks in (0, 1, 16):
        assert dataclasses.replace(SCHEME_CONFIG, page_block=blocks).content_hash() == SCHEME_HASH
    sm90 = configs.table_for(configs.SUPPORTED_TRITON[0])[("sm90", "varlen", 128, torch.bfloat16)]
    assert sm90.page_block == rows.PAGE_BLOCK["sm90"] > 0
    assert sm90.content_hash() == SM90_VARLEN_D128
    for (family, *_), cfg in (kv for _, table in all_tables() for kv in table.items()):
        assert cfg.page_block == rows.PAGE_BLOCK.get(family, 0), family
    with pytest.raises(ValueError, match="page_block"):
        dataclasses.replace(SCHEME_CONFIG, page_block=12)


@pytest.mark.parametrize("fam", [*FAMILIES, INTERPRETER])
def test_launch_kwargs_per_family(fam):
    for (name, _, _, _), cfg in ((k, c) for _, table in all_tables() for k, c in table.items()):
        if name != fam:
            continue
        for stage in compilecheck.STAGES:
            kwargs = cfg.stage_tiles(stage).launch_kwargs()
            assert {"num_warps", "num_stages"} <= set(kwargs)
            if fam in HIP_FAMILIES:
                assert set(kwargs) >= AMD_KNOBS
                assert kwargs["matrix_instr_nonkdim"] in (16, 32)
            else:
                assert not AMD_KNOBS & set(kwargs)


# Per stage: the warp-specialised Gluon kernel and the table field that selects it.
WS_BY_STAGE = {
    "fwd": ("attn_fwd_ws_kernel", "fwd_ws"),
    "bwd_dkdv": ("attn_bwd_dkdv_ws_kernel", "bwd_ws"),
    "bwd_dq": ("attn_bwd_dq_ws_kernel", "dq_ws"),
    "decode": ("attn_decode_ws_kernel", "decode_ws"),
    "decode_split": ("attn_decode_ws_kernel", "decode_ws"),  # where decode.GLUON_SPLIT is on
}


@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("kernel", KERNELS)
def test_launchers_take_parameters_from_table(fam, kernel):
    """The real launchers (run on CPU tensors, kernels swapped for recorders) launch each of the
    four kernels with exactly the table's tiles and options: AMD knobs on CDNA only."""
    for d in HEAD_DIMS:
        entry = compilecheck.Entry(fam, kernel, d, "bf16")
        cfg = entry.config()
        launches = compilecheck.record_launches(entry)
        # the record's problem is causal: each pass is followed by its repair pass (design §3.2)
        assert set(launches) == set(entry_stages(cfg, CHECKED_STAGES))
        for stage, group in launches.items():
            two = stage == "bwd_dkdv_repair" or (stage == "bwd_dkdv" and cfg.dkdv_passes > 1)
            assert len(group) == (2 if two else 1), (entry, stage)  # dK/dV repair: one per gradient
            for launch in group:
                assert compilecheck.table_mismatches(launch, cfg) == [], (entry, stage)
                has_amd = bool(AMD_KNOBS & set(launch.options))
                assert has_amd == (fam in HIP_FAMILIES), (entry, stage)
                assert launch.args["HEAD_DIM"] == d
                # the chunk merge's forward (an entry with a key chunk) is the forward's kernel;
                # a decode with chunk merges is decode.py's (outside the Gluon decode's scope)
                base = stage if stage.startswith("decode") else stage.removesuffix("_chunked")
                ws_kernel, ws_field = WS_BY_STAGE.get(base, (None, None))
                gluon = bool(ws_field and getattr(cfg, ws_field))
                gluon &= base != "decode_split" or decode.GLUON_SPLIT
                if launch.fn.__name__ == ws_kernel:  # Gluon: power-of-2 head dims
                    assert gluon and d == triton_next_pow2(d), (entry, stage)
                else:
                    assert launch.args["BLOCK_D"] == triton_next_pow2(d)
                    assert not gluon, (entry, stage)


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_import_builds_no_table():
    code = (
        "import portattn, portattn.configs as c, portattn.families as f; "
        "print(c.config_table.cache_info().currsize, f._family_of_index.cache_info().currsize)"
    )
    assert python_stdout(code).split() == ["0", "0"]


def test_family_accepts_device_forms(monkeypatch):
    """family() takes None, an index, a string or a torch.device (golden's CLI passes one)."""
    import portattn.families as fam

    monkeypatch.setattr(fam.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fam.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fam, "_family_of_index", lambda index: f"fam{index}")
    assert fam.family() == "fam0"
    assert fam.family(1) == "fam1"
    assert fam.family("cuda:1") == "fam1"
    assert fam.family(torch.device("cuda", 1)) == "fam1"
    assert fam.family(torch.device("cuda")) == "fam0"
    assert fam.family("cpu") is None


@pytest.mark.parametrize("cuda", [False, True], ids=["no-cuda", "faked-cuda"])
def test_family_rejects_other_arguments(monkeypatch, cuda):
    """Anything but None, an index, a device string or a torch.device is a TypeError (bools
    included), a string that names no device or a negative index a ValueError, with or
    without a GPU (without one, family(123) was None for any argument)."""
    import portattn.families as fam

    monkeypatch.setattr(fam.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(fam.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fam, "_family_of_index", lambda index: f"fam{index}")
    for bad in (1.5, True, [0], b"cuda", object()):
        with pytest.raises(TypeError, match="device must be a torch.device, a str"):
            fam.family(bad)
    for bad, match in (("bogus", "'bogus' names no device"), (-1, "index must be >= 0")):
        with pytest.raises(ValueError, match=match):
            fam.family(bad)
    assert fam.family(123) == ("fam123" if cuda else None)


def test_ci_names_every_family():
    """The nox GPU sessions, the GPU CI job and the workflow's family lists are the table's."""
    table = list(FAMILIES)
    nox_line = re.search(r"^FAMILIES = \((.*)\)$", (ROOT / "noxfile.py").read_text(), re.M)
    assert [f.strip(' "') for f in nox_line[1].split(",")] == table
    gpu_sh = (ROOT / "ci" / "gpu.sh").read_text()
    assert re.search(r"^  ([\w|]+)\) family=", gpu_sh, re.M)[1].split("|") == table
    workflow = (ROOT / "ci" / "github" / "portattn.yml").read_text()
    assert re.search(r"options: \[(.*)\]", workflow)[1].split(", ") == table
    matrix = re.search(r"PORTATTN_GPU_FAMILIES \|\| '(\[.*\])'", workflow)[1]
    assert json.loads(matrix) == table


def test_family_status_table():
    """docs/families.md's table of what each family has been shown to do stays true: one row
    per family of the table, compiled and tile-checked for all (what CI runs for every family:
    the compile check of every entry for the fingerprints, under 3.6 and 3.9, and
    tests/test_family_tiles.py), and the hashes column says "yes" exactly where
    golden/<family>.json holds output hashes (of some Triton version) recorded on the family's
    own hardware, "provisional" where they carry the override's provisional mark."""
    text = (ROOT / "docs" / "families.md").read_text()
    section = text.split("## What each family has been shown to do", 1)[1]
    rows = [ln for ln in section.splitlines() if re.match(r"\| `\w+` \|", ln)]
    cells = {}
    for line in rows[: len(FAMILIES)]:
        name, *rest = (c.strip() for c in line.strip("|").split("|"))
        cells[name.strip("`")] = rest
    assert list(cells) == list(FAMILIES)
    for name, (compiled, tiles, other, suite, recorded) in cells.items():
        golden = json.loads((ROOT / "golden" / f"{name}.json").read_text())["toolchains"]
        assert {"triton-3.6.0", "triton-3.9.0"} <= set(golden), name
        assert all(golden[t]["fingerprints"] for t in ("triton-3.6.0", "triton-3.9.0")), name
        assert compiled == tiles == "yes", name
        held = [toolchain for toolchain in golden.values() if toolchain.get("outputs")]
        provisional = any(t.get("provenance", {}).get("provisional") for t in held)
        own_hardware = bool(held) and not provisional
        assert recorded.startswith("provisional") == provisional, (name, recorded)
        assert recorded.startswith("yes") == own_hardware, (name, recorded)
        assert not (own_hardware and suite.startswith("no")), name  # recorded where it ran
        assert not (provisional and other.startswith("no")), name  # the override's run
        assert other.startswith(("yes", "no")) and suite.startswith(("yes", "no")), name
