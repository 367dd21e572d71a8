"""Mixed precision as users run it: float32 q/k/v under ``torch.autocast`` are cast to the
autocast dtype (as SDPA casts them), with the very bytes of an explicit cast; outside autocast
float32 stays an error. On the CPU the autocast is ``torch.autocast("cpu", dtype=float16)``
(the interpreter's float16 path); on a GPU ``torch.autocast("cuda", dtype=bfloat16)``."""

from __future__ import annotations

import pytest
import torch
from helpers import KERNELS

import portattn
from portattn.validation import DTypeError

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
# The CPU suite runs float16 throughout (the interpreter's bfloat16 handling is slower).
AUTOCAST_DTYPE = torch.bfloat16 if HAS_GPU else torch.float16
LENS = [17, 0, 40]


def _inputs(seed: int, dense: bool = False):
    gen = torch.Generator().manual_seed(seed)
    total = sum(LENS)
    shape_q, shape_k = (
        ((2, 21, 4, 32), (2, 21, 2, 32)) if dense else ((total, 4, 32), (total, 2, 32))
    )
    q = torch.randn(shape_q, generator=gen).to(DEVICE)
    k = torch.randn(shape_k, generator=gen).to(DEVICE)
    v = torch.randn(shape_k, generator=gen).to(DEVICE)
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return q, k, v, cu


def _fwd_bwd(fn, q, k, v):
    """out and the gradients of ``sum(out * w)`` w.r.t. the (leaf) inputs."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    w = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out).to(out.dtype)
    grads = torch.autograd.grad((out * w).sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dense", [False, True])
def test_float32_under_autocast_equals_explicit_cast(kernel, dense):
    q, k, v, cu = _inputs(5, dense)

    def call(q, k, v):
        if dense:
            return portattn.attention(q, k, v, causal=True, kernel=kernel)
        return portattn.varlen_attention(q, k, v, cu, cu, causal=True, kernel=kernel)

    with torch.autocast(DEVICE, dtype=AUTOCAST_DTYPE):
        out, grads = _fwd_bwd(call, q, k, v)
    ref_out, ref_grads = _fwd_bwd(lambda *t: call(*(x.to(AUTOCAST_DTYPE) for x in t)), q, k, v)
    assert out.dtype == AUTOCAST_DTYPE
    assert not out.isnan().any()
    assert torch.equal(out, ref_out)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert g.dtype == torch.float32, name  # gradients reach the float32 leaves as float32
        assert torch.equal(g, r), name


def test_float32_outside_autocast_is_an_error():
    q, k, v, cu = _inputs(6)
    with pytest.raises(DTypeError, match="float16 or torch.bfloat16, got torch.float32"):
        portattn.varlen_attention(q, k, v, cu, cu)
    with torch.autocast(DEVICE, dtype=AUTOCAST_DTYPE, enabled=False), pytest.raises(DTypeError):
        portattn.varlen_attention(q, k, v, cu, cu)


def test_float64_under_autocast_is_still_an_error():
    """Autocast leaves float64 alone (as torch does for its own ops), so the check rejects it."""
    q, k, v, cu = _inputs(7)
    with torch.autocast(DEVICE, dtype=AUTOCAST_DTYPE), pytest.raises(DTypeError, match="float64"):
        portattn.varlen_attention(q.double(), k.double(), v.double(), cu, cu)


def test_forward_op_casts_under_autocast():
    """A direct call of the custom op under autocast casts as the public function does."""
    q, k, v, cu = _inputs(8)
    args = (cu, cu, max(LENS), max(LENS), True, 32**-0.5, "varlen", False)
    with torch.autocast(DEVICE, dtype=AUTOCAST_DTYPE):
        out, lse, _ = torch.ops.portattn.varlen_fwd(q, k, v, *args)
    ref, ref_lse, _ = torch.ops.portattn.varlen_fwd(
        *(x.to(AUTOCAST_DTYPE) for x in (q, k, v)), *args
    )
    assert out.dtype == AUTOCAST_DTYPE
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_autocast_under_torch_compile():
    """fullgraph=True traces the cast (no graph break) and gives the eager bytes."""
    q, k, v, cu = _inputs(9)

    def fn(q, k, v):
        with torch.autocast(DEVICE, dtype=AUTOCAST_DTYPE):
            return portattn.varlen_attention(q, k, v, cu, cu, max(LENS), max(LENS), causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out, grads = _fwd_bwd(compiled, q, k, v)
    ref_out, ref_grads = _fwd_bwd(fn, q, k, v)
    assert out.dtype == AUTOCAST_DTYPE and torch.equal(out, ref_out)
    for g, r in zip(grads, ref_grads):
        assert torch.equal(g, r)
