"""The kernels as PyTorch custom operators: ``torch.ops.portattn.varlen_fwd`` / ``varlen_bwd``.

Registered with :func:`torch.library.custom_op`, so ``torch.compile`` sees each as one opaque
node (no graph break, no retracing of the launchers) and calls the very same launchers, kernels
and configurations as eager mode: compiled and eager runs give the same bytes. Each op has a
fake (meta) implementation for tracing, and the forward op has an autograd formula that calls
the backward op, so AOTAutograd puts the backward op in the backward graph.

Why ``custom_op`` and not ``triton_op`` + ``wrap_triton``:

* Under Triton's CPU interpreter (our CPU test path) a ``triton_op`` does not compile at all:
  tracing it with fake tensors runs the interpreted kernel on them ("Cannot access data pointer
  of Tensor", torch 2.13 / Triton 3.6, for every backend, ``eager`` included).
* On the GPU, ``triton_op`` lets Inductor trace into the launcher and re-launch the Triton
  kernels from its own generated code, compiled and specialised by Inductor, with the launch
  options (on AMD ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``) passed through its
  path. That is more machinery between the configuration table and the machine code than the
  bitwise contract wants, for a gain (fusing around the kernels) an attention kernel barely has.

An opaque ``custom_op`` runs the same launcher code in eager and compiled mode, on the GPU and
under the interpreter.

The ops do **no input validation** of their own: the public functions (:mod:`portattn.api`)
check every argument before calling them. The one exception is on request: with
``check_values=True`` the forward op runs the public function's checks of the host values of
``cu_seqlens`` itself, as late as possible (right before its launch, still before any launch).
Called directly, the ops trust their arguments.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
from typing import NamedTuple

import torch

from portattn import forward_replay
from portattn.autocast import register_autocast_kernel
from portattn.backward_replay import replayed_backward
from portattn.kernels.plan import plan_problem, splits_p
from portattn.options import AttentionOptions

__all__ = [
    "BwdArgs",
    "EagerAttention",
    "FwdArgs",
    "bwd_impl",
    "fwd_impl",
    "varlen_bwd",
    "varlen_fwd",
]


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    # Gradients arriving from autograd may be expanded (stride 0) views; the kernels read any
    # token/head strides but need the head dim contiguous.
    return x if x.stride(-1) == 1 else x.contiguous()


def _empty_o32(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Placeholder for the float32 output when it is not stored: [0, Hq, Dv] float32."""
    return torch.empty((0, q.shape[1], v.shape[-1]), dtype=torch.float32, device=q.device)


# Explicit schemas (rather than inferred from the annotations) keep the ops' signatures stable
# and independent of how a given torch version reads annotations. Their option arguments are
# the fields of AttentionOptions, by name, made here from the record's fields (a new field
# needs nothing in this module): the leading ones (``LEADING_OPTIONS``) positional and
# required, the others after the op's own arguments with the record's defaults; the backward
# takes the fields that are not tensors (a tensor option, the sinks, is a forward input whose
# gradient the autograd formula computes). FwdArgs / BwdArgs are made from the same lists, so
# they mirror the schemas (tests/test_ops.py checks them against the registered ones).
LEADING_OPTIONS = ("causal", "softmax_scale", "kernel")
# The record's field annotations (strings: ``from __future__ import annotations``) as schema types.
_SCHEMA_TYPES = {"bool": "bool", "int": "int", "float": "float", "str": "str",
                 "torch.Tensor | None": "Tensor?"}  # fmt: skip
_OPTIONS = dataclasses.fields(AttentionOptions)
# The options record's fields: the ops' arguments of the same names.
OPTION_FIELDS = tuple(f.name for f in _OPTIONS)

