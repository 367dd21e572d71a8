"""``python benchmarks/distributed_demo.py``: context-parallel and tensor-parallel attention on
several processes, checked against one process.

The parent spawns ``--world-size`` ranks (default 2). Backend and placement:

- 2+ GPUs (at least one per rank): NCCL, one process per GPU;
- 1 GPU: gloo, every rank on GPU 0 (NCCL refuses two ranks on one device); collectives go
  through host copies;
- no GPU: gloo on the CPU, kernels under Triton's interpreter (set for the children here).

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1`` in the children's environment).

Each rank, for each case (dtype, kernel, causal), from the same seeded inputs:

- **CP**: takes its chunk of every sequence's keys (:func:`portattn.distributed.shard_keys`),
  runs :func:`portattn.distributed.context_parallel_attention` forward and backward;
- **TP**: takes its heads (:func:`portattn.distributed.shard_heads`) and runs
  ``varlen_attention`` forward and backward on them;
- rank 0 also runs the single call over everything.

The parent then checks: CP out, lse, dq, dk, dv against the float64 reference with the rule of
``python -m portattn check`` (error at most 2x the eager error in the input dtype plus a margin),
CP identical on every rank, and every rank's TP heads bitwise equal (``torch.equal``) to those
heads of rank 0's single call. Exit 0 if everything passes, 1 otherwise, 2 if it cannot run.
The test suite (``tests/test_distributed.py``) reuses :func:`launch` and :func:`make_inputs`.
The forward + backward runs and the float64 reference are those of ``portattn.tools.harness``.

Run from a checkout (the demo is not part of the installed package; ``portattn.distributed``
never imports it). ``--demo`` is accepted and ignored (the former ``python -m
portattn.distributed --demo`` took it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python benchmarks/distributed_demo.py`: the checkout on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from portattn.accuracy import error
from portattn.api import varlen_attention
from portattn.configs import interpreter_active
from portattn.distributed import context_parallel_attention, shard_heads, shard_keys
from portattn.tools.check import numpy_problem
from portattn.tools.harness import (
    NAMES,
    Pack,
    PackShape,
    cu_seqlens,
    forward_backward,
    measure,
    run_reference,
    seeded_inputs,
    zero_where_no_key,
)

# Keep NVLink multicast off in every process (the lent multi-GPU machines require it).
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class Case:
    """One checked configuration: the pack's ``shape`` and its dtype, kernel, mask and seed."""

    dtype: str
    kernel: str
    causal: bool
    shape: PackShape
    seed: int

    @property
    def name(self) -> str:
        return f"{self.dtype} {self.kernel} {'causal' if self.causal else 'full'}"


def default_cases(device_kind: str, world_size: int = 2) -> list[Case]:
    """CPU (interpreter): small float16 packs. GPU: larger packs, both dtypes and kernels. The
    packs hold an empty query sequence, an empty key chunk, and (causal) rows that see no key."""
    if device_kind == "cpu":
        shape = PackShape((5, 0, 12, 3, 7), (9, 4, 12, 1, 2), 2 * world_size, world_size, 32)
        combos = [("float16", "varlen", False), ("float16", "varlen", True)]
        combos += [("float16", "fixed_order", True)]
    else:
        lens = ((1, 63, 0, 300, 1000, 17), (40, 63, 9, 300, 1000, 5))
        shape = PackShape(*lens, 4 * world_size, world_size, 128)
        combos = list(
            itertools.product(("bfloat16", "float16"), ("varlen", "fixed_order"), (False, True))
        )
    return [Case(d, k, c, shape, seed=1000 + i) for i, (d, k, c) in enumerate(combos)]


def make_inputs(case: Case, device) -> dict[str, torch.Tensor]:
    """q, k, v, dout (case dtype), dlse (float32), cu_q, cu_k: the same on every process."""
    names = ("q", "k", "v", "dout", "dlse")
    shape = case.shape
    x = seeded_inputs(
        shape.lens_q,
        shape.lens_k,
        shape.heads_q,
        shape.heads_kv,
        shape.head_dim,
        getattr(torch, case.dtype),
        device,
        case.seed,
    )
    cu = {"cu_q": cu_seqlens(shape.lens_q, device), "cu_k": cu_seqlens(shape.lens_k, device)}
    return dict(zip(names, x, strict=True)) | cu


def _cpu(result: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: x.cpu() for n, x in result.items()}


def _fwd_bwd(fn, leaves, dout, dlse) -> dict[str, torch.Tensor]:
    """:func:`portattn.tools.harness.forward_backward` (upstream gradients dout on out, dlse on
    lse), as CPU copies."""
    return _cpu(forward_backward(fn, leaves, dout, dlse))


