"""The options record (portattn.options.AttentionOptions): equality and hashing."""

from __future__ import annotations

import torch

from portattn.options import AttentionOptions


def test_records_with_and_without_sinks_differ():
    """Sinks are a tensor, left out of the field comparison, but whether a record has them
    changes the kernels that run: two records that differ only there are not equal, and a
    cache keyed on the record keeps them apart. The sinks' values are never compared."""
    plain = AttentionOptions(causal=True, softmax_scale=0.125)
    sinks = AttentionOptions(causal=True, softmax_scale=0.125, sinks=torch.zeros(4))
    other = AttentionOptions(causal=True, softmax_scale=0.125, sinks=torch.ones(4))
    assert plain != sinks
    assert len({plain, sinks}) == 2
    assert sinks == other and hash(sinks) == hash(other)
    assert plain == AttentionOptions(True, 0.125) and hash(plain) == hash(
        AttentionOptions(True, 0.125)
    )
    assert plain != AttentionOptions(causal=False, softmax_scale=0.125)
    assert plain.__eq__(object()) is NotImplemented


def _check(q, **overrides):
    from portattn.options import check_options

    args = dict(
        causal=True,
        softmax_scale=None,
        return_lse=False,
        kernel="varlen",
        window_size=(-1, -1),
        softcap=None,
        token_dims=1,
        compiling=False,
    )
    args.update(overrides)
    return check_options(q, q, q, **args)


def test_a_checked_signature_gives_its_record_again(device):
    """check_options keeps the record of a call that passed (no sinks, not traced): the same
    call again gets the same record; a call that differs in what the checks read is checked."""
    q = torch.randn(8, 2, 16, dtype=torch.float16, device=device)
    first = _check(q)
    assert (
        _check(torch.randn(8, 2, 16, dtype=torch.float16, device=device)) is first
    )  # other values
    assert _check(q, causal=False) is not first and not _check(q, causal=False).causal
    assert _check(q, window_size=(4, 0)).window_left == 4
    assert _check(q, compiling=True) is not first  # traced: checked every time


def test_a_kept_record_does_not_skip_a_check_that_fails(device):
    """Arguments equal to a checked call's under ``==`` but of another type, shape, stride,
    dtype: each is checked and raises as on a first call."""
    import pytest

    q = torch.randn(8, 2, 16, dtype=torch.float16, device=device)
    _check(q)
    with pytest.raises(TypeError, match="causal"):
        _check(q, causal=1)  # 1 == True, and hashes alike
    with pytest.raises(TypeError):
        _check(q, window_size=(-1.0, -1))  # -1.0 == -1
    with pytest.raises(ValueError, match="stride"):
        _check(torch.randn(8, 2, 32, dtype=torch.float16, device=device)[..., ::2])
    with pytest.raises(Exception, match="float16 or torch.bfloat16"):
        _check(q.float())
    window = torch.tensor([-1, -1])  # a tensor window: read each call, never kept
    assert _check(q, window_size=window).window_left == -1
    window[0] = 3
    assert _check(q, window_size=window).window_left == 3
