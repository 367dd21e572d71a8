"""The family override (``$PORTATTN_FAMILY_OVERRIDE``) and the provisional golden hashes it
records: which values are accepted where, and what ``golden verify`` says of provisional
hashes on the family's own hardware (exit 0 "confirmed" or exit 2 "differ", never 1).

The run itself (sm80's PTX on an H200) needs the GPU; here the device is faked (properties)
and the emulation is injected into the golden commands, with kernels under the interpreter.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from golden_helpers import DEV, FAKE, TC, TINY, capture, refresh

import portattn.tools.golden.run as golden_run
import portattn.tools.golden.verify as golden_verify
from portattn import families
from portattn.tools.golden.layout import load
from portattn.tools.golden.verify import run_verify

# Compiles, Triton APIs or the installed Triton's table: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version


@pytest.fixture
def device_of(monkeypatch):
    """Fake the CUDA device 0: ``device_of(major, minor)``; the override re-reads the env."""

    def fake(major: int, minor: int, name: str = "Fake GPU") -> None:
        props = SimpleNamespace(major=major, minor=minor, name=name, gcnArchName="")
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
        monkeypatch.setattr(torch.version, "hip", None)
        for fn in (families._family_of_index, families._checked_override):
            fn.cache_clear()
        families.override_setting.cache_clear()

    yield fake
    for fn in (families._family_of_index, families._checked_override, families.override_setting):
        fn.cache_clear()


def _override(monkeypatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(families.OVERRIDE_ENV, raising=False)
    else:
        monkeypatch.setenv(families.OVERRIDE_ENV, value)
    families.override_setting.cache_clear()


@pytest.mark.parametrize(
    "value, cc, expected",
    [
        (None, (9, 0), None),
        ("", (9, 0), None),
        ("sm80", (9, 0), "sm80"),  # an H200 runs sm80's PTX
        ("sm80", (8, 0), None),  # an A100 is sm80: nothing to override
        ("sm90", (9, 0), None),
    ],
)
def test_override_values_that_run(monkeypatch, device_of, value, cc, expected):
    device_of(*cc)
    _override(monkeypatch, value)
    assert families.family_override(0) == expected
    if expected is not None:
        assert families.config_family(torch.device("cuda", 0)) == expected


@pytest.mark.parametrize(
    "value, cc, match",
    [
        ("sm81", (9, 0), "expected an NVIDIA family"),
        ("cdna3", (9, 0), "expected an NVIDIA family"),
        ("sm90", (8, 0), "compute capability 8.0; sm90's PTX needs 9.0"),
        ("sm90", (10, 0), "arch-specific"),  # sm_90a PTX (wgmma) does not run on Blackwell
    ],
)
def test_override_values_that_cannot_run(monkeypatch, device_of, value, cc, match):
    device_of(*cc)
    _override(monkeypatch, value)
    with pytest.raises(ValueError, match=match):
        families.family_override(0)


def test_override_is_read_once_per_process(monkeypatch, device_of):
    """Triton's kernel cache does not key on the target: the first reading holds."""
    device_of(9, 0)
    _override(monkeypatch, "sm80")
    assert families.family_override(0) == "sm80"
    monkeypatch.delenv(families.OVERRIDE_ENV)
    assert families.family_override(0) == "sm80"


def test_cpu_launches_ignore_the_override(monkeypatch):
    from portattn.kernels.plan import _override_arch

    monkeypatch.setattr(families, "family_override", lambda device=None: "sm80")
    assert _override_arch(torch.device("cpu")) is None


def test_override_that_names_no_nvidia_family_raises_on_cpu_too(monkeypatch):
    """The docs: a value that is not an NVIDIA family raises at the first call, where the
    override does not apply too (CPU tensors under the interpreter): it was ignored there."""
    from helpers import make_pack

    import portattn

    p = make_pack([3], [4], 2, 1, 32, seed=71)
    try:
        for value in ("bogus", "cdna3"):
            _override(monkeypatch, value)
            with pytest.raises(ValueError, match=f"{value}'. expected an NVIDIA family"):
                portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k)
        _override(monkeypatch, "sm80")  # an NVIDIA family: ignored by CPU launches
        assert portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k).shape == p.q.shape
    finally:
        families.override_setting.cache_clear()


# ----------------------------------------------------------------------------- golden


def _emulating(monkeypatch, family: str | None) -> None:
    monkeypatch.setattr(golden_verify, "emulated_family", lambda device: family)