def _rank_results(case: Case, rank: int, world: int, device) -> dict:
    x = make_inputs(case, device)
    q, k, v, cu_q, cu_k = x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"]
    kw = {"causal": case.causal, "return_lse": True, "kernel": case.kernel}
    index, cu_k_local = shard_keys(cu_k, world, rank)

    def cp(q_, k_, v_):
        return context_parallel_attention(q_, k_, v_, cu_q, cu_k_local, **kw)

    local_kv = (k.index_select(0, index), v.index_select(0, index))
    result = {"cp": _fwd_bwd(cp, (q, *local_kv), x["dout"], x["dlse"])}
    result["cp"]["index"] = index.cpu()

    sq, skv = shard_heads(case.shape.heads_q, case.shape.heads_kv, world, rank)

    def attn(q_, k_, v_):
        return varlen_attention(q_, k_, v_, cu_q, cu_k, **kw)

    # TP: this rank's heads as strided views of the full tensors (no copy)
    heads = (q[:, sq], k[:, skv], v[:, skv])
    result["tp"] = _fwd_bwd(attn, heads, x["dout"][:, sq], x["dlse"][:, sq])
    if rank == 0:
        result["single"] = _fwd_bwd(attn, (q, k, v), x["dout"], x["dlse"])
    return result


def unstored_lanes_quiet() -> contextlib.AbstractContextManager:
    """numpy's floating-point warnings off, for kernels run under Triton's interpreter.

    The interpreter computes every lane of a tile in numpy, also lanes the kernels never store.
    In the backward of full attention, the key rows of a sequence's last key tile that lie past
    its end load as zeros, so their scores are 0 and their P = exp(-lse): above 1 when the row's
    lse is negative (a short sequence of low scores, e.g. one key), which overflows float16 when
    P is scaled and rounded for dV, and inf * dO then sums to NaN. A GPU computes the same lanes
    without a word and the masked stores drop them; the warnings say nothing about the results.
    (Masking those rows would be a kernel change, with new machine code.) Real NaN still fail:
    outputs start as NaN (``buffers.POISON``) and the checks look for NaN."""
    import numpy as np  # the interpreter's (the CPU extra installs it)

    return np.errstate(over="ignore", invalid="ignore")


def _worker(rank: int, world: int, init_file: str, backend: str, device_kind: str, cases, out_dir):
    """One rank (spawned): run every case, save the results to ``out_dir/rank<r>.pt``."""
    import torch.distributed as dist

    from portattn.kernels import buffers

    buffers.POISON = True  # outputs start as NaN: an unwritten element cannot pass
    if device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        quiet = unstored_lanes_quiet() if device_kind == "cpu" else contextlib.nullcontext()
        with quiet:
            results = [_rank_results(case, rank, world, device) for case in cases]
        if device_kind == "cuda":
            name = torch.cuda.get_device_name(device)
            info = {"device": f"{device} ({name})"}
        else:
            info = {"device": "cpu"}
        torch.save({"results": results, "info": info}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@dataclass
class Launch:
    world_size: int
    backend: str
    device_kind: str
    placement: str
    cases: list[Case]
    ranks: list[dict]  # per rank: {"results": [per case dict], "info": {...}}
    seconds: float


def choose_backend(device_kind: str, world_size: int) -> tuple[str, str]:
    """(backend, placement): NCCL with one process per GPU when there are enough GPUs, else
    gloo (on the CPU, or every rank sharing the GPUs, communication through the host)."""
    if device_kind == "cpu":
        return "gloo", "CPU, kernels under Triton's interpreter"
    n_gpus = torch.cuda.device_count()
    if n_gpus >= world_size:
        return "nccl", "one process per GPU"
    return "gloo", f"{world_size} processes sharing {n_gpus} GPU(s), collectives via host"


def launch(world_size: int = 2, device_kind: str | None = None, cases=None, backend=None):
    """Spawn ``world_size`` ranks running :func:`_worker`, wait, return a :class:`Launch`."""
    import torch.multiprocessing as mp

    if device_kind is None:
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    cases = default_cases(device_kind, world_size) if cases is None else cases
    auto_backend, placement = choose_backend(device_kind, world_size)
    backend = backend or auto_backend
    if device_kind == "cpu" and not interpreter_active():
        # The spawned ranks inherit this environment and import triton at once; the command
        # line (main) re-runs itself with the interpreter on.
        raise RuntimeError(
            "CPU ranks run the kernels under Triton's interpreter: start the "
            "process with TRITON_INTERPRET=1"
        )
    saved = {k: os.environ.get(k) for k in NO_MULTICAST}
    os.environ.update(NO_MULTICAST)  # the children inherit the parent's environment
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="portattn-dist-") as tmp:
            init_file = os.path.join(tmp, "rendezvous")
            mp.start_processes(
                _worker,
                args=(world_size, init_file, backend, device_kind, cases, tmp),
                nprocs=world_size,
                join=True,
                start_method="spawn",
            )
            ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world_size)]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    seconds = time.perf_counter() - start
    return Launch(world_size, backend, device_kind, placement, cases, ranks, seconds)


def assemble_keys(ranks: list[dict], case_index: int, name: str, total_k: int) -> torch.Tensor:
    """A key gradient (``"dk"``/``"dv"``) of the whole pack from the ranks' CP chunks."""
    parts = [r["results"][case_index]["cp"] for r in ranks]
    full = torch.empty(total_k, *parts[0][name].shape[1:], dtype=parts[0][name].dtype)
    for part in parts:
        full[part["index"]] = part[name]
    return full


