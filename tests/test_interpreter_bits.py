"""The interpreter's bits do not depend on the Triton version: tiny cases of every kernel path
(both kernels, forward and backward, GQA, causal and not, empty and one-token sequences, a
partial tile, windows, softcap, sinks, a borrowed head dim, v's own head dim, paged decode)
hash to the bits recorded in ``tests/interpreter_bits.json``, under Triton 3.6 and 3.9 alike.

This is the evidence behind ``nox -s tests_newest`` running only the tests marked
``triton_version`` (compiles, keys, tables, Triton's APIs): the other CPU tests run the same
kernels through the same interpreter arithmetic, so their outcome is the same under every
supported Triton. When a Triton release changes these bits, this test fails under it, and the
whole suite must run under that Triton (``nox -s tests_newest -- -m "not gpu"``).

The bits are numpy's too: the interpreter computes the kernels' exponentials (and softcap's
tanh) with numpy, whose AVX-512 loops (SVML's, on AVX512_SKX) round some float32 results
otherwise than the loops every x86-64 CPU has. The nox sessions turn them off
(``NPY_DISABLE_CPU_FEATURES``, ``noxfile.NUMPY_SAME_BITS``), so the record holds on every CI
machine; the test refuses to compare where they are on.

Record again (only after a deliberate kernel change), on a CPU, with them off (the variable
of ``noxfile.NUMPY_SAME_BITS`` set; the recorder refuses otherwise):
``TRITON_INTERPRET=1 python tests/test_interpreter_bits.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from portattn.tools.golden.cases import Case

pytestmark = [
    pytest.mark.triton_version,
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="the interpreter's bits; a GPU's are golden/'s"
    ),
]

RECORD = Path(__file__).with_name("interpreter_bits.json")
_C = Case
CASES = [
    _C("varlen-gqa-causal", "varlen", (0, 1, 17), (0, 1, 17), 4, 2, 32, "fp16", True, 1),
    _C("varlen-sq-gt-sk", "varlen", (19, 5), (7, 5), 2, 1, 64, "bf16", True, 2, False),
    _C("fixed-full", "fixed_order", (3, 21), (9, 0), 2, 2, 32, "bf16", False, 3),
    _C("fixed-gqa-causal-d80", "fixed_order", (17,), (33,), 4, 1, 80, "fp16", True, 4),
    _C(
        "varlen-window-softcap",
        "varlen",
        (37,),
        (37,),
        2,
        1,
        32,
        "fp16",
        True,
        5,
        True,
        window_left=8,
        window_right=0,
        softcap=5.0,
    ),  # fmt: skip
    _C(
        "fixed-window-sinks",
        "fixed_order",
        (23, 2),
        (23, 2),
        2,
        2,
        32,
        "bf16",
        True,
        6,
        window_left=5,
        window_right=3,
        sinks=True,
    ),  # fmt: skip
    _C("varlen-head-dim-v", "varlen", (13,), (29,), 2, 1, 64, "fp16", False, 7, head_dim_v=32),
    _C(
        "fixed-paged-decode",
        "fixed_order",
        (1, 1),
        (40, 17),
        4,
        2,
        32,
        "fp16",
        True,
        8,
        page_size=16,
        softcap=5.0,
    ),  # fmt: skip
    _C("varlen-paged-append", "varlen", (3,), (50,), 2, 2, 32, "bf16", True, 9, page_size=16),
]


def _numpy_avx512_loops(dispatch: list[str] | None = None, features: dict | None = None):
    """The AVX-512 targets numpy dispatches to in this process (none where the CPU has none,
    or where ``NPY_DISABLE_CPU_FEATURES`` turned them off). Its dispatch targets, not the CPU's
    flags: numpy >= 2.4 names its AVX-512 loops X86_V4 (and reports AVX512F and the other
    flags of the CPU whether its loops are off or not). ``dispatch`` / ``features``: numpy's
    ``__cpu_dispatch__`` / ``__cpu_features__`` (the test below passes its own)."""
    if dispatch is None or features is None:
        try:
            from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        except ImportError:  # numpy < 2
            from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        dispatch, features = __cpu_dispatch__, __cpu_features__
    return sorted(
        k for k in dispatch if features.get(k) and (k.startswith("AVX512") or k == "X86_V4")
    )


def test_avx512_check_reads_numpy_dispatch_targets():
    """numpy 2.3 on an AVX-512 CPU, its loops on and off; numpy 2.5 (the GPU host's, session
    37) with its X86_V4 loops off, which still reports the CPU's AVX512F flag on."""
    old = ["AVX2", "AVX512F", "AVX512_SKX", "AVX512_ICL"]
    assert _numpy_avx512_loops(old, dict.fromkeys(old, True)) == sorted(old[1:])
    assert _numpy_avx512_loops(old, {"AVX2": True, "AVX512F": False}) == []
    new = ["X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR"]
    on = {"X86_V3": True, "X86_V4": True, "AVX512F": True, "AVX512_ICL": True}
    assert _numpy_avx512_loops(new, on) == ["AVX512_ICL", "X86_V4"]
    off = {"X86_V3": True, "X86_V4": False, "AVX512F": True, "AVX512_ICL": False}
    assert _numpy_avx512_loops(new, off) == []


def _bits(case: Case) -> dict:
    from portattn.tools.golden.run import compute_case

    return compute_case(case, "cpu").tensors


def _avx512_loops_problem() -> str | None:
    """Why this process cannot compare (or record) the bits, or None."""
    on = _numpy_avx512_loops()
    if not on:
        return None
    return (
        f"numpy runs its AVX-512 loops here ({', '.join(on)}), whose float32 rounding the record "
        "does not hold: run under nox, or set NPY_DISABLE_CPU_FEATURES as noxfile.NUMPY_SAME_BITS"
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_interpreter_bits_match_the_record(case):
    problem = _avx512_loops_problem()
    assert problem is None, problem
    recorded = json.loads(RECORD.read_text())
    assert case.name in recorded, f"{case.name} not recorded: run python {__file__}"
    assert _bits(case) == recorded[case.name]


def test_the_record_has_no_stale_case():
    assert set(json.loads(RECORD.read_text())) == {c.name for c in CASES}


if __name__ == "__main__":  # record: TRITON_INTERPRET=1 python tests/test_interpreter_bits.py
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1: the record is of the interpreter's bits")
    if _avx512_loops_problem():
        sys.exit(_avx512_loops_problem())
    RECORD.write_text(json.dumps({c.name: _bits(c) for c in CASES}, indent=1, sort_keys=True))
    print(f"wrote {RECORD} ({len(CASES)} cases)")