def _flip_out(monkeypatch) -> None:
    real = golden_run.run_kernels

    def run(case, inputs):
        outputs = real(case, inputs)
        outputs["out"] = outputs["out"].clone()
        outputs["out"].view(-1)[0] += 1.0
        return outputs

    monkeypatch.setattr(golden_run, "run_kernels", run)


def test_provisional_hashes_confirmed_or_refuted_on_the_family(tmp_path, monkeypatch):
    _emulating(monkeypatch, FAKE)
    lines, out = capture()
    assert refresh(tmp_path, out=out) == 0
    assert any("provisional:" in line for line in lines)
    mark = load(tmp_path / "fake.json")["toolchains"][TC]["provenance"]["provisional"]
    assert "not yet seen on fake hardware" in mark

    # Under the override again (the machine that made them): an ordinary verify, 0 or 1.
    assert run_verify(FAKE, DEV, tmp_path, out=lambda line: None) == 0

    # On the family's own hardware: confirmed (0) ...
    _emulating(monkeypatch, None)
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 0
    assert lines[-1] == f"provisional hashes confirmed: all {len(TINY)} case(s) match bitwise"

    # ... or refuted (2, never 1); under the override a difference is a failure (1).
    _flip_out(monkeypatch)
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 2
    assert lines[-1].startswith("provisional hashes differ: refresh on this hardware")
    _emulating(monkeypatch, FAKE)
    assert run_verify(FAKE, DEV, tmp_path, out=lambda line: None) == 1


def test_own_hardware_replaces_provisional_hashes_and_never_the_reverse(tmp_path, monkeypatch):
    _emulating(monkeypatch, FAKE)
    assert refresh(tmp_path) == 0
    _flip_out(monkeypatch)  # the family's hardware gives other bits: replaced without --force
    _emulating(monkeypatch, None)
    lines, out = capture()
    assert refresh(tmp_path, out=out) == 0
    assert any("provisional outputs replaced by this hardware's" in line for line in lines)
    section = load(tmp_path / "fake.json")["toolchains"][TC]
    assert "provisional" not in section["provenance"]
    assert run_verify(FAKE, DEV, tmp_path, out=lambda line: None) == 0

    _emulating(monkeypatch, FAKE)  # the override never overwrites a hardware record
    before = (tmp_path / "fake.json").read_bytes()
    lines, out = capture()
    assert refresh(tmp_path, out=out) == 2
    assert "never replace them" in lines[-1]
    assert (tmp_path / "fake.json").read_bytes() == before


# ----------------------------------------------------------------------------- the PTX

_COMPARE = """
import sys, tempfile
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from portattn.families import FAMILIES
from portattn.kernels.ptx_jit import family_ptx
from portattn.tools.compile_launches import Entry, record_launches
from portattn.tools.compile_inputs import PINNED_OPTIONS, pinned_knobs, specialize

launch = record_launches(Entry("sm80", "varlen", 64, "bf16"))[sys.argv[1]][0]

def compile_for(target):
    signature, constexprs, attrs = specialize(launch, make_backend(target))
    src = ASTSource(launch.fn, signature, constexprs, attrs)
    options = dict(launch.options, debug=False, **PINNED_OPTIONS["cuda"])
    return triton.compile(src, target=target, options=options)

with pinned_knobs(tempfile.mkdtemp()):
    want = compile_for(FAMILIES["sm80"].target()).asm["ptx"]
    with knobs.runtime.scope():
        knobs.runtime.override_arch = "sm80"
        lowered = compile_for(GPUTarget("cuda", 90, 32))
got = family_ptx(lowered, 80)
print("alone:", ".target sm_90a" in lowered.asm["ptx"], "ours:", ".target sm_80" in got,
      "mma.sync" in got, "same:", got == want)
"""


@pytest.mark.parametrize("stage", ["fwd", "bwd_dkdv"])
def test_override_ptx_is_the_family_compile_ptx(stage):
    """What the H200 loads under the override is, text for text, the PTX of a compile for
    sm80: the kernel lowered with ``override_arch`` on an sm90 target, its PTX stage re-run
    for sm80 (:func:`ptx_jit.family_ptx`), against ``triton.compile`` for sm80 outright.
    Triton alone would hand the GPU sm_90a PTX. (A fresh process without the interpreter:
    the kernels must be Triton's JIT functions, not interpreted ones.)"""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE, stage], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].split() == [
        "alone:",
        "True",
        "ours:",
        "True",
        "True",
        "same:",
        "True",
    ]
