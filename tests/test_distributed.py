"""portattn.distributed across 2 processes (torch.multiprocessing, spawn).

CPU: gloo, kernels under Triton's interpreter (conftest sets TRITON_INTERPRET=1 in this process's
environment before anything imports triton; the spawned ranks inherit it). GPU (``-m gpu``):
NCCL with one process per GPU when there are 2 GPUs, else 2 ranks sharing GPU 0 over gloo.

Checked, for each case: context-parallel out, lse, dq, dk, dv meet the float64-reference rule of
``helpers`` (as does the single call), the CP result is identical on every rank, and every
rank's tensor-parallel heads equal those heads of the single call in this process bitwise.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import DEVICE, HAS_GPU, Pack, lse_err, rel_err, run_kernel, run_reference

from benchmarks import distributed_demo as demo
from portattn.distributed import shard_heads, shard_keys

NAMES = ("out", "lse", "dq", "dk", "dv")
CPU_CASES = demo.default_cases("cpu")


@pytest.fixture(scope="module")
def cpu_launch() -> demo.Launch:
    """One spawn of 2 gloo ranks on the CPU for every CPU case (the spawn is the slow part)."""
    return demo.launch(world_size=2, device_kind="cpu", cases=CPU_CASES)


def _check(launch: demo.Launch, i: int) -> None:
    case = launch.cases[i]
    x = demo.make_inputs(case, DEVICE)
    p = Pack(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], x["dout"], x["dlse"])
    single = {n: t.cpu() for n, t in run_kernel(p, case.kernel, case.causal).items()}
    ref = {n: t.cpu() for n, t in run_reference(p, case.causal).items()}
    eager = run_reference(p, case.causal, compute_dtype=p.q.dtype)
    eager = {n: t.cpu() for n, t in eager.items()}
    per_rank = [r["results"][i] for r in launch.ranks]

    cp = dict(per_rank[0]["cp"])
    for name in ("dk", "dv"):
        cp[name] = demo.assemble_keys(launch.ranks, i, name, sum(case.shape.lens_k))
    # (a) context parallel: the float64-reference rule, like the single call
    for name in ("out", "dq", "dk", "dv"):
        base = rel_err(eager[name], ref[name])
        for label, got in (("cp", cp), ("single", single)):
            assert not torch.isnan(got[name]).any(), f"{case.name}: {label} {name} has NaN"
            err = rel_err(got[name], ref[name])
            assert err <= 2 * base + 1e-4, (
                f"{case.name}: {label} {name}: {err:.3g} > 2 x eager {base:.3g} + 1e-4"
            )
    base = lse_err(eager["lse"].float(), ref["lse"])
    for label, got in (("cp", cp), ("single", single)):
        err = lse_err(got["lse"], ref["lse"])
        assert err <= 2 * base + 1e-5, f"{case.name}: {label} lse: {err:.3g} > 2 x {base:.3g}"
    empty = torch.isneginf(single["lse"])
    assert (cp["out"][empty] == 0).all(), "rows that see no key must give out 0"
    for r, res in enumerate(per_rank[1:], start=1):  # the same bytes on every rank
        for name in ("out", "lse", "dq"):
            assert torch.equal(res["cp"][name], cp[name]), f"rank {r} cp {name} differs"
    # (b) tensor parallel: each rank's heads equal the single call's, bitwise
    for r, res in enumerate(per_rank):
        sq, skv = shard_heads(case.shape.heads_q, case.shape.heads_kv, launch.world_size, r)
        for name in NAMES:
            want = single[name][:, skv] if name in ("dk", "dv") else single[name][:, sq]
            assert torch.equal(res["tp"][name], want), f"{case.name}: rank {r} TP {name} differs"


def _splits_a_chunk(case: demo.Case, world: int) -> bool:
    """Whether some rank's key chunk is cut by the causal diagonal for some sequence, so that
    context_parallel_attention needs its two-call path (rows cut by the diagonal + full rows)."""
    for rank in range(world):
        for sq, sk in zip(case.shape.lens_q, case.shape.lens_k):
            end = sk * (rank + 1) // world  # shard_keys: rank r holds [sk * r // W, end)
            if 0 < min(max(end - sk + sq, 0), sq) < sq:
                return True
    return False


@pytest.mark.skipif(HAS_GPU, reason="CPU variant (interpreter); the gpu variant runs here")
@pytest.mark.parametrize("i", range(len(CPU_CASES)), ids=[c.name for c in CPU_CASES])
def test_cp_and_tp_cpu(cpu_launch, i):
    assert cpu_launch.backend == "gloo"
    if CPU_CASES[i].causal:
        assert _splits_a_chunk(CPU_CASES[i], 2)
    _check(cpu_launch, i)


@pytest.mark.gpu
def test_cp_and_tp_gpu():
    """NCCL, one process per GPU, when there are >= 2 GPUs; else 2 ranks on GPU 0 over gloo."""
    launch = demo.launch(world_size=2, device_kind="cuda")
    if torch.cuda.device_count() >= 2:
        assert launch.backend == "nccl"
    for i in range(len(launch.cases)):
        _check(launch, i)


def test_shard_helpers():
    assert shard_heads(8, 2, 2, 1) == (slice(4, 8), slice(1, 2))
    assert shard_heads(12, 4, 4, 3) == (slice(9, 12), slice(3, 4))
    with pytest.raises(ValueError, match="whole GQA groups"):
        shard_heads(8, 1, 2, 0)
    with pytest.raises(ValueError, match="rank"):
        shard_heads(8, 2, 2, 2)
    cu = torch.tensor([0, 5, 5, 6, 13], dtype=torch.int32)
    pieces = [shard_keys(cu, 3, r) for r in range(3)]
    assert [c.tolist() for _, c in pieces] == [[0, 1, 1, 1, 3], [0, 2, 2, 2, 4], [0, 2, 2, 3, 6]]
    assert all(c.dtype == torch.int32 and i.dtype == torch.int64 for i, c in pieces)
    # per sequence, rank r's chunk follows rank r - 1's: concatenated in that order, all keys once
    order = []
    for b in range(4):
        for index, c in pieces:
            order += index[c[b] : c[b + 1]].tolist()
    assert order == list(range(13))


def _one_key_full_backward() -> None:
    """Full attention over one key whose score is negative (lse < 0), forward and backward: the
    dK/dV tile's key rows past that key compute P = exp(-lse) > 1 (never stored)."""
    import portattn

    q = torch.full((1, 1, 32), 0.5, dtype=torch.float16, requires_grad=True)
    k = torch.full((1, 1, 32), -0.5, dtype=torch.float16, requires_grad=True)
    v = torch.ones(1, 1, 32, dtype=torch.float16, requires_grad=True)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    out = portattn.varlen_attention(q, k, v, cu, cu, causal=False)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(g).all() for g in grads)  # the stored values are finite


