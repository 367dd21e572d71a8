"""Every bad input gets a clear ValueError / TypeError naming the argument, before launch."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICE, cu_seqlens, make_pack

import portattn
from portattn.validation import DTypeError


@pytest.fixture
def good():
    p = make_pack([5, 7], [6, 8], 4, 2, 64, seed=50)
    return dict(q=p.q, k=p.k, v=p.v, cu_seqlens_q=p.cu_q, cu_seqlens_k=p.cu_k)


def _call(args, **kw):
    return portattn.varlen_attention(**args, **kw)


def _raises(exc, match, args, **kw):
    with pytest.raises(exc, match=match):
        _call(args, **kw)


def test_good_input_runs(good):
    assert _call(good).shape == good["q"].shape


def test_dtypes(good):
    _raises(
        DTypeError, "q must be torch.float16 or torch.bfloat16", {**good, "q": good["q"].float()}
    )
    _raises(TypeError, "k must have the dtype of q", {**good, "k": good["k"].bfloat16()})
    _raises(ValueError, "v must have the dtype of q", {**good, "v": good["v"].bfloat16()})
    _raises(
        TypeError,
        "cu_seqlens_q must have dtype torch.int32",
        {**good, "cu_seqlens_q": good["cu_seqlens_q"].long()},
    )
    _raises(
        ValueError,
        "cu_seqlens_k must have dtype torch.int32",
        {**good, "cu_seqlens_k": good["cu_seqlens_k"].long()},
    )


def test_wrong_types(good):
    _raises(TypeError, "q must be a torch.Tensor", {**good, "q": [1.0]})
    _raises(TypeError, "cu_seqlens_k must be a torch.Tensor", {**good, "cu_seqlens_k": [0, 6, 14]})
    _raises(TypeError, "causal must be a bool", good, causal=1)
    _raises(TypeError, "softmax_scale must be a float", good, softmax_scale="0.1")
    _raises(TypeError, "max_seqlen_q must be an int", good, max_seqlen_q=7.0)
    _raises(TypeError, "kernel must be a str", good, kernel=None)


def test_shapes_and_heads(good):
    q, k, v = good["q"], good["k"], good["v"]
    _raises(ValueError, "q must be 3-D", {**good, "q": q[None]})
    _raises(
        ValueError,
        "head dim must be one of",
        {**good, "q": q[..., :36], "k": k[..., :36], "v": v[..., :36]},
    )
    _raises(ValueError, "k head dim must equal q's", {**good, "k": k[..., :32]})
    _raises(ValueError, "k and v must have the same shape", {**good, "v": v[:, :1]})
    _raises(
        ValueError,
        r"Hq \(4\) must be a multiple of Hkv \(3\)",
        {**good, "k": torch.cat([k, k[:, :1]], 1), "v": torch.cat([v, v[:, :1]], 1)},
    )
    wide = torch.randn(q.shape[0], 4, 128, dtype=q.dtype, device=q.device)
    _raises(ValueError, r"q.stride\(-1\) must be 1", {**good, "q": wide[..., ::2]})


def test_cu_seqlens(good):
    dev = good["q"].device
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    _raises(ValueError, r"cu_seqlens_q\[0\] must be 0", {**good, "cu_seqlens_q": t([1, 5, 12])})
    _raises(
        ValueError, "cu_seqlens_q must be non-decreasing", {**good, "cu_seqlens_q": t([0, 13, 12])}
    )
    _raises(
        ValueError,
        r"cu_seqlens_k\[-1\] must equal the total token count 14",
        {**good, "cu_seqlens_k": t([0, 6, 13])},
    )
    _raises(ValueError, "same batch", {**good, "cu_seqlens_k": t([0, 14])})
    _raises(ValueError, "must be 1-D", {**good, "cu_seqlens_q": t([[0, 5, 12]])})


def test_max_seqlen(good):
    _raises(
        ValueError,
        r"max_seqlen_q=6 is smaller than the longest sequence \(7\)",
        good,
        max_seqlen_q=6,
    )
    _raises(
        ValueError,
        r"max_seqlen_k=7 is smaller than the longest sequence \(8\)",
        good,
        max_seqlen_k=7,
    )
    # larger is allowed (flash-attn semantics) and gives the same bits
    a = _call(good)
    b = _call(good, max_seqlen_q=100, max_seqlen_k=9)
    assert torch.equal(a, b)


def test_numeric_types_accepted(good):
    """numpy integers and floats are ints and floats too (a common source of max_seqlen)."""
    import numpy as np

    a = _call(
        good, max_seqlen_q=np.int64(7), max_seqlen_k=np.int32(8), softmax_scale=np.float32(0.125)
    )
    b = _call(good, max_seqlen_q=7, max_seqlen_k=8, softmax_scale=0.125)
    assert torch.equal(a, b)
    _raises(TypeError, "max_seqlen_k must be an int", good, max_seqlen_k=True)
    _raises(TypeError, "softmax_scale must be a float", good, softmax_scale=True)


def test_scale_and_kernel(good):
    _raises(ValueError, "softmax_scale must be a finite number > 0", good, softmax_scale=0.0)
    _raises(
        ValueError, "softmax_scale must be a finite number > 0", good, softmax_scale=float("nan")
    )
    _raises(ValueError, "softmax_scale must be a finite number > 0", good, softmax_scale=-1.0)
    _raises(ValueError, "kernel must be one of", good, kernel="flash")


@pytest.mark.gpu
def test_devices(good):
    _raises(ValueError, "k must be on the device of q", {**good, "k": good["k"].cpu()})
    _raises(
        ValueError, "cu_seqlens_q must be on", {**good, "cu_seqlens_q": good["cu_seqlens_q"].cpu()}
    )


def test_cpu_tensors_without_interpreter(good, monkeypatch):
    if DEVICE != "cpu":
        good = {n: x.cpu() for n, x in good.items()}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _raises(ValueError, "TRITON_INTERPRET=1", good)


def test_dense_checks():
    q = torch.randn(2, 5, 4, 64, device=DEVICE).half()
    k = torch.randn(3, 5, 2, 64, device=DEVICE).half()
    with pytest.raises(ValueError, match="same batch size"):
        portattn.attention(q, k, k)
    with pytest.raises(ValueError, match="q must be 4-D"):
        portattn.attention(q[0], k[0], k[0])


@pytest.fixture
def launches(monkeypatch):
    """Kernel launches during the test. On a GPU, those the driver made (Triton's launch-exit
    hook: the value checks run from the launch-enter hook and abort the launch, so a call that
    raises must leave this empty); under the CPU interpreter (no hooks; the checks run before
    the launch call), calls of the forward kernels' launchers."""
    made: list[str] = []
    if DEVICE == "cuda":
        from triton import knobs

        def count(metadata) -> None:
            made.append(str(metadata))

        knobs.runtime.launch_exit_hook.add(count)
        yield made
        knobs.runtime.launch_exit_hook.remove(count)
        return
    import portattn.kernels.forward as forward_module

    class Recorded:
        def __getitem__(self, grid):
            made.append(str(grid))
            raise AssertionError("launched")

    monkeypatch.setattr(forward_module, "attn_fwd_kernel", Recorded())
    monkeypatch.setattr(forward_module, "attn_fwd_ws_kernel", Recorded())
    yield made


