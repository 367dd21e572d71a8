"""The custom ops (``torch.ops.portattn.varlen_fwd`` / ``varlen_bwd``) and ``torch.compile``.

* ``torch.library.opcheck`` on both ops (schema, autograd registration, fake tensor, AOT
  dispatch with dynamic shapes), on the interpreter (CPU) or the GPU.
* ``torch.compile(fullgraph=True)`` of functions calling ``varlen_attention`` / ``attention``
  gives the same bytes as eager, forward and backward (eager / aot_eager backends here; the
  real Inductor backend on the GPU, marked ``gpu``).
* Validation stays outside the ops, before any launch; under compile the host-value checks are
  skipped and max_seqlen must be given.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import DEVICE, HAS_GPU, KERNELS, make_pack
from torch._dynamo.testing import CompileCounterWithBackend

import portattn
import portattn.ops as ops_module
from portattn import forward_replay

LENS_Q = [5, 0, 19, 1]
LENS_K = [7, 3, 19, 0]
SCALE = 0.17


def _grad_inputs(p):
    # detach() keeps the (possibly non-contiguous) strides of the inputs
    return tuple(x.detach().requires_grad_() for x in (p.q, p.k, p.v))


def _fwd_args(p, kernel, store_o32, requires_grad=True):
    q, k, v = _grad_inputs(p) if requires_grad else (p.q, p.k, p.v)
    return (q, k, v, p.cu_q, p.cu_k, max(LENS_Q), max(LENS_K), True, SCALE, kernel, store_o32)


# ----------------------------------------------------------------------------- binding by name


@pytest.mark.parametrize(
    ("op", "bound"),
    [
        (torch.ops.portattn.varlen_fwd.default, ops_module.FwdArgs),
        (torch.ops.portattn.varlen_bwd.default, ops_module.BwdArgs),
    ],
)
def test_named_args_mirror_the_schema(op, bound):
    """The NamedTuple an op's Python functions bind their arguments through has the
    registered schema's argument names, in order, with its defaults."""
    arguments = op._schema.arguments
    assert list(bound._fields) == [a.name for a in arguments]
    schema_defaults = {a.name: a.default_value for a in arguments if a.has_default_value()}
    assert bound._field_defaults == schema_defaults


def test_options_are_op_arguments():
    """Every field of the options record is an argument of the forward op (bound by name);
    the backward op has all but the sinks (their gradient is the forward's formula's)."""
    from portattn.options import AttentionOptions

    fields = set(AttentionOptions.__dataclass_fields__)
    assert fields <= set(ops_module.FwdArgs._fields)
    assert fields - set(ops_module.BwdArgs._fields) == {"sinks"}


def test_ops_read_no_argument_by_position():
    """ops.py binds the ops' arguments by name: no index into an argument tuple."""
    import inspect
    import re

    source = inspect.getsource(ops_module)
    assert not re.search(r"\b(args|inputs|needs_input_grad)\[", source)


# ----------------------------------------------------------------------------- opcheck