# An op's own arguments, as schema text; each becomes (schema type, name, default or _REQUIRED)
_REQUIRED = object()
_FWD_HEAD = (
    "Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "SymInt max_seqlen_q, SymInt max_seqlen_k"
)
_FWD_OWN = "bool store_o32, bool check_values=False, Tensor? block_table=None"
_BWD_HEAD = (
    "Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o_for_delta, Tensor lse, Tensor? dlse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k"
)


def _parsed(text: str) -> list[tuple[str, str, object]]:
    """``"Tensor q, bool check_values=False"`` -> [("Tensor", "q", _REQUIRED), ("bool",
    "check_values", False)]."""
    arguments = []
    for argument in filter(None, text.split(", ")):
        kind, name_default = argument.split(" ")
        name, _, default = name_default.partition("=")
        arguments.append((kind, name, ast.literal_eval(default) if default else _REQUIRED))
    return arguments


def _op_arguments(head: str, own: str, tensors: bool) -> tuple[tuple[str, str, object], ...]:
    """An op's arguments: ``head`` (required), the leading options, ``own``, then the other
    options (``tensors``: with the tensor ones) with their defaults."""
    options = [(_SCHEMA_TYPES[str(f.type)], f.name, f.default) for f in _OPTIONS]
    leading = [(t, n, _REQUIRED) for t, n, _ in options if n in LEADING_OPTIONS]
    rest = [o for o in options if o[1] not in LEADING_OPTIONS and (tensors or o[0] != "Tensor?")]
    return (*_parsed(head), *leading, *_parsed(own), *rest)


def _schema(arguments: tuple) -> str:
    def spell(kind: str, name: str, default: object) -> str:
        if default is _REQUIRED:
            return f"{kind} {name}"
        return f"{kind} {name}={json.dumps(default) if isinstance(default, str) else default}"

    inner = ", ".join(spell(*a) for a in arguments)
    return f"({inner}) -> (Tensor, Tensor, Tensor)"


def _bound_args(name: str, arguments: tuple) -> type:
    """A named tuple of ``arguments``' names, order and defaults."""
    names = [n for _, n, _ in arguments]
    defaults = [d for _, _, d in arguments if d is not _REQUIRED]
    return collections.namedtuple(name, names, defaults=defaults)


_FWD_ARGUMENTS = _op_arguments(_FWD_HEAD, _FWD_OWN, tensors=True)
_BWD_ARGUMENTS = _op_arguments(_BWD_HEAD, "", tensors=False)
_FWD_SCHEMA = _schema(_FWD_ARGUMENTS)
_BWD_SCHEMA = _schema(_BWD_ARGUMENTS)


def _options(args: NamedTuple) -> AttentionOptions:
    """The options record from an op's bound arguments (the fields its schema has)."""
    return AttentionOptions(
        **{name: getattr(args, name) for name in OPTION_FIELDS if name in args._fields}
    )


def _option_args(options: AttentionOptions, fields: tuple[str, ...]) -> dict:
    """The options record as an op's keyword arguments (the fields its schema has)."""
    names = _OPTION_ARGS.get(fields)
    if names is None:
        names = _OPTION_ARGS[fields] = tuple(n for n in OPTION_FIELDS if n in fields)
    return {name: getattr(options, name) for name in names}


_OPTION_ARGS: dict[tuple[str, ...], tuple[str, ...]] = {}  # an op's fields -> its option fields


class FwdArgs(_bound_args("FwdArgs", _FWD_ARGUMENTS)):
    """``varlen_fwd``'s arguments: its schema's names, order and defaults (q, k, v,
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, the leading options, store_o32,
    check_values=False, block_table=None, the other options). Its Python functions (the op,
    its fake, its autograd formula) read their arguments through it, by name;
    ``FwdArgs.bind(...)`` spelled out (``*args``) is a call of the op."""

    __slots__ = ()

    @classmethod
    def bind(
        cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options, **rest
    ) -> FwdArgs:
        """The arguments of one call: the tensors and sizes, the options record and ``rest``
        (``store_o32``, ``check_values``, ``block_table``) by name."""
        return cls(
            q=q,
            k=k,
            v=v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            **_option_args(options, cls._fields),
            **rest,
        )