def _check_case(launch_: Launch, i: int, device) -> tuple[bool, list[str]]:
    case = launch_.cases[i]
    x = make_inputs(case, device)
    pack = Pack(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], x["dout"], x["dlse"])
    ref = run_reference(pack, causal=case.causal)
    # the reference's rows that see no key
    pack = dataclasses.replace(pack, dlse=zero_where_no_key(x["dlse"], ref["lse"]))
    eager = _cpu(run_reference(pack, causal=case.causal, compute_dtype=x["q"].dtype))
    ref = _cpu(ref)

    per_rank = [r["results"][i] for r in launch_.ranks]
    single = per_rank[0]["single"]
    cp = dict(per_rank[0]["cp"])
    for name in ("dk", "dv"):
        cp[name] = assemble_keys(launch_.ranks, i, name, sum(case.shape.lens_k))
    problems, cells, single_cells = [], [], []
    for name in NAMES:
        err, _, bound = measure(name, cp[name], ref[name], eager[name])
        single_err = error(name, single[name], ref[name])
        cells.append(f"{name} {err:.1e} <= {bound:.1e}")
        single_cells.append(f"{name} {single_err:.1e}")
        if torch.isnan(cp[name]).any():
            problems.append(f"CP {name} has NaN")
        elif not err <= bound:
            problems.append(f"CP {name} error {err:.3g} > limit {bound:.3g}")
    if not torch.equal(torch.isneginf(cp["lse"]), torch.isneginf(ref["lse"])):
        problems.append("CP lse is -inf on other rows than the reference")
    for r, res in enumerate(per_rank[1:], start=1):
        for name in ("out", "lse", "dq"):
            if not torch.equal(res["cp"][name], per_rank[0]["cp"][name]):
                problems.append(f"CP {name} of rank {r} differs from rank 0's")
    diff_out = (
        (cp["out"].float() - single["out"].float()).abs().max().item() if cp["out"].numel() else 0.0
    )
    tp_bad = []
    for r, res in enumerate(per_rank):
        sq, skv = shard_heads(case.shape.heads_q, case.shape.heads_kv, launch_.world_size, r)
        for name in NAMES:
            want = single[name][:, skv] if name in ("dk", "dv") else single[name][:, sq]
            if not torch.equal(res["tp"][name], want):
                tp_bad.append(f"rank {r} {name}")
    if tp_bad:
        problems.append("TP differs bitwise from the single call: " + ", ".join(tp_bad))
    ranks = ", ".join(str(r) for r in range(launch_.world_size))
    lines = [
        f"  CP vs float64 (error <= limit): {', '.join(cells)}",
        f"  single call vs float64: {', '.join(single_cells)}; max |CP out - single out| "
        f"{diff_out:.1e}",
        "  TP heads vs single call: "
        + ("bitwise equal" if not tp_bad else "DIFFER")
        + f" on ranks {ranks} (out, lse, dq, dk, dv)",
    ]
    lines += [f"  problem: {p}" for p in problems]
    return not problems, lines


def run_demo(world_size: int = 2, backend: str | None = None) -> int:
    """Launch, check, print the report; return the exit code."""
    import torch.distributed as dist

    if not dist.is_available():
        print("error: this torch build has no torch.distributed", file=sys.stderr)
        return 2
    device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    if device_kind == "cpu":
        problem = numpy_problem()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    result = launch(world_size, device_kind, backend=backend)
    devices = ", ".join(r["info"]["device"] for r in result.ranks)
    print(
        f"portattn distributed demo: {world_size} ranks, backend {result.backend} "
        f"({result.placement}); devices: {devices}; {result.seconds:.1f}s"
    )
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    passed = 0
    for i, case in enumerate(result.cases):
        ok, lines = _check_case(result, i, device)
        passed += ok
        print(f"[{'PASS' if ok else 'FAIL'}] {case.name}")
        print("\n".join(lines))
    n = len(result.cases)
    verdict = "PASS" if passed == n else "FAIL"
    print(f"{verdict}: {passed} of {n} cases (CP within the float64 rule, TP bitwise)")
    return 0 if passed == n else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/distributed_demo.py",
        description="Context-parallel and tensor-parallel attention across processes: run "
        "the demo and check it against one process (exit 0 pass, 1 fail, 2 cannot run).",
    )
    parser.add_argument("--demo", action="store_true", help="accepted, ignored: the demo runs")
    parser.add_argument("--world-size", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        default=None,
        help="default: nccl with one process per GPU if there are enough GPUs, else gloo",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.world_size < 1:
        parser.error("--world-size must be >= 1")
    from portattn.tools.cli import needs_interpreter_rerun, rerun_under_interpreter

    if needs_interpreter_rerun():  # CPU ranks: the interpreter must be on from the start
        return rerun_under_interpreter([__file__, *argv])
    return run_demo(args.world_size, args.backend)


if __name__ == "__main__":
    # Through the package's module: the spawned ranks then unpickle ``_worker`` by that name.
    from benchmarks.distributed_demo import main as package_main

    raise SystemExit(package_main())
