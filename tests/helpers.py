"""Shared test helpers: random packs, running kernel and reference, the accuracy rule.

Running the kernels and the reference is ``portattn.tools.harness`` (shared with ``check``, golden
and the distributed demo); what is here is the tests' view of it: ``Pack`` in, ``dict`` out.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import torch

from portattn import accuracy
from portattn.accuracy import rel_err  # noqa: F401  (the tests import it from here)
from portattn.tools import harness
from portattn.tools.harness import Pack  # the tests build their packs as the harness reads them

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
KERNELS = ("varlen", "fixed_order")
ROOT = Path(__file__).resolve().parents[1]  # the checkout


def python_stdout(code: str) -> str:
    """What ``python -c code`` prints, run in a new process from the checkout (a fresh import
    of portattn, which this process has already done); a non-zero exit fails."""
    run = [sys.executable, "-c", code]
    return subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=True).stdout


def cu_seqlens(lengths: list[int], device=DEVICE) -> torch.Tensor:
    return harness.cu_seqlens(lengths, device)


def make_pack(
    lens_q: list[int],
    lens_k: list[int],
    n_heads_q: int = 4,
    n_heads_k: int = 2,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    noncontiguous: bool = False,
    device: str = DEVICE,
    head_dim_v: int | None = None,
) -> Pack:
    """Random packed inputs (never zeros). With ``noncontiguous``, q/k/v/dO are strided views
    (token stride and head stride larger than dense) with ``stride(-1) == 1``. ``head_dim_v``:
    v and dO get a head dim of their own, ``[T, H, Dv]`` (see :func:`_value_dim_pack`)."""
    if head_dim_v is not None:
        shape = harness.PackShape(tuple(lens_q), tuple(lens_k), n_heads_q, n_heads_k, head_dim)
        return _value_dim_pack(shape, head_dim_v, dtype, seed, noncontiguous, device)
    if not noncontiguous:
        q, k, v, do, dlse = harness.seeded_inputs(
            lens_q, lens_k, n_heads_q, n_heads_k, head_dim, dtype, device, seed
        )
        return Pack(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), do, dlse)
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    qkv_q = rand(tq, n_heads_q + 3, head_dim + 8)
    q = qkv_q[:, 1 : n_heads_q + 1, 8:]
    kv = rand(tk, 2, n_heads_k, head_dim)
    k, v = kv[:, 0], kv[:, 1]
    do = rand(tq, n_heads_q, 2 * head_dim)[:, :, :head_dim]
    dlse = torch.randn(tq, n_heads_q, generator=gen).to(device)
    return Pack(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), do, dlse)


def _value_dim_pack(
    shape: harness.PackShape,
    head_dim_v: int,
    dtype: torch.dtype,
    seed: int,
    noncontiguous: bool,
    device: str,
) -> Pack:
    """q, k ``[T, H, D]``, v and dO ``[T, H, Dv]``; ``noncontiguous``: one buffer per token
    holds q's heads (or k's and v's) and padding, so token and head strides exceed dense."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(shape.lens_q), sum(shape.lens_k)
    heads_q, heads_kv, head_dim = shape.heads_q, shape.heads_kv, shape.head_dim

    def rand(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen).to(dtype).to(device)

    if noncontiguous:
        q = rand(tq, heads_q + 3, head_dim + 8)[:, 1 : heads_q + 1, 8:]
        kv = rand(tk, heads_kv + 1, head_dim + head_dim_v + 8)
        k, v = kv[:, 1:, :head_dim], kv[:, 1:, head_dim + 8 :]
        do = rand(tq, heads_q, 2 * head_dim_v)[:, :, :head_dim_v]
    else:
        q, k = rand(tq, heads_q, head_dim), rand(tk, heads_kv, head_dim)
        v, do = rand(tk, heads_kv, head_dim_v), rand(tq, heads_q, head_dim_v)
    dlse = torch.randn(tq, heads_q, generator=gen).to(device)
    cu_q, cu_k = cu_seqlens(shape.lens_q, device), cu_seqlens(shape.lens_k, device)
    return Pack(q, k, v, cu_q, cu_k, do, dlse)


def run_kernel(p: Pack, kernel: str, causal: bool, use_dlse: bool = True, **kw):
    """Forward + backward through autograd (upstream gradients ``p.do`` on out and, with
    ``use_dlse``, ``p.dlse`` on lse); returns dict of out, lse, dq, dk, dv."""
    p = p if use_dlse else dataclasses.replace(p, dlse=None)
    return harness.run_kernel(p, causal=causal, kernel=kernel, **kw)


def run_reference(p: Pack, causal: bool, compute_dtype=torch.float64, use_dlse: bool = True, **kw):
    """The same computation through the reference, in ``compute_dtype``."""
    p = p if use_dlse else dataclasses.replace(p, dlse=None)
    return harness.run_reference(p, causal=causal, compute_dtype=compute_dtype, **kw)


def lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error over rows that see keys; -inf must match exactly."""
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "lse -inf rows differ"
    return accuracy.lse_err(lse, ref)


def assert_accurate(p: Pack, kernel: str, causal: bool, **kw) -> dict:
    """The acceptance rule (``portattn.accuracy``): every output's error against float64 is at
    most 2x the error of the same computation done eagerly in the input dtype, plus a small
    margin. Also: no NaN, and lse is -inf on exactly the reference's rows. With ``sinks``
    their gradient ``dsinks`` is held to the same rule."""
    return assert_outputs_accurate(run_kernel(p, kernel, causal, **kw), p, causal, **kw)


def assert_outputs_accurate(got: dict, p: Pack, causal: bool, **kw) -> dict:
    """:func:`assert_accurate` of kernel outputs ``got`` already computed (``kw``: the
    features the kernels ran with, passed to the reference)."""
    ref = run_reference(p, causal, **kw)
    eager = run_reference(p, causal, compute_dtype=p.q.dtype, **kw)
    report = {}
    extra = ("dsinks",) if kw.get("sinks") is not None else ()
    for name in ("out", "dq", "dk", "dv", "lse", *extra):
        assert not torch.isnan(got[name]).any(), f"{name} has NaN (unwritten or bad math)"
        if name == "lse":  # -inf on exactly the reference's rows (also the eager yardstick's)
            lse_err(got[name], ref[name])
            lse_err(eager[name].to(got[name].dtype), ref[name])
        err, base, bound = harness.measure(name, got[name], ref[name], eager[name])
        report[name] = (err, base)
        assert err <= bound, (
            f"{name}: error {err:.3g} > {bound:.3g} (2 x eager {base:.3g} + margin)"
        )
    return report


def assert_bitwise_equal(a: dict, b: dict, names=("out", "lse", "dq", "dk", "dv")) -> None:
    for name in names:
        assert torch.equal(a[name], b[name]), f"{name} differs bitwise"


def seeded_tensor(*shape, dtype=torch.bfloat16, seed=0, device=DEVICE) -> torch.Tensor:
    """A normal random tensor from a CPU generator seeded with ``seed`` (the same values on
    every device), in ``dtype`` on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


def assert_same_results(a, b) -> None:
    """Two calls' results are the same: equal tensors, bit for bit (a tensor or a tuple/list
    of them), or the same (exception type, message) pair."""
    if isinstance(a, tuple) and a and isinstance(a[0], type):
        assert a == b
        return
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def spy_decode_stages(monkeypatch) -> list[str]:
    """The stages of the decode launches planned from here on (``forward.plan_decode``'s), in
    the returned list (``monkeypatch`` undoes the spy)."""
    from portattn.kernels import forward

    seen: list[str] = []
    real = forward.plan_decode

    def spy(*args, **kw):
        launches, partials = real(*args, **kw)
        seen.extend(launch.stage for launch in launches)
        return launches, partials

    monkeypatch.setattr(forward, "plan_decode", spy)
    return seen


def table_family() -> str:
    """The table family the tests' tensors run (the interpreter's on a CPU)."""
    from portattn.configs.types import INTERPRETER
    from portattn.families import config_family

    device = torch.device(DEVICE)
    return INTERPRETER if device.type == "cpu" else config_family(device)


def patch_key_chunk(mp, chunk: bool, size: int | None = None, ws: bool = False) -> None:
    """Every entry of the family in use (:func:`table_family`) with fwd_ws off (``ws``: as the
    entry has it) and key_chunk = ``size`` keys, or two of its key tiles (``chunk``), or 0,
    through the monkeypatch ``mp``; every planned problem forgotten."""
    from portattn import configs
    from portattn.kernels import plan

    table = configs.config_table()
    family = table_family()
    for key, cfg in list(table.items()):
        if key[0] == family:
            keys = (size or 2 * cfg.fwd.block_n) if chunk else 0
            fwd_ws = cfg.fwd_ws and ws
            mp.setitem(table, key, dataclasses.replace(cfg, fwd_ws=fwd_ws, key_chunk=keys))
    plan.forget_problems()


def gpu_family() -> str:
    """The configuration family of this machine's GPU."""
    from portattn.families import config_family

    return config_family(torch.device("cuda"))


def problem_of(p: Pack, kernel: str, cfg):
    """The launchers' problem record of pack ``p`` (causal) with the table entry ``cfg``."""
    from portattn.kernels.plan import plan_problem
    from portattn.options import AttentionOptions

    options = AttentionOptions(causal=True, softmax_scale=1.0, kernel=kernel)
    return plan_problem(p.q, p.k, p.cu_q, p.q.shape[0], p.k.shape[0], options, cfg)