class BwdArgs(_bound_args("BwdArgs", _BWD_ARGUMENTS)):
    """``varlen_bwd``'s arguments: its schema's names, order and defaults (dout, q, k, v,
    o_for_delta, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, the
    leading options, the other options that are not tensors)."""

    __slots__ = ()


@torch.library.custom_op("portattn::varlen_fwd", mutates_args=(), schema=_FWD_SCHEMA)
def varlen_fwd(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward attention over a packed batch; its arguments are :class:`FwdArgs`.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D] (``stride(-1) == 1``, other strides free);
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1]; max_seqlen_q/k: ints at least the longest
    sequence; kernel: ``"varlen"`` or ``"fixed_order"``; store_o32: also return the float32
    output (the ``fixed_order`` backward needs it; must be True when that backward will run);
    check_values: read ``cu_seqlens`` on the host and check their values and ``max_seqlen``
    (ValueError) right before the launch. ``varlen_attention`` sets it in eager mode when both
    max_seqlen are given: the GPU, which idles from that host copy on, then waits only for the
    launch itself, not for the op's dispatch and the launcher's set-up. block_table: int32
    [B, pages_per_seq], or None; with it k and v are paged caches [num_pages, page_size, Hkv,
    D] and cu_seqlens_k counts each sequence's keys (forward only: no backward).
    causal, softmax_scale, kernel and the arguments after block_table: the fields of
    :class:`portattn.options.AttentionOptions`, as its docstring says (a tensor field, the
    sinks, is an input whose gradient this op's autograd formula computes).

    Returns (out [total_q, Hq, D] in q's dtype, lse float32 [total_q, Hq],
    out32 float32 [total_q, Hq, D] when store_o32, else an empty [0, Hq, D]); all contiguous.
    """
    out, lse, out32 = fwd_impl(*args)
    if out32 is None:  # an op returns fresh tensors, never None: a new empty one
        bound = FwdArgs(*args)
        out32 = _empty_o32(bound.q, bound.v)
    return out, lse, out32


def fwd_impl(
    *args, lse: torch.Tensor | None = None, options: AttentionOptions | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`varlen_fwd`'s implementation, the op's body but for its placeholder out32: returns
    (out, lse, out32 or None). An eager call with nothing to trace, differentiate, cast or
    redispatch gets the same result from it as from the op, without the dispatcher's Python
    layers (``forward_entry.run_forward`` decides when). ``lse``: a float32 [total_q, Hq]
    buffer to write the lse to in place of a new one (a scratch the caller never reads).
    ``options``: the record ``args`` were bound from (a direct call has it), else rebuilt.
    Its launches are planned once per signature and replayed after
    (:func:`portattn.forward_replay.replayed_forward`: the same kernels and arguments)."""
    a = FwdArgs(*args)
    out, lse, out32, _ = forward_replay.replayed_forward(
        a.q,
        a.k,
        a.v,
        a.cu_seqlens_q,
        a.cu_seqlens_k,
        a.max_seqlen_q,
        a.max_seqlen_k,
        _options(a) if options is None else options,
        a.store_o32,
        a.block_table,
        lse,
        a.check_values,
        a.sinks,
    )
    return out, lse, out32


# The ops' functions, fakes and autograd formula get every argument by position (the schemas
# have no keyword-only ones; trailing defaults may be left out): each binds them by name
# through FwdArgs / BwdArgs first.


@varlen_fwd.register_fake
def _varlen_fwd_fake(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's outputs as fake tensors: they follow q, v's head dim and ``store_o32``."""
    bound = FwdArgs(*args)
    q, v, store_o32 = bound.q, bound.v, bound.store_o32
    total_q, n_heads_q, _ = q.shape
    out_shape = (total_q, n_heads_q, v.shape[-1])  # [total_q, Hq, Dv]
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((total_q, n_heads_q), dtype=torch.float32, device=q.device)
    if not store_o32:
        return out, lse, _empty_o32(q, v)
    return out, lse, torch.empty(out_shape, dtype=torch.float32, device=q.device)


@torch.library.custom_op("portattn::varlen_bwd", mutates_args=(), schema=_BWD_SCHEMA)
def varlen_bwd(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`varlen_fwd`; its arguments are :class:`BwdArgs`.

    dout: [total_q, Hq, D] in q's dtype; o_for_delta: the forward's out (``varlen``) or its
    float32 out32 (``fixed_order``), [total_q, Hq, D]; lse: float32 [total_q, Hq]; dlse: float32
    [total_q, Hq] or None (the gradient of lse, folded into the row term ``delta - dlse``).
    All with ``stride(-1) == 1``. Returns contiguous (dq [total_q, Hq, D], dk, dv
    [total_k, Hkv, D]) in the input dtype.
    """
    return bwd_impl(*args)


def bwd_impl(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`varlen_bwd`'s implementation: what :class:`EagerAttention`'s backward runs in
    place of the op (the same function, so the same bits)."""
    a = BwdArgs(*args)
    problem = plan_problem(
        a.q,
        a.k,
        a.cu_seqlens_q,
        a.max_seqlen_q,
        a.max_seqlen_k,
        _options(a),
        head_dim_v=a.v.shape[-1],
    )
    tensors = (a.dout, a.q, a.k, a.v, a.o_for_delta, a.lse, a.dlse, a.cu_seqlens_q, a.cu_seqlens_k)
    return replayed_backward(problem, *tensors)


@varlen_bwd.register_fake
def _varlen_bwd_fake(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients as fake tensors: like q, k and v, whatever the other arguments."""
    bound = BwdArgs(*args)
    q, k, v = bound.q, bound.k, bound.v
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    return dq, dk, dv


def _fwd_setup_context(ctx, inputs, output, options: AttentionOptions | None = None) -> None:
    """The op's autograd context (``options``: the record ``inputs`` were bound from, else
    rebuilt from them)."""
    args = FwdArgs(*inputs)
    out, lse, out32 = output
    if out32 is not None:  # EagerAttention's is None where the op's is a placeholder
        ctx.mark_non_differentiable(out32)
    ctx.set_materialize_grads(False)
    # fixed_order computes the backward's row term from the float32 output.
    o_for_delta = out32 if splits_p(args.kernel) else out
    ctx.save_for_backward(
        args.q, args.k, args.v, o_for_delta, lse, args.cu_seqlens_q, args.cu_seqlens_k, args.sinks
    )
    ctx.max_seqlen_q, ctx.max_seqlen_k = args.max_seqlen_q, args.max_seqlen_k
    if options is None or options.sinks is not None:  # the sinks: a saved tensor
        options = _options(args._replace(sinks=None))
    ctx.options = options
    ctx.missing_o32 = splits_p(args.kernel) and not args.store_o32
    ctx.paged = args.block_table is not None


def _fwd_backward(ctx, dout, dlse, _dout32):
    return _gradients(ctx, dout, dlse, varlen_bwd)


def _gradients(ctx, dout, dlse, run_bwd, needs: FwdArgs | None = None):
    """The gradient of every forward input (``FwdArgs`` order, None where not needed) from the
    saved context; ``run_bwd``: the backward op, or its implementation (EagerAttention);
    ``needs``: which inputs need one (default: the context's ``needs_input_grad``)."""
    q, k, v, o_for_delta, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    if ctx.paged:
        raise RuntimeError("portattn::varlen_fwd with a block_table (paged K/V) has no backward")
    if ctx.missing_o32:
        raise RuntimeError(
            "portattn::varlen_fwd with kernel='fixed_order' needs store_o32=True for its "
            "backward (the row term is computed from the float32 output)"
        )
    if dout is None:  # only lse was used downstream
        dout = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    needs = FwdArgs(*ctx.needs_input_grad) if needs is None else needs
    grads = FwdArgs(*[None] * len(FwdArgs._fields))  # one per input, by name
    if sinks is not None and needs.sinks:
        grads = grads._replace(sinks=sink_grad(sinks, o_for_delta, dout, lse, dlse))
    if not (needs.q or needs.k or needs.v):  # only the sinks' gradient is asked for
        return tuple(grads)
    args = BwdArgs(
        dout=_last_dim_contiguous(dout),
        q=q,
        k=k,
        v=v,
        o_for_delta=o_for_delta,
        lse=lse,
        dlse=None if dlse is None else _last_dim_contiguous(dlse.float()),
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=ctx.max_seqlen_q,
        max_seqlen_k=ctx.max_seqlen_k,
        **_option_args(ctx.options, BwdArgs._fields),
    )
    dq, dk, dv = run_bwd(*args)
    return tuple(grads._replace(q=dq, k=dk, v=dv))


def sink_grad(sinks, out, dout, lse, dlse) -> torch.Tensor:
    """d loss / d sinks, float32 [Hq]: ``-sum over rows of p_sink * (rowsum(O * dO) - dlse)``
    with ``p_sink = exp(sink_h - lse)`` (the sink's probability; it has no value, so its dP is
    0). A sum over every row of the batch, like any parameter's gradient: the same bits run to
    run for the same batch, not for another packing of it (design §3 covers the rows' outputs
    and dQ, dK, dV). out [T, Hq, D] (fixed_order: its float32 copy), lse float32 [T, Hq]."""
    delta = (out.float() * dout.float()).sum(-1)  # [T, Hq]
    if dlse is not None:
        delta = delta - dlse.float()
    p_sink = torch.exp(sinks.float()[None, :] - lse)  # [T, Hq]; rows with lse -inf: sink -inf
    p_sink = torch.where(torch.isneginf(lse), 0.0, p_sink)
    return -(p_sink * delta).sum(0)


varlen_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


class EagerAttention(torch.autograd.Function):
    """The forward op and its autograd formula for an eager call that needs a backward, without
    the dispatcher: ``EagerAttention.apply(options, *FwdArgs)`` runs :func:`fwd_impl` and, in the
    backward, :func:`bwd_impl` with the very context and gradient code the op registers. The
    op's Python layers (argument defaults filled from the schema, the aliasing check of its
    outputs, the autograd wrapper of ``custom_op``) cost about 110 us of host time per forward
    on the H200's host (``benchmarks/host_overhead.py --gpu``: 370 us with grad against 256
    without), more than a d64 forward of 16k tokens takes on the GPU.
    ``forward_entry.direct_call`` decides when it may stand in for the op (not under
    ``torch.compile``, a dispatch mode or a functorch transform). Its first argument is the
    options record the arguments were bound from."""

    @staticmethod
    def forward(ctx, options, *args):
        # options: the record args were bound from (no rebuilding it from them, twice)
        output = fwd_impl(*args, options=options)  # out32 None when not stored, unlike the op
        _fwd_setup_context(ctx, args, output, options)
        return output

    @staticmethod
    def backward(ctx, dout, dlse, _dout32):
        # Under create_graph=True (grad mode on here) the backward op runs, as on the op's
        # path: its gradients then raise on a second backward (it has no autograd formula)
        # instead of reading as "unused" (once_differentiable's None with allow_unused).
        run_bwd = varlen_bwd if torch.is_grad_enabled() else bwd_impl
        _, *needs = ctx.needs_input_grad  # the options record's, then FwdArgs'
        return None, *_gradients(ctx, dout, dlse, run_bwd, FwdArgs(*needs))


# Under torch.autocast, float q/k/v go to the autocast dtype before the op runs (portattn.autocast).
register_autocast_kernel(varlen_fwd, n_cast=3)
