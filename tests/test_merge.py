"""merge_attention_states: partial results over disjoint key sets merge to the single call
(float64-reference rule), forward and backward; the -inf rules; run-to-run bitwise stability."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, KERNELS, cu_seqlens, lse_err, make_pack, rel_err, run_reference
from torch._dynamo.testing import CompileCounterWithBackend

import portattn
from portattn.validation import DTypeError

# Non-causal splits: per sequence, the interior cut points of its keys (P - 1 of them, sorted).
# Sequence 3 has no keys at all, and short sequences get empty parts.
LENS_Q = [9, 1, 23, 4, 0, 6]
LENS_K = [17, 2, 31, 0, 5, 1]
CUTS = {
    2: [[8], [2], [15], [0], [5], [0]],
    3: [[0, 9], [1, 1], [10, 20], [0, 0], [2, 5], [1, 1]],
}
# Causal splits (chunked prefill / ring attention): earlier key parts are fully visible to every
# query row and run non-causal; the last part holds the diagonal and runs causal. That needs the
# last cut c <= Sk - Sq + 1 in each sequence.
LENS_Q_CAUSAL = [4, 1, 6, 0, 3]
LENS_K_CAUSAL = [20, 9, 30, 5, 3]
CUTS_CAUSAL = {
    2: [[17], [4], [25], [2], [1]],
    3: [[3, 10], [0, 9], [12, 20], [5, 5], [0, 1]],
}


def _parts(lens_k: list[int], cuts: list[list[int]]) -> list[tuple[torch.Tensor, list[int]]]:
    """For each part: the indices of its keys in the packed k/v, and its per-sequence lengths."""
    n_parts = len(cuts[0]) + 1
    starts = cu_seqlens(lens_k, "cpu").tolist()
    parts = []
    for j in range(n_parts):
        index, lens = [], []
        for b, n in enumerate(lens_k):
            bounds = [0, *cuts[b], n]
            lo, hi = bounds[j], bounds[j + 1]
            index.extend(range(starts[b] + lo, starts[b] + hi))
            lens.append(hi - lo)
        parts.append((torch.tensor(index, dtype=torch.long, device=DEVICE), lens))
    return parts


def _merged_run(p, lens_k, cuts, kernel, causal):
    """Each key part through varlen_attention(return_lse=True), merged; forward and backward of
    the same loss as helpers.run_reference. Returns out, lse, dq, dk, dv."""
    q, k, v = (x.detach().requires_grad_() for x in (p.q, p.k, p.v))
    parts = _parts(lens_k, cuts)
    outs, lses = [], []
    for j, (index, lens) in enumerate(parts):
        last = j == len(parts) - 1
        out_j, lse_j = portattn.varlen_attention(
            q,
            k.index_select(0, index),
            v.index_select(0, index),
            p.cu_q,
            cu_seqlens(lens),
            causal=causal and last,
            return_lse=True,
            kernel=kernel,
        )
        outs.append(out_j)
        lses.append(lse_j)
    out, lse = portattn.merge_attention_states(outs, lses)
    loss = (out.float() * p.do.float()).sum()
    loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * p.dlse).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def _single_run(p, kernel, causal):
    q, k, v = (x.detach().requires_grad_() for x in (p.q, p.k, p.v))
    out, lse = portattn.varlen_attention(
        q, k, v, p.cu_q, p.cu_k, causal=causal, return_lse=True, kernel=kernel
    )
    dlse = torch.where(torch.isinf(lse), 0.0, p.dlse)
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (p.do, dlse))
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("n_parts", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_merge_equals_single_call(kernel, causal, n_parts):
    """Merged parts and the single call both meet the acceptance rule against float64: error
    at most 2x the error of the eager computation in the input dtype, plus a small margin."""
    lens_q, lens_k = (LENS_Q_CAUSAL, LENS_K_CAUSAL) if causal else (LENS_Q, LENS_K)
    cuts = (CUTS_CAUSAL if causal else CUTS)[n_parts]
    p = make_pack(lens_q, lens_k, 4, 2, 32, seed=100 + n_parts)
    merged = _merged_run(p, lens_k, cuts, kernel, causal)
    single = _single_run(p, kernel, causal)
    ref = run_reference(p, causal)
    eager = run_reference(p, causal, compute_dtype=p.q.dtype)
    for name in ("out", "dq", "dk", "dv"):
        base = rel_err(eager[name], ref[name])
        for label, got in (("merged", merged), ("single", single)):
            assert not torch.isnan(got[name]).any(), f"{label} {name} has NaN"
            err = rel_err(got[name], ref[name])
            assert err <= 2 * base + 1e-4, f"{label} {name}: {err:.3g} > 2 x eager {base:.3g}"
    base = lse_err(eager["lse"].float(), ref["lse"])
    for label, got in (("merged", merged), ("single", single)):
        err = lse_err(got["lse"], ref["lse"])
        assert err <= 2 * base + 1e-5, f"{label} lse: {err:.3g} > 2 x eager {base:.3g}"
    # rows that see no key anywhere: out 0 and lse -inf, as in the single call
    empty = torch.isneginf(single["lse"])
    assert torch.equal(torch.isneginf(merged["lse"]), empty)
    assert (merged["out"][empty] == 0).all()


def _random_states(n_parts, dtype, seed, shape=(37, 3, 16)):
    """Random partial (out, lse) with -inf rows: row 0 empty in every part, rows 1-4 empty in
    part 0, every fifth row of the last part empty. outs are finite (random, not zero) there."""
    gen = torch.Generator().manual_seed(seed)
    outs, lses = [], []
    for j in range(n_parts):
        outs.append(torch.randn(*shape, generator=gen).to(dtype).to(DEVICE))
        lse = (3 * torch.randn(*shape[:-1], generator=gen)).to(DEVICE)
        lse[0] = float("-inf")
        if j == 0:
            lse[1:5] = float("-inf")
        if j == n_parts - 1:
            lse[::5] = float("-inf")
        lses.append(lse)
    return outs, lses


def _merge_with_grads(outs, lses, g_out, g_lse):
    outs = [o.detach().requires_grad_() for o in outs]
    lses = [x.detach().requires_grad_() for x in lses]
    out, lse = portattn.merge_attention_states(outs, lses)
    g_lse = torch.where(torch.isinf(lse), 0.0, g_lse)
    grads = torch.autograd.grad((out, lse), (*outs, *lses), (g_out, g_lse))
    return out.detach(), lse.detach(), grads


def _reference_merge(outs, lses, g_out, g_lse):
    """float64 formulas: L = logsumexp(l_i), out = sum w_i o_i with w_i = exp(l_i - L);
    d o_i = w_i g_out, d l_i = w_i (g_L + g_out . (o_i - out)); 0 where every part is -inf."""
    lse_stack = torch.stack([x.double() for x in lses])
    out_stack = torch.stack([o.double() for o in outs])
    lse = torch.logsumexp(lse_stack, 0)
    empty = torch.isneginf(lse)
    w = torch.where(empty, 0.0, torch.exp(lse_stack - torch.where(empty, 0.0, lse)))
    out = (w[..., None] * out_stack).sum(0)
    g_out, g_lse = g_out.double(), torch.where(empty, 0.0, g_lse.double())
    d_outs = w[..., None] * g_out
    d_lses = w * (g_lse + (g_out * (out_stack - out)).sum(-1))
    return out, lse, (*d_outs, *d_lses)


@pytest.mark.parametrize("n_parts", [1, 2, 3])
def test_merge_formula_and_gradients(n_parts):
    """float32 states: the merge and its autograd gradients match the float64 formulas; rows
    empty in every part give out 0, lse -inf, zero gradients, and nothing is NaN."""
    outs, lses = _random_states(n_parts, torch.float32, seed=110 + n_parts)
    gen = torch.Generator().manual_seed(120)
    g_out = torch.randn(outs[0].shape, generator=gen).to(DEVICE)
    g_lse = torch.randn(lses[0].shape, generator=gen).to(DEVICE)
    out, lse, grads = _merge_with_grads(outs, lses, g_out, g_lse)
    ref_out, ref_lse, ref_grads = _reference_merge(outs, lses, g_out, g_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert torch.isneginf(lse[0]).all() and (out[0] == 0).all()
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    for g, lse_i in zip(grads[n_parts:], lses):  # -inf entries get exactly zero gradient
        assert (g[torch.isneginf(lse_i)] == 0).all()
    for g in grads[:n_parts]:
        assert (g[0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_bitwise_run_to_run(dtype):
    """The same inputs give the same bytes, forward and backward."""
    outs, lses = _random_states(3, dtype, seed=130, shape=(257, 4, 64))
    g_out = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(131))
    g_out = g_out.to(dtype).to(DEVICE)
    g_lse = torch.randn(lses[0].shape, generator=torch.Generator().manual_seed(132)).to(DEVICE)
    first = _merge_with_grads(outs, lses, g_out, g_lse)
    for _ in range(2):
        again = _merge_with_grads(outs, lses, g_out, g_lse)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
        for a, b in zip(first[2], again[2]):
            assert torch.equal(a, b)
    assert first[0].dtype == dtype and first[1].dtype == torch.float32


def test_single_part_is_identity():
    outs, lses = _random_states(1, torch.float16, seed=140)
    out, lse = portattn.merge_attention_states(outs, lses)
    rows = torch.isfinite(lses[0])
    assert torch.equal(lse, lses[0])
    assert torch.equal(out[rows], outs[0][rows])
    assert (out[~rows] == 0).all()


def test_compile_fullgraph_same_bytes():
    outs, lses = _random_states(3, torch.float16, seed=150)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(portattn.merge_attention_states, fullgraph=True, backend=counter)
    for a, b in zip(portattn.merge_attention_states(outs, lses), compiled(outs, lses)):
        assert torch.equal(a, b)
    assert counter.frame_count == 1


def test_validation():
    outs, lses = _random_states(2, torch.float16, seed=160)
    merge = portattn.merge_attention_states
    with pytest.raises(TypeError, match="outs must be a list or tuple"):
        merge(outs[0], lses)
    with pytest.raises(TypeError, match=r"lses\[1\] must be a torch.Tensor"):
        merge(outs, [lses[0], 1.0])
    with pytest.raises(ValueError, match="at least one"):
        merge([], [])
    with pytest.raises(ValueError, match="same length"):
        merge(outs, lses[:1])
    with pytest.raises(ValueError, match=r"outs\[1\] must have the shape"):
        merge([outs[0], outs[1][:-1]], lses)
    with pytest.raises(DTypeError, match=r"outs\[1\] must have the dtype"):
        merge([outs[0], outs[1].float()], lses)
    with pytest.raises(TypeError, match=r"lses\[0\] must have dtype torch.float32"):
        merge(outs, [lses[0].half(), lses[1]])
    with pytest.raises(ValueError, match=r"lses\[1\] must have shape"):
        merge(outs, [lses[0], lses[1].t()])
    with pytest.raises(DTypeError, match="float16, bfloat16 or float32"):
        merge([o.double() for o in outs], lses)
    with pytest.raises(ValueError, match="at least 2 dims"):
        merge([lses[0][:, 0]], [lses[0][:, 0]])
