"""The scalar parameters (window_size, softcap, softmax_scale, sinks): the forms flash-attn
accepts, and the bounds that keep the kernels' float32 arithmetic finite and accurate
(portattn/validation_params.py), checked before any launch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import DEVICE, make_pack

import portattn
from portattn import validation


def _pack():
    return make_pack([5, 7], [6, 9], 2, 1, 32, seed=61)


def _args(p):
    return p.q, p.k, p.v, p.cu_q, p.cu_k


def _dense(p):
    """One sequence of 7 queries and 9 keys as dense [1, S, H, D] tensors."""
    return p.q[5:].unsqueeze(0), p.k[6:].unsqueeze(0), p.v[6:].unsqueeze(0)


WINDOW_FORMS = [
    torch.tensor([4, 2]),  # flash-attn's tests: torch.randint(0, seqlen_k, (2,))
    torch.tensor([4, 2], dtype=torch.int32),
    (torch.tensor(4), torch.tensor(2)),
    [np.int64(4), np.int32(2)],
    np.array([4, 2]),
]


@pytest.mark.parametrize("window", WINDOW_FORMS, ids=lambda w: type(w).__name__)
def test_window_size_tensors_and_numpy_as_flash_attn(window):
    """flash-attn's own tests pass window_size as an int tensor: accepted by every entry point,
    the same bits as the pair of ints."""
    p = _pack()
    if isinstance(window, torch.Tensor):
        window = window.to(DEVICE)
    elif isinstance(window, tuple):
        window = tuple(w.to(DEVICE) for w in window)
    want = portattn.varlen_attention(*_args(p), window_size=(4, 2))
    assert torch.equal(portattn.varlen_attention(*_args(p), window_size=window), want)
    assert torch.equal(portattn.flash_attn_varlen_func(*_args(p), 7, 9, window_size=window), want)
    dense = _dense(p)
    want = portattn.attention(*dense, causal=True, window_size=(4, -1))
    if isinstance(window, (torch.Tensor, np.ndarray)):
        causal_window = window.clone() if isinstance(window, torch.Tensor) else window.copy()
        causal_window[1] = -1
    else:
        causal_window = (window[0], -1)
    got = portattn.flash_attn_func(*dense, causal=True, window_size=causal_window)
    assert torch.equal(got, want)
    with torch.no_grad():
        kv = portattn.flash_attn_with_kvcache(dense[0], dense[1], dense[2], window_size=window)
    assert torch.equal(kv, portattn.attention(*dense, window_size=(4, 2)))


@pytest.mark.parametrize(
    "window, error, match",
    [
        (torch.tensor([4.0, 2.0]), TypeError, "window_size must hold integers"),
        (torch.tensor([True, False]), TypeError, "window_size must hold integers"),
        (np.array([4.0, 2.0]), TypeError, "window_size must hold integers"),
        (torch.tensor([4, 2, 1]), ValueError, r"1-D with 2 elements .*shape \(3,\)"),
        (torch.tensor([[4, 2]]), ValueError, r"1-D with 2 elements .*shape \(1, 2\)"),
        ((torch.tensor(4.0), 2), TypeError, "left must be an int or a 0-d integer tensor"),
        ((4, torch.tensor([2])), TypeError, "right must be an int or a 0-d integer tensor"),
        ((np.bool_(True), 2), TypeError, "left must be an int, got numpy.bool"),
        (torch.tensor([4, -2]), ValueError, "right must be -1"),
        ((torch.tensor(2**30), -1), ValueError, "left must be -1"),
    ],
    ids=str,
)
def test_window_size_bad_tensors(window, error, match):
    p = _pack()
    with pytest.raises(error, match=match):
        portattn.varlen_attention(*_args(p), window_size=window)


@pytest.mark.parametrize("softcap", [1e6, 2e38, 3e38, 10**400, 2.0**10 * (1 + 2**-20)])
def test_softcap_above_bound_rejected(softcap):
    """Caps that overflowed the float32 arithmetic (NaN rows) or lost accuracy (1e6: 2.9e-2
    relative error): ValueError naming the bound and why, never OverflowError (10**400)."""
    p = _pack()
    with pytest.raises(ValueError, match=r"softcap must be at most 2\*\*10 = 1024 .*2\*\*-23"):
        portattn.varlen_attention(*_args(p), softcap=softcap)
    with pytest.raises(ValueError, match="softcap must be at most"):
        portattn.flash_attn_func(*_dense(p), softcap=softcap)


def test_softcap_bounds():
    from portattn.options import check_softcap

    assert check_softcap(1024) == 1024.0 and check_softcap(2.0**-16) == 2.0**-16
    assert check_softcap(0) == 0.0 and check_softcap(None) == 0.0
    for cap in (1e-30, 2.0**-17):
        with pytest.raises(ValueError, match=r"softcap must be at least 2\*\*-16"):
            check_softcap(cap)


def test_softcap_at_bound_runs():
    p = _pack()
    out = portattn.varlen_attention(*_args(p), softcap=1024)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scale", [2e38, 1e37, 1e20, 2.0**16 * (1 + 2**-20)])
def test_softmax_scale_above_bound_rejected(scale):
    """Finite scales that made the float32 scores overflow (all-NaN rows at 1e37 with
    |q.k| about 1e3): ValueError naming the bound, from every entry point."""
    p = _pack()
    match = r"softmax_scale must be at most 2\*\*16 = 65536"
    with pytest.raises(ValueError, match=match):
        portattn.varlen_attention(*_args(p), softmax_scale=scale)
    with pytest.raises(ValueError, match=match):
        portattn.flash_attn_func(*_dense(p), softmax_scale=scale)
    with pytest.raises(ValueError, match=match), torch.no_grad():
        portattn.flash_attn_with_kvcache(*_dense(p), softmax_scale=scale)


def test_softmax_scale_bound_accepted():
    from portattn.validation import check_softmax_scale

    assert check_softmax_scale(2**16, 64) == 65536.0
    assert check_softmax_scale(np.float32(0.125), 64) == 0.125


def _sinks(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "sinks",
    [
        _sinks(3e38, 0.0),
        _sinks(0.0, -3e38),
        _sinks(0.0, 2.0**16 + 1),
        _sinks(float("nan"), 0.0),
        _sinks(0.0, float("inf")),
        _sinks(3e38, 0.0, dtype=torch.bfloat16),
        _sinks(0.0, 70000.0, dtype=torch.float16),  # inf in float16
    ],
    ids=["3e38", "-3e38", "2**16+1", "nan", "inf", "bf16-3e38", "fp16-inf"],
)
def test_sinks_outside_bound_rejected(sinks):
    """Sinks that gave all-NaN rows: ValueError naming the head and the bound."""
    p = _pack()
    with pytest.raises(ValueError, match=r"sinks\[[01]\] must be -inf \(no sink\) or finite"):
        portattn.varlen_attention(*_args(p), sinks=sinks)
    with pytest.raises(ValueError, match=r"sinks\[[01]\] must be"):
        portattn.attention(*_dense(p), sinks=sinks)


def test_sinks_at_bound_and_minus_inf_run():
    p = _pack()
    out = portattn.varlen_attention(*_args(p), sinks=_sinks(float("-inf"), -(2.0**16)))
    assert torch.equal(out, portattn.varlen_attention(*_args(p)))  # both sinks are ~nothing
    out = portattn.varlen_attention(*_args(p), sinks=_sinks(2.0**16, 0.0))
    assert torch.isfinite(out).all()


def test_sinks_values_copied_once_per_version(monkeypatch):
    """A model's sinks parameter: its values reach the host once per version (host_values),
    not once per call; an in-place update (an optimizer step) is checked again."""
    p = _pack()
    sinks = _sinks(0.5, -1.0)
    validation.forget_host_values()
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(t.shape) or real(t))
    for _ in range(2):
        portattn.attention(*_dense(p), sinks=sinks)
    assert calls.count(sinks.shape) == 1
    with torch.no_grad():
        sinks.fill_(3e38)  # a new version
    with pytest.raises(ValueError, match="sinks"):
        portattn.attention(*_dense(p), sinks=sinks)
