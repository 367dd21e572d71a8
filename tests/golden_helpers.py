"""Shared pieces of the golden tests (test_golden.py: verify and refresh; test_golden_store.py:
generator, cases, hashing, merge and file safety): the device, tiny cases, fake results."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch

from ci.golden_dev.merging import build_record
from ci.golden_dev.refresh import run_refresh
from portattn.tools.golden.cases import Case
from portattn.tools.golden.hashing import tensor_bytes
from portattn.tools.golden.run import CaseResult
from portattn.tools.golden.verify import run_verify, toolchain_key

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


def verify_reports_difference(tmp_path) -> str:
    """``golden verify`` of the fake family's file in ``tmp_path``, which must find a
    difference (exit 1); returns what it printed, one string."""
    lines, out = capture()
    assert run_verify(FAKE, DEV, tmp_path, out=out) == 1
    return "\n".join(lines)


def refresh(tmp_path, cases=TINY, **kw) -> int:
    kw.setdefault("out", lambda line: None)
    kw.setdefault("fingerprint_fn", None)
    return run_refresh(FAKE, DEV, tmp_path, cases=cases, repeat=1, **kw)


def fake_result(name: str, salt: str = "", kernel: str = "varlen") -> CaseResult:
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


def fake_record(results, toolchain="triton-x", config="c1", fingerprints=None) -> dict:
    hashes = {r.case.entry: config for r in results}
    prov = {"devices": ["dev"], "drivers": [], "torch": ["t"], "portattn": "0", "date": "d"}
    return build_record(FAKE, toolchain, results, prov, fingerprints, hashes, 1)


def verify_args(**kw) -> argparse.Namespace:
    """The arguments of ``golden verify`` / ``refresh`` (``cmd_verify``, ``cmd_refresh``) with
    ``kw`` over the defaults."""
    base = {
        "family": None,
        "golden_dir": None,
        "case": None,
        "force": False,
        "repeat": 1,
        "skip_fingerprints": True,
    }
    return argparse.Namespace(**(base | kw))
