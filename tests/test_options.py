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
