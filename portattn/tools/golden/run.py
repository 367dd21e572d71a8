"""Running a golden case: inputs, the kernels (forward + backward), hashes, and accuracy.

Everything here takes the device as an argument, so the same code runs on a GPU and, for the
tests, on CPU tensors under Triton's interpreter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from portattn.api import varlen_attention
from portattn.tools.golden.cases import SINKS_OUTPUT, TENSOR_IDS, Case
from portattn.tools.golden.hashing import inputs_sha256, tensor_record
from portattn.tools.golden.inputs import generate
from portattn.tools.harness import (
    Pack,
    cu_seqlens,
    measure,
    run_kernel,
    run_reference,
    zero_where_no_key,
)


@dataclass
class CaseInputs:
    """The generated inputs of a case (on the device they were made on)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    dlse: torch.Tensor | None
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    sinks: torch.Tensor | None = None  # [Hq] float32, for a case with sinks

    def named(self) -> list[tuple[str, torch.Tensor]]:
        items = [("q", self.q), ("k", self.k), ("v", self.v), ("do", self.do)]
        if self.dlse is not None:
            items.append(("dlse", self.dlse))
        items += [("cu_seqlens_q", self.cu_q), ("cu_seqlens_k", self.cu_k)]
        if self.sinks is not None:  # last: the inputs of a case without sinks hash as before
            items.append(("sinks", self.sinks))
        return items

    def sha256(self) -> str:
        return inputs_sha256(self.named())


@dataclass
class CaseResult:
    """Outputs of one case on one device, and their golden record."""

    case: Case
    inputs: CaseInputs  # on the device
    outputs: dict[str, torch.Tensor]  # out, lse, dq, dk, dv (, dsinks) on the device
    inputs_sha256: str
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def output_record(self) -> dict[str, Any]:
        """What the golden file stores of it and compares: the inputs' hash, the tensors'."""
        return {"inputs_sha256": self.inputs_sha256, "tensors": self.tensors}


def make_inputs(case: Case, device: torch.device | str = "cpu") -> CaseInputs:
    """The case's inputs from the counter-based generator, made on ``device`` (the same values
    on every device)."""
    tq, tk, d, dtype = sum(case.lens_q), sum(case.lens_k), case.head_dim, case.torch_dtype
    dv = case.value_dim

    def gen(shape: tuple[int, ...], name: str, dtype: torch.dtype = dtype) -> torch.Tensor:
        return generate(shape, case.seed, TENSOR_IDS[name], dtype, device)

    return CaseInputs(
        q=gen((tq, case.heads_q, d), "q"),
        k=gen((tk, case.heads_kv, d), "k"),
        v=gen((tk, case.heads_kv, dv), "v"),
        do=gen((tq, case.heads_q, dv), "do"),
        dlse=gen((tq, case.heads_q), "dlse", torch.float32) if case.dlse else None,
        cu_q=cu_seqlens(case.lens_q, device),
        cu_k=cu_seqlens(case.lens_k, device),
        # Twice the generator's values (exact): sinks in [-4, 4) are of the size of the rows'
        # log-sum-exps here (about -2 to 5): a sink takes a few % of a row's weight, up to 99%.
        sinks=2 * gen((case.heads_q,), "sinks", torch.float32) if case.sinks else None,
    )


def run_kernels(case: Case, inputs: CaseInputs) -> dict[str, torch.Tensor]:
    """Forward and backward of ``case`` through the public API and autograd: upstream gradients
    ``do`` on out and (when the case has one) ``dlse`` on lse, zeroed on the rows whose lse is
    -inf. The leaves are fresh copies of q, k, v (and of the sinks: their gradient is
    ``dsinks``). The case's window and cap are passed through."""
    q, k, v = (t.detach().clone() for t in (inputs.q, inputs.k, inputs.v))
    sinks = None if inputs.sinks is None else inputs.sinks.detach().clone()
    return run_kernel(
        Pack(q, k, v, inputs.cu_q, inputs.cu_k, inputs.do, inputs.dlse),
        causal=case.causal,
        kernel=case.kernel,
        sinks=sinks,
        **case.features(),
    )