@pytest.mark.parametrize("noncontiguous", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_opcheck_fwd(kernel, noncontiguous):
    """All of opcheck's tests, test_aot_dispatch_dynamic included, pass for the forward op: the
    fake implementation's shapes/strides/dtypes match the real one, and the autograd formula
    traces (it calls the backward op)."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=80, noncontiguous=noncontiguous)
    args = _fwd_args(p, kernel, store_o32=kernel == "fixed_order")
    torch.library.opcheck(torch.ops.portattn.varlen_fwd.default, args)


def test_opcheck_fwd_without_o32():
    """store_o32=False (no backward coming): out32 is an empty [0, Hq, D] placeholder."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=81)
    args = _fwd_args(p, "fixed_order", store_o32=False, requires_grad=False)
    torch.library.opcheck(torch.ops.portattn.varlen_fwd.default, args)
    out, lse, out32 = torch.ops.portattn.varlen_fwd(*args)
    assert out32.shape == (0, 4, 32) and out32.dtype == torch.float32


@pytest.mark.parametrize("with_dlse", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_opcheck_bwd(kernel, with_dlse):
    """opcheck on the backward op, with and without dlse. Its inputs do not require grad: the
    backward op has no autograd formula of its own (no double backward)."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=82, noncontiguous=True)
    out, lse, out32 = torch.ops.portattn.varlen_fwd(*_fwd_args(p, kernel, True, False))
    o_for_delta = out32 if kernel == "fixed_order" else out
    dlse = torch.where(torch.isinf(lse), 0.0, p.dlse) if with_dlse else None
    args = (p.do, p.q, p.k, p.v, o_for_delta, lse, dlse, p.cu_q, p.cu_k)
    args += (max(LENS_Q), max(LENS_K), True, SCALE, kernel)
    torch.library.opcheck(torch.ops.portattn.varlen_bwd.default, args)


def test_fixed_order_backward_needs_o32():
    """Called directly with store_o32=False, the fixed_order backward refuses to run."""
    p = make_pack(LENS_Q, LENS_K, 2, 1, 32, seed=83)
    out, _, _ = torch.ops.portattn.varlen_fwd(*_fwd_args(p, "fixed_order", False))
    with pytest.raises(RuntimeError, match="store_o32=True"):
        out.backward(p.do)


def test_public_api_stores_o32_only_for_a_backward(monkeypatch):
    """fixed_order stores the float32 output only when a backward can run."""
    seen = []
    real = forward_replay.plan_forward

    def spy(problem, q, k, v, cu_q, cu_k, store_o32, *args):
        seen.append(store_o32)
        return real(problem, q, k, v, cu_q, cu_k, store_o32, *args)

    monkeypatch.setattr(forward_replay, "plan_forward", spy)
    # a call like an earlier one would replay its launches, past the spy: plan every call
    monkeypatch.setattr(forward_replay, "REPLAYED_FORWARDS", False)
    p = make_pack(LENS_Q, LENS_K, 2, 1, 32, seed=84)
    q, k, v = _grad_inputs(p)
    with torch.no_grad():
        portattn.varlen_attention(q, k, v, p.cu_q, p.cu_k, kernel="fixed_order")
    portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, kernel="fixed_order")
    portattn.varlen_attention(q, k, v, p.cu_q, p.cu_k, kernel="fixed_order")
    portattn.varlen_attention(q, k, v, p.cu_q, p.cu_k, kernel="varlen")
    assert seen == [False, False, True, False]


def test_validation_before_the_op(monkeypatch):
    """Bad input raises in the public function; the launcher is never reached."""

    def boom(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(forward_replay, "run_launches", boom)  # every forward launches there
    p = make_pack([5, 7], [6, 8], 4, 2, 32, seed=85)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, max_seqlen_q=1)
    bad_cu = p.cu_q.clone()
    bad_cu[1] = 13
    with pytest.raises(ValueError, match="non-decreasing"):
        portattn.varlen_attention(p.q, p.k, p.v, bad_cu, p.cu_k)


# ----------------------------------------------------------------------------- torch.compile


def _varlen_fn(kernel):
    def fn(q, k, v, cu_q, cu_k, max_q, max_k):
        return portattn.varlen_attention(
            q, k, v, cu_q, cu_k, max_q, max_k, causal=True, return_lse=True, kernel=kernel
        )

    return fn


def _dense_fn(kernel):
    def fn(q, k, v):
        return portattn.attention(q, k, v, causal=True, return_lse=True, kernel=kernel)

    return fn


def _fwd_bwd(fn, inputs, extra, do, dlse):
    """Forward through ``fn`` and backward of out (grad ``do``) and lse (grad ``dlse``, zero on
    -inf rows); returns out, lse, dq, dk, dv."""
    leaves = tuple(x.detach().requires_grad_() for x in inputs)
    out, lse = fn(*leaves, *extra)
    dlse = torch.where(torch.isinf(lse), 0.0, dlse)
    grads = torch.autograd.grad((out, lse), leaves, (do, dlse))
    return (out.detach(), lse.detach(), *grads)


def _assert_same_bytes(eager, compiled):
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), eager, compiled):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: compiled differs from eager"


def _compile(fn, backend, dynamic=None):
    """``torch.compile(fullgraph=True)`` on a fresh Dynamo cache, counting the graphs, so a test
    can prove its calls ran compiled (not an eager fallback after a recompile limit)."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    return torch.compile(fn, fullgraph=True, backend=counter, dynamic=dynamic), counter


def _check_compiled_varlen(
    kernel,
    backend,
    dtype=torch.float16,
    packs=((LENS_Q, LENS_K, 4, 2),),
    head_dim=32,
    dynamic=None,
):
    """Each pack (lens_q, lens_k, Hq, Hkv) through eager and one compiled function: same
    bytes; and the compiled calls used exactly one graph."""
    fn = _varlen_fn(kernel)
    compiled, counter = _compile(fn, backend, dynamic)
    for lens_q, lens_k, hq, hk in packs:
        p = make_pack(lens_q, lens_k, hq, hk, head_dim, dtype, seed=86, noncontiguous=True)
        extra = (p.cu_q, p.cu_k, max(lens_q), max(lens_k))
        eager = _fwd_bwd(fn, (p.q, p.k, p.v), extra, p.do, p.dlse)
        _assert_same_bytes(eager, _fwd_bwd(compiled, (p.q, p.k, p.v), extra, p.do, p.dlse))
    assert counter.frame_count == 1


def _check_compiled_dense(kernel, backend, dtype=torch.float16, shape=(2, 13, 21, 4, 2, 32)):
    batch, sq, sk, hq, hk, d = shape
    gen = torch.Generator().manual_seed(87)
    q, do = (torch.randn(batch, sq, hq, d, generator=gen).to(dtype).to(DEVICE) for _ in "ab")
    k, v = (torch.randn(batch, sk, hk, d, generator=gen).to(dtype).to(DEVICE) for _ in "ab")
    dlse = torch.randn(batch, hq, sq, generator=gen).to(DEVICE)
    fn = _dense_fn(kernel)
    compiled, counter = _compile(fn, backend)
    eager = _fwd_bwd(fn, (q, k, v), (), do, dlse)
    _assert_same_bytes(eager, _fwd_bwd(compiled, (q, k, v), (), do, dlse))
    assert counter.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_compile_varlen_same_bytes(kernel, backend):
    """fullgraph=True (no graph break), non-contiguous inputs, out and lse both used."""
    _check_compiled_varlen(kernel, backend)


@pytest.mark.parametrize("kernel", KERNELS)
def test_compile_dense_same_bytes(kernel):
    _check_compiled_dense(kernel, "aot_eager")


def test_compile_dynamic_shapes():
    """dynamic=True: max_seqlen and sizes are symbolic; still one graph, same bytes."""
    packs = ((LENS_Q, LENS_K, 4, 2), ([3, 11], [12, 4], 2, 2))
    _check_compiled_varlen("fixed_order", "aot_eager", packs=packs, dynamic=True)


@pytest.mark.parametrize("use", ["out", "lse"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_compile_partial_use(kernel, use):
    """Only out used (eager's backward gets no dlse) or only lse (no dout): the compiled
    backward may get zeros there instead, and must still give eager's bytes."""
    p = make_pack(LENS_Q, LENS_K, 4, 2, 32, seed=90)
    fn = _varlen_fn(kernel)
    compiled, counter = _compile(fn, "aot_eager")
    results = []
    for f in (fn, compiled):
        q, k, v = _grad_inputs(p)
        out, lse = f(q, k, v, p.cu_q, p.cu_k, max(LENS_Q), max(LENS_K))
        if use == "out":
            loss = (out.float() * p.do.float()).sum()
        else:
            loss = (torch.where(torch.isinf(lse), 0.0, lse) * p.dlse).sum()
        results.append(torch.autograd.grad(loss, (q, k, v)))
    for name, a, b in zip(("dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name
    assert counter.frame_count == 1


def _has_cxx_compiler() -> bool:
    return any(shutil.which(c) for c in ("g++", "clang++", "c++"))


@pytest.mark.skipif(HAS_GPU, reason="the GPU variant is test_compile_inductor_gpu")
@pytest.mark.skipif(not _has_cxx_compiler(), reason="Inductor on the CPU needs a C++ compiler")
def test_compile_inductor_cpu():
    """The real Inductor backend: the op stays opaque, so the interpreter runs it as in eager."""
    _check_compiled_varlen("varlen", "inductor")


def test_compile_requires_max_seqlen():
    """Under compile, max_seqlen cannot be derived without a host sync: fullgraph fails with a
    message naming it; without fullgraph Dynamo falls back to eager for the frame, which works."""
    p = make_pack([3, 5], [3, 5], 2, 1, 32, seed=88)
    torch._dynamo.reset()

    def fn(q, k, v, cu_q, cu_k):
        return portattn.varlen_attention(q, k, v, cu_q, cu_k)

    with pytest.raises(Exception, match="max_seqlen_q must be given"):
        torch.compile(fn, fullgraph=True, backend="eager")(p.q, p.k, p.v, p.cu_q, p.cu_k)
    got = torch.compile(fn, backend="eager")(p.q, p.k, p.v, p.cu_q, p.cu_k)
    assert torch.equal(got, fn(p.q, p.k, p.v, p.cu_q, p.cu_k))


def test_compile_still_checks_shapes():
    """The checks that need no host values run while tracing."""
    p = make_pack([3, 5], [3, 5], 2, 1, 32, seed=89)
    compiled, _ = _compile(_varlen_fn("varlen"), "eager")
    with pytest.raises(Exception, match="cu_seqlens_k must have dtype torch.int32"):
        compiled(p.q, p.k, p.v, p.cu_q, p.cu_k.long(), 5, 5)
    with pytest.raises(Exception, match="Hq \\(2\\) must be a multiple of Hkv \\(3\\)"):
        k3 = p.k.expand(-1, 3, -1)
        compiled(p.q, k3, k3, p.cu_q, p.cu_k, 5, 5)


# ----------------------------------------------------------------------------- GPU: Inductor


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_compile_inductor_gpu(kernel):
    """The real Inductor backend on the GPU: compiled == eager bitwise, bf16, forward and
    backward, varlen (skewed pack, GQA, non-contiguous) and dense."""
    lens_q, lens_k = [1, 700, 63, 0, 129, 300], [5, 700, 200, 7, 129, 256]
    packs = ((lens_q, lens_k, 8, 2),)
    _check_compiled_varlen(kernel, "inductor", torch.bfloat16, packs, head_dim=128)
    _check_compiled_dense(kernel, "inductor", torch.bfloat16, (2, 257, 300, 8, 2, 128))
