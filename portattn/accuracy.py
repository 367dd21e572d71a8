"""The accuracy rule, in one place: an output is accepted when its error against the float64
reference is at most twice the error of the same computation done eagerly in the input dtype,
plus a small margin. Used by ``python -m portattn check``, golden verify's mismatch report, the
distributed demo and the test suite.
"""

from __future__ import annotations

import torch

REL_MARGIN = 1e-4  # out, dq, dk, dv: relative Frobenius error
LSE_MARGIN = 1e-5  # lse (float32): max abs error


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``x`` against ``ref`` (absolute when ``ref`` is all 0)."""
    diff = (x.double() - ref.double()).norm().item()
    norm = ref.double().norm().item()
    return diff / norm if norm > 0 else diff


def lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error over rows that see a key; inf when the -inf rows differ from ``ref``'s."""
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return float("inf")
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    return (lse.double()[finite] - ref.double()[finite]).abs().max().item()


def error(name: str, x: torch.Tensor, ref: torch.Tensor) -> float:
    """The error measure of output ``name`` ("lse": max abs; others: relative Frobenius)."""
    return lse_err(x, ref) if name == "lse" else rel_err(x, ref)


def limit(name: str, eager_error: float) -> float:
    """The largest accepted error of output ``name``, given the eager input-dtype error."""
    return 2 * eager_error + (LSE_MARGIN if name == "lse" else REL_MARGIN)