def paged_cache(case: Case, k: torch.Tensor, v: torch.Tensor):
    """k and v [total_k, Hkv, D] of ``case`` as paged caches [num_pages, page_size, Hkv, D]:
    the sequences' pages in reverse order, slots past a sequence's end NaN (never read), and
    the block table int32 [B, max pages] (entries past a sequence's pages -1)."""
    size = case.page_size
    pages = [-(-n // size) for n in case.lens_k]
    n_pages = sum(pages)
    shape = (n_pages, size, *k.shape[1:])
    k_cache = torch.full(shape, float("nan"), dtype=k.dtype, device=k.device)
    v_cache = torch.full(shape, float("nan"), dtype=v.dtype, device=v.device)
    table = torch.full((len(pages), max(pages, default=0)), -1, dtype=torch.int32)
    used, start = 0, 0
    for b, n in enumerate(case.lens_k):
        for j in range(pages[b]):
            page = n_pages - 1 - used  # reverse order: no sequence's pages are in place
            used += 1
            table[b, j] = page
            rows = min(size, n - j * size)
            k_cache[page, :rows] = k[start + j * size : start + j * size + rows]
            v_cache[page, :rows] = v[start + j * size : start + j * size + rows]
        start += n
    return k_cache, v_cache, table.to(k.device)


def run_paged(case: Case, inputs: CaseInputs) -> dict[str, torch.Tensor]:
    """The forward of a paged case: its query rows against the paged caches of its keys."""
    k_cache, v_cache, table = paged_cache(case, inputs.k, inputs.v)
    with torch.no_grad():
        out, lse = varlen_attention(
            inputs.q,
            k_cache,
            v_cache,
            inputs.cu_q,
            inputs.cu_k,
            causal=case.causal,
            return_lse=True,
            kernel=case.kernel,
            block_table=table,
            sinks=inputs.sinks,
            **case.features(),
        )
    return {"out": out, "lse": lse}


def sinks_record(dsinks: torch.Tensor) -> dict[str, Any]:
    """The record of ``dsinks`` [Hq]: a sum over every row of the pack, so it has no sequences;
    it is stored as one "sequence" with a digest per head (a mismatch then names the heads),
    with its own shape."""
    record = tensor_record(dsinks.reshape(1, -1), [0, 1])
    record["shape"] = list(dsinks.shape)
    return record


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compute_case(case: Case, device: torch.device | str) -> CaseResult:
    """Generate the inputs, run the kernels on ``device`` and hash every output."""
    device = torch.device(device)
    start = time.perf_counter()
    inputs = make_inputs(case, device)
    outputs = run_paged(case, inputs) if case.page_size else run_kernels(case, inputs)
    _synchronize(device)
    bounds_q, bounds_k = inputs.cu_q.tolist(), inputs.cu_k.tolist()
    tensors = {
        name: tensor_record(outputs[name], bounds_k if name in ("dk", "dv") else bounds_q)
        for name in case.outputs
        if name != SINKS_OUTPUT
    }
    if SINKS_OUTPUT in case.outputs:
        tensors[SINKS_OUTPUT] = sinks_record(outputs[SINKS_OUTPUT])
    return CaseResult(case, inputs, outputs, inputs.sha256(), tensors, time.perf_counter() - start)


# ----------------------------------------------------------------------------- accuracy


def _reference(case: Case, inputs: CaseInputs, compute_dtype: torch.dtype, lse: torch.Tensor):
    """The reference of ``case`` in ``compute_dtype``, with the lse gradient zeroed on the rows
    where the kernels' ``lse`` is -inf (as their backward got it)."""
    dlse = zero_where_no_key(inputs.dlse, lse)
    return run_reference(
        Pack(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, inputs.do, dlse),
        causal=case.causal,
        compute_dtype=compute_dtype,
        sinks=inputs.sinks,
        **case.features(),
    )


@dataclass(frozen=True)
class Accuracy:
    """Error of one output against float64, beside the error of eager input-dtype math."""

    tensor: str
    error: float  # relative Frobenius (lse: max abs) vs the float64 reference
    eager: float  # the same for eager attention computed in the input dtype
    accurate: bool  # error <= 2 * eager + margin (the test suite's acceptance rule)

    def describe(self) -> str:
        kind = "max abs" if self.tensor == "lse" else "rel"
        verdict = "drifted but accurate" if self.accurate else "WRONG"
        return (
            f"{self.tensor}: {kind} error {self.error:.3g} vs float64 "
            f"(eager {self.eager:.3g}): {verdict}"
        )


def accuracy(result: CaseResult, tensors: list[str] | None = None) -> list[Accuracy]:
    """Errors of ``result``'s outputs (default: all) against the float64 reference."""
    names = tensors or list(result.case.outputs)
    lse = result.outputs["lse"]
    ref = _reference(result.case, result.inputs, torch.float64, lse)
    eager = _reference(result.case, result.inputs, result.case.torch_dtype, lse)
    report = []
    for name in names:
        got = result.outputs[name]
        err, base, bound = measure(name, got, ref[name], eager[name])
        ok = not torch.isnan(got).any().item() and err <= bound
        report.append(Accuracy(name, err, base, ok))
    return report