@pytest.mark.skipif(HAS_GPU, reason="numpy computes the lanes only under the interpreter")
def test_demo_ranks_quiet_on_unstored_lanes():
    """The demo's CPU ranks printed numpy RuntimeWarnings (overflow, invalid value) from lanes
    the kernels never store; the ranks now run under ``unstored_lanes_quiet``. Both halves: the
    case does warn without it (else this test proves nothing), and not with it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(Exception, match="overflow encountered|invalid value encountered"):
            _one_key_full_backward()
        with demo.unstored_lanes_quiet():
            _one_key_full_backward()


def test_former_demo_command_says_where_it_went():
    """``python -m portattn.distributed --demo`` (the former spelling) exits 2 naming the new one,
    instead of exiting 0 having run nothing; that file exists."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "portattn.distributed", "--demo"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "python benchmarks/distributed_demo.py" in proc.stderr
    assert (Path(__file__).resolve().parents[1] / "benchmarks" / "distributed_demo.py").is_file()


def _bad_input_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 passes int64 cu_seqlens: every rank must raise (none may hang in a collective)."""
    import torch.distributed as dist

    from portattn.distributed import context_parallel_attention

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        q = torch.zeros(4, 2, 32, dtype=torch.float16)
        cu_q = torch.tensor([0, 4], dtype=torch.int32)
        cu_k = torch.tensor([0, 2], dtype=torch.int64 if rank == 1 else torch.int32)
        try:
            context_parallel_attention(q, q[:2], q[:2], cu_q, cu_k)
            message = "no error"
        except (TypeError, ValueError) as err:
            message = f"{type(err).__name__}: {err}"
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write(message)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(HAS_GPU, reason="CPU variant")
def test_bad_input_raises_on_every_rank():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(
            _bad_input_worker, args=(init_file, tmp), nprocs=2, join=True, start_method="spawn"
        )
        messages = [Path(tmp, f"rank{r}.txt").read_text() for r in range(2)]
    assert "cu_seqlens_k must have dtype torch.int32" in messages[1]
    assert (
        messages[0] == "ValueError: context_parallel_attention: the input of rank(s) [1] is invalid"
    )