def test_no_launch_on_bad_input(good, launches):
    """Errors come before any kernel launch, also those of the value checks that the forward op
    runs itself (both max_seqlen given) right before its launch."""
    given = dict(max_seqlen_q=7, max_seqlen_k=8)  # both given: the op checks the values
    _raises(ValueError, "smaller than the longest", good, **{**given, "max_seqlen_q": 1})
    _raises(ValueError, "smaller than the longest", good, max_seqlen_q=1)  # checked in the API
    bad_cu = good["cu_seqlens_q"].clone()
    bad_cu[1] = 13  # [0, 13, 12]: not non-decreasing
    _raises(ValueError, "non-decreasing", {**good, "cu_seqlens_q": bad_cu}, **given)
    _raises(ValueError, "non-decreasing", {**good, "cu_seqlens_q": bad_cu})
    short_cu = good["cu_seqlens_k"].clone()
    short_cu[-1] = 13  # the last entry is not the token count
    _raises(
        ValueError, "cu_seqlens_k\\[-1\\] must equal", {**good, "cu_seqlens_k": short_cu}, **given
    )
    assert launches == []
    assert cu_seqlens([1]).dtype == torch.int32


@pytest.mark.gpu
def test_value_checks_leave_launch_hooks_as_they_were(good, launches):
    """The value checks run from Triton's launch-enter hook and take themselves out again,
    after a good call and after a bad one; a good call launches (the counter sees launches)."""
    from triton import knobs

    before = list(knobs.runtime.launch_enter_hook.calls)
    given = dict(max_seqlen_q=7, max_seqlen_k=8)
    _call(good, **given)
    assert launches, "the launch-exit hook saw no launch"
    n_good = len(launches)
    _raises(ValueError, "smaller than the longest", good, **{**given, "max_seqlen_q": 1})
    assert len(launches) == n_good
    assert knobs.runtime.launch_enter_hook.calls == before


def test_value_checks_run_in_the_op_when_max_seqlen_given(good, monkeypatch):
    """With both max_seqlen given, eager calls leave the cu_seqlens value checks to the forward
    op (right before its launch): the API does not read the values itself."""
    import portattn.api as api_module

    def no_api_value_checks(*a, **kw):
        raise AssertionError("the API read cu_seqlens")

    monkeypatch.setattr(api_module, "check_varlen", no_api_value_checks)
    ref = _call(good, max_seqlen_q=7, max_seqlen_k=8)
    assert ref.shape == good["q"].shape
    bad_cu = good["cu_seqlens_q"].clone()
    bad_cu[0] = 1
    _raises(
        ValueError,
        r"cu_seqlens_q\[0\] must be 0",
        {**good, "cu_seqlens_q": bad_cu},
        max_seqlen_q=7,
        max_seqlen_k=8,
    )
    _raises(TypeError, "max_seqlen_k must be an int", good, max_seqlen_q=7, max_seqlen_k=8.0)
    _raises(ValueError, "max_seqlen_q must be >= 0", good, max_seqlen_q=-1, max_seqlen_k=8)


def test_checks_at_launch_runs_the_check_in_the_launch(monkeypatch):
    """``checks_at_launch`` (host_checks.py) outside the interpreter: the check runs when the
    driver's launcher calls Triton's launch-enter hook (simulated here by calling the chain),
    once, not before; an error there propagates (the launcher then launches nothing) and the
    hook is gone afterwards; without a launch in the block the check runs at its end; another
    thread's launch does not run it."""
    import threading

    from triton import knobs

    from portattn.kernels import host_checks

    monkeypatch.setattr(host_checks, "interpreter_active", lambda: False)
    chain = knobs.runtime.launch_enter_hook
    before = list(chain.calls)
    calls: list[str] = []

    def check() -> None:
        calls.append("check")

    with host_checks.checks_at_launch(check):
        assert calls == []
        other = threading.Thread(target=chain, args=(None,))  # another thread's launch
        other.start()
        other.join()
        assert calls == []
        chain(None)  # this thread's launch
        assert calls == ["check"]
        chain(None)  # a second launch in the block: checked once
    assert calls == ["check"] and chain.calls == before

    def bad() -> None:
        raise ValueError("bad cu_seqlens")

    with pytest.raises(ValueError, match="bad cu_seqlens"), host_checks.checks_at_launch(bad):
        chain(None)
        raise AssertionError("launched after a failed check")
    assert chain.calls == before

    with pytest.raises(ValueError, match="bad cu_seqlens"), host_checks.checks_at_launch(bad):
        pass  # nothing launched: the check runs at the end
    assert chain.calls == before


def test_checks_at_launch_under_the_interpreter_checks_first(monkeypatch):
    """Under the CPU interpreter (no launch hooks), or with ``CHECK_IN_LAUNCH_HOOK`` off, the
    check runs before the block's body."""
    from portattn.kernels import host_checks

    calls: list[str] = []
    for interpreted, in_hook in ((True, True), (False, False)):
        monkeypatch.setattr(host_checks, "interpreter_active", lambda i=interpreted: i)
        monkeypatch.setattr(host_checks, "CHECK_IN_LAUNCH_HOOK", in_hook)
        with host_checks.checks_at_launch(lambda: calls.append("check")):
            calls.append("body")
    assert calls == ["check", "body", "check", "body"]


# ----------------------------------------------------------------------------- defects


def test_cu_seqlens_must_be_contiguous(good):
    """A strided cu_seqlens view: the value checks read it through its stride, the kernels read
    dense memory. Refused (ValueError naming it) on both paths; a stride-1 view is fine."""
    dev = good["q"].device
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    strided_q = t([0, 2, 5, 2, 12])[::2]  # values [0, 5, 12]; memory [0, 2, 5]
    strided_k = t([0, 3, 6, 3, 14])[::2]  # values [0, 6, 14]
    assert strided_q.tolist() == good["cu_seqlens_q"].tolist()
    given = dict(max_seqlen_q=7, max_seqlen_k=8)
    for kw in ({}, given):
        _raises(
            ValueError,
            r"cu_seqlens_q must be contiguous \(stride 1\), got stride 2",
            {**good, "cu_seqlens_q": strided_q},
            **kw,
        )
        _raises(
            ValueError,
            r"cu_seqlens_k must be contiguous \(stride 1\), got stride 2",
            {**good, "cu_seqlens_k": strided_k},
            **kw,
        )
    offset = t([9, 0, 5, 12])[1:]  # stride 1, storage offset 1: what the kernels read
    assert torch.equal(_call({**good, "cu_seqlens_q": offset}), _call(good))


@pytest.mark.parametrize(
    "scale",
    [1e-46, 1e-300, 2.0**-127, 3e38, 1e39, 10**400],
    ids=["1e-46", "1e-300", "subnormal", "3e38", "1e39", "10**400"],
)
def test_softmax_scale_outside_float32_rejected(good, scale):
    """Finite in float64 but 0, subnormal or inf in float32 (or its scale * log2(e) overflows
    float32): the kernels would compute NaN. ValueError, before any launch."""
    _raises(ValueError, "softmax_scale must be", good, softmax_scale=scale)


def test_softmax_scale_float32_bounds():
    """The smallest normal float32 is the least scale; 2**16 the largest (validation_params:
    the float32 scores stay far from overflow), well inside float32 with * log2(e)."""
    from portattn.validation import check_softmax_scale

    assert check_softmax_scale(2.0**-126, 64) == 2.0**-126  # the smallest normal float32
    assert check_softmax_scale(2.0**16, 64) == 2.0**16
    assert check_softmax_scale(None, 64) == 0.125
    with pytest.raises(ValueError, match="float32"):
        check_softmax_scale(2.0**-126 * 0.99, 64)
    for scale in (2.3e38, 2.4e38, 2.0**16 + 1):
        with pytest.raises(ValueError, match=r"at most 2\*\*16"):
            check_softmax_scale(scale, 64)


@pytest.fixture
def many():
    """40 one-token sequences: ceil((2**31 - 1) / 16) * 40 grid programs exceed 2**31 - 1."""
    p = make_pack([1] * 40, [1] * 40, 2, 1, 32, seed=51)
    return dict(q=p.q, k=p.k, v=p.v, cu_seqlens_q=p.cu_q, cu_seqlens_k=p.cu_k)


def test_max_seqlen_bounds(good, many):
    """max_seqlen above what the kernels index (int32 rows, 2**31 - 1 programs on a grid's
    axis 0) raises ValueError before any launch, given alone or with the other, for q and for k
    (the forward does not use max_seqlen_k: without the check only the backward failed)."""
    for name, other in (("max_seqlen_q", "max_seqlen_k"), ("max_seqlen_k", "max_seqlen_q")):
        for value in (2**40, 2**31):
            _raises(ValueError, rf"{name} must be at most 2\*\*31 - 1", good, **{name: value})
            _raises(
                ValueError, rf"{name} must be at most 2\*\*31 - 1", good, **{name: value, other: 8}
            )
        for kw in ({name: 2**31 - 1}, {name: 2**31 - 1, other: 1}):
            _raises(ValueError, rf"{name}=2147483647 with 40 sequences needs", many, **kw)
    # within the bounds: accepted (the forward's grid follows max_seqlen_q), same bits
    assert torch.equal(_call(good, max_seqlen_q=7, max_seqlen_k=2**31 - 1), _call(good))


def test_max_seqlen_far_above_the_tokens_sizes_the_grid_by_the_tokens(good):
    """max_seqlen is an upper bound (flash-attn's hint): 2**31 - 1 with 12 query tokens
    launches a grid sized by the 12 tokens (no sequence holds more), not 2**27 programs per
    sequence (the interpreter hung sizing it); forward and backward, the same bits."""
    args = {k: v.clone().requires_grad_() if k in "qkv" else v for k, v in good.items()}
    want = _call(args, return_lse=True)
    got = _call(args, max_seqlen_q=2**31 - 1, max_seqlen_k=2**31 - 1, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    grads = [torch.autograd.grad(out[0].sum(), [args[n] for n in "qkv"]) for out in (got, want)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_smallest_tile_bounds_every_configuration():
    """The grid bound of max_seqlen assumes no kernel tile is smaller than SMALLEST_TILE."""
    from portattn.configs import config_table
    from portattn.validation import SMALLEST_TILE

    for key, cfg in config_table().items():
        for tiles in (cfg.fwd, cfg.bwd_pre, cfg.bwd_dkdv, cfg.bwd_dq, cfg.bwd_dv):
            if tiles is not None:
                assert min(tiles.block_m, tiles.block_n) >= SMALLEST_TILE, key


def test_rank_and_head_dim_checked_first(good):
    """A 0-D tensor or head dim 0: ValueError naming the tensor / the head dim (not an
    IndexError or ZeroDivisionError from the default scale)."""
    q, k, v = good["q"], good["k"], good["v"]
    scalar = torch.tensor(1.0, dtype=q.dtype, device=q.device)
    _raises(ValueError, r"q must be 3-D, got shape \(\)", {**good, "q": scalar})
    _raises(ValueError, r"k must be 3-D, got shape \(\)", {**good, "k": scalar})
    no_dim = {**good, "q": q[..., :0], "k": k[..., :0], "v": v[..., :0]}
    _raises(ValueError, "head dim must be one of .*, got 0", no_dim)
    _raises(ValueError, "head dim must be one of .*, got 0", no_dim, softmax_scale=0.5)
    dense = q[None]
    with pytest.raises(ValueError, match=r"q must be 4-D, got shape \(\)"):
        portattn.attention(scalar, dense, dense)
    with pytest.raises(ValueError, match="head dim must be one of .*, got 0"):
        portattn.attention(dense[..., :0], dense[..., :0], dense[..., :0])


def test_numpy_bools_accepted_other_types_named(good):
    """causal / return_lse: Python or numpy bools (the same result), nothing else; every type
    error names the qualified type (numpy.int64, numpy.ndarray), not a bare 'bool'."""
    import numpy as np

    ref_out, ref_lse = _call(good, causal=True, return_lse=True)
    out, lse = _call(good, causal=np.True_, return_lse=np.bool_(True))
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(_call(good, causal=np.False_, return_lse=np.False_), _call(good))
    _raises(TypeError, "causal must be a bool, got int$", good, causal=1)
    _raises(TypeError, "causal must be a bool, got numpy.int64", good, causal=np.int64(1))
    _raises(TypeError, "return_lse must be a bool, got str", good, return_lse="yes")
    _raises(TypeError, "return_lse must be a bool, got NoneType", good, return_lse=None)
    _raises(TypeError, "q must be a torch.Tensor, got numpy.ndarray", {**good, "q": np.ones(3)})
    _raises(TypeError, "max_seqlen_q must be an int or None, got float", good, max_seqlen_q=7.0)
    _raises(
        TypeError,
        "max_seqlen_k must be an int, got numpy.float64",
        good,
        max_seqlen_q=7,
        max_seqlen_k=np.float64(8),
    )
    _raises(TypeError, "softmax_scale must be a float or None, got str", good, softmax_scale="1")
    dense = good["q"][None]
    ref = portattn.attention(dense, dense, dense, causal=True)
    assert torch.equal(portattn.attention(dense, dense, dense, causal=np.True_), ref)
    with pytest.raises(TypeError, match="causal must be a bool, got numpy.int32"):
        portattn.attention(dense, dense, dense, causal=np.int32(1))
