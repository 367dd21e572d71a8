"""``python benchmarks/bench.py --decode``: batched decode and append against a KV cache, bf16.

Workloads (``benchmarks/decode_workloads.py``): B sequences with ``q_len`` new query rows each (1:
decode; 4, 16: append), whose keys are already in the cache (``cache_seqlens`` counts them),
attending causally (bottom-right aligned, as flash-attn) to the sequence's ``kv_len`` keys.
KV lengths uniform in 512...8192 from a seeded ``torch.Generator`` (the same B, the same lengths
in every run and workload), plus B = 8 and B = 1 of 32768 keys each. GQA 32/8 d128 at B = 1, 8,
64, 256 and every q_len; GQA 8/1 d128 and 32/8 d64 at B = 64, 256.

Implementations, each built and first called through ``attempt`` (a missing peer or an
unsupported shape is a reported reason, never a crash):

- portattn "varlen" and "fixed_order": ``portattn.flash_attn_with_kvcache(q, k_cache, v_cache,
  cache_seqlens=, block_table=, causal=True, kernel=)`` (flash-attn 2's signature), on a paged
  cache (pages of 64 keys in a seeded random order) and a dense one.
- FlashAttention-4 (``flash_attn.cute`` 4.0.0b36 from ``../shared/tools/fa4/build.sh``; on the
  GPU ``source .fa4/install.sh``). It has no kvcache function; ``flash_attn_varlen_func`` takes
  the cache. Packed: q [B*Sq, Hq, D], k/v [total_k, Hkv, D], ``cu_seqlens_q``/``_k``,
  ``max_seqlen_q``/``_k``. Paged: q [B, Sq, Hq, D], k/v [num_pages, page_size, Hkv, D],
  ``page_table`` int32 [B, pages], ``seqused_k`` int32 [B] (no ``cu_seqlens_k``). ``causal=True``
  with ``deterministic=True`` ("FA4 det", the ratio's reference) or False ("FA4 default"): the
  forward only stores the flag for the backward, and split-KV asserts on SM 9.0, so on an H200
  both rows run the same kernel.
- ``torch.nn.attention.varlen.varlen_attn``: packed, and paged (``block_table``, ``seqused_k``);
  causal is ``window_size=(-1, 0)``, GQA needs ``enable_gqa`` (torch >= 2.12; else a reason).
- FlexAttention, batched over the dense cache with a length mask (its decoding kernel), compiled
  per shape, timed on the B >= 64 GQA 32/8 d128 workloads.

Before timing, each output on a few sequences is compared with a float32 reference
(``max_err``): a kernel attending to the wrong keys shows there, not as a fast time.

Metric: K/V bytes read, ``sum(kv_len) * Hkv * D * 2 (K and V) * 2 (bf16)``, per second (TB/s),
and its ratio to the copy bandwidth measured in the same run, (read + write bytes) / time of
``dst.copy_(src)`` on 1 GiB of bf16 ("copy BW (read+write)"). vs FA4 det: FA4 det's time / this
time. Timing as :mod:`benchmarks.bench`: ``do_bench`` medians with L2 flushed per repeat
(a B = 1 cache fits in the 50 MiB L2), a GPU warm-up, first calls untimed, two passes in alternating
order, the better kept; random inputs, never zeros. B = 1 and 8 are launch-bound. The
implementations of ``GRAPHED`` are timed twice: called eagerly, and as the replay of a CUDA graph
of one call (rows "... graph"), as rollout engines run a decode step; the difference is the
eager call's host time the GPU waits for.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import bench, timing
from benchmarks import bench_report as report
from benchmarks.bench import docs_stem, metadata
from benchmarks.decode_workloads import (
    PAGE_SIZE,
    DecodeInputs,
    DecodeWorkload,
    check_seqs,
    default_workloads,
    make_inputs,
    reference_rows,
    select_workloads,
)
from benchmarks.timing import attempt, cuda_graph

COPY_GIB = 1.0
WARMUP_MS, REP_MS = 25, 150  # do_bench budgets per call (bench.py: 50, 300)
WARMUP_S = 1.0
DOCS_STEM = "docs/bench-decode"  # --docs: docs/bench-decode-<card>.{json,md}
SKIPPED = "skipped: "

PA_VARLEN_PAGED, PA_VARLEN_DENSE = "portattn varlen paged", "portattn varlen dense"
PA_FIXED_PAGED, PA_FIXED_DENSE = "portattn fixed_order paged", "portattn fixed_order dense"
FA4_DET, FA4_DEFAULT, FA4_PAGED = "FA4 det", "FA4 default", "FA4 det paged"
TORCH_VARLEN, TORCH_PAGED = "torch varlen_attn", "torch varlen_attn paged"
FLEX = "FlexAttention"
IMPLS = (PA_VARLEN_PAGED, PA_VARLEN_DENSE, PA_FIXED_PAGED, PA_FIXED_DENSE, FA4_DET, FA4_DEFAULT)
IMPLS += (FA4_PAGED, TORCH_VARLEN, TORCH_PAGED, FLEX)
# Also timed as the replay of a CUDA graph of one call, as rollout engines run a decode step.
GRAPHED = (PA_VARLEN_PAGED, PA_FIXED_PAGED, FA4_DET, FA4_PAGED)
GRAPH = " graph"
IMPLS += tuple(name + GRAPH for name in GRAPHED)
SHORT_COLUMNS = (PA_VARLEN_PAGED, PA_FIXED_PAGED, PA_VARLEN_DENSE, FA4_DET, FA4_PAGED)
SHORT_COLUMNS += (TORCH_VARLEN, FLEX)  # the columns of the short table, where they ran
SHORT_COLUMNS += (PA_VARLEN_PAGED + GRAPH, FA4_DET + GRAPH, FA4_PAGED + GRAPH)


# --- implementations --------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeImpl:
    """``fn()`` is one call on the workload's resident inputs; ``rows`` maps its output to the
    packed rows [B * Sq, Hq, D]."""

    fn: Callable[[], Any]
    rows: Callable[[Any], torch.Tensor]


def _need_cuda(inp: DecodeInputs, what: str) -> None:
    if not inp.q.is_cuda:
        raise RuntimeError(f"{what} needs CUDA tensors (inputs are on {inp.q.device})")


def portattn_impl(w: DecodeWorkload, inp: DecodeInputs, kernel: str, paged: bool) -> DecodeImpl:
    import portattn

    fn = getattr(portattn, "flash_attn_with_kvcache", None)
    if fn is None:
        raise NotImplementedError("portattn.flash_attn_with_kvcache is not in this checkout")
    k, v = (inp.k_pages, inp.v_pages) if paged else (inp.k_dense, inp.v_dense)
    table = inp.block_table if paged else None

    kw = dict(cache_seqlens=inp.seqlens, block_table=table, causal=True, kernel=kernel)
    call = lambda: fn(inp.q, k, v, **kw)  # noqa: E731
    return DecodeImpl(call, lambda o: o.reshape(-1, w.n_heads_q, w.head_dim))


def fa4_impl(w: DecodeWorkload, inp: DecodeInputs, deterministic: bool, paged: bool) -> DecodeImpl:
    from flash_attn.cute import flash_attn_varlen_func as fa4

    _need_cuda(inp, "FlashAttention-4")
    kw: dict[str, Any] = dict(max_seqlen_q=w.q_len, max_seqlen_k=max(w.kv_lens), causal=True)
    kw.update(deterministic=deterministic)
    if paged:  # q [B, Sq, Hq, D]; k/v [num_pages, page_size, Hkv, D]
        args = (inp.q, inp.k_pages, inp.v_pages)
        kw.update(page_table=inp.block_table, seqused_k=inp.seqlens)
    else:  # q [B*Sq, Hq, D]; k/v [total_k, Hkv, D]
        args = (inp.q.view(-1, w.n_heads_q, w.head_dim), inp.k, inp.v)
        kw.update(cu_seqlens_q=inp.cu_q, cu_seqlens_k=inp.cu_k)

    def rows(out):  # it returns (out, lse)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(-1, w.n_heads_q, w.head_dim)

    return DecodeImpl(lambda: fa4(*args, **kw), rows)


def _torch_varlen(w: DecodeWorkload, inp: DecodeInputs, paged: bool) -> DecodeImpl:
    from torch.nn.attention.varlen import varlen_attn

    _need_cuda(inp, "torch varlen_attn (FlashAttention-2)")
    params = inspect.signature(varlen_attn).parameters
    needs = ["enable_gqa"] if w.n_heads_q != w.n_heads_k else []
    needs += ["seqused_k", "block_table"] if paged else []
    missing = ", ".join(n for n in needs if n not in params)
    if missing:
        raise NotImplementedError(
            f"unsupported: torch {torch.__version__}'s varlen_attn: no {missing}"
        )
    q = inp.q.view(-1, w.n_heads_q, w.head_dim)
    kw: dict[str, Any] = dict(window_size=(-1, 0), enable_gqa=w.n_heads_q != w.n_heads_k)
    k, v = (inp.k_pages, inp.v_pages) if paged else (inp.k, inp.v)
    if paged:
        kw.update(seqused_k=inp.seqlens, block_table=inp.block_table)
    args = (q, k, v, inp.cu_q, inp.cu_k, w.q_len, max(w.kv_lens))
    return DecodeImpl(lambda: varlen_attn(*args, **kw), lambda o: o)


def _flex(w: DecodeWorkload, inp: DecodeInputs) -> DecodeImpl:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _need_cuda(inp, "FlexAttention (compiled)")
    torch._dynamo.reset()
    # Batched over the dense cache, a length mask: blocks past a sequence's keys are skipped, and
    # a query length under 128 takes Flex's decoding kernel (which the packed layout with a
    # document mask cannot: torch 2.11's Inductor finds no kernel choice for it).
    lens, sq, s_cache = inp.seqlens.long(), w.q_len, inp.k_dense.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= lens[b] - sq + q_idx

    block_mask = create_block_mask(mask_mod, w.batch, None, sq, s_cache, device=inp.q.device)
    flex = torch.compile(flex_attention, dynamic=False)
    q, k, v = (x.transpose(1, 2) for x in (inp.q, inp.k_dense, inp.v_dense))  # [B, H, S, D]

    def call():
        return flex(q, k, v, block_mask=block_mask, enable_gqa=w.n_heads_q != w.n_heads_k)

    return DecodeImpl(call, lambda o: o.transpose(1, 2).reshape(-1, w.n_heads_q, w.head_dim))


def graphed(impl: DecodeImpl) -> DecodeImpl:
    """``impl`` captured in a CUDA graph after two eager calls on a side stream (as
    ``torch.cuda.graphs`` recommends); ``fn`` replays it and returns the graph's output."""
    graph, out = cuda_graph(impl.fn, warmup=2)

    def replay():
        graph.replay()
        return out

    return DecodeImpl(replay, impl.rows)


def build_impls(w: DecodeWorkload, inp: DecodeInputs) -> dict[str, DecodeImpl | str]:
    """Every implementation, in ``IMPLS`` order, then the graph replays of ``GRAPHED``; one
    that cannot be built (or is not timed on this workload) maps to the reason."""
    makers: dict[str, Callable[[], DecodeImpl]] = {
        PA_VARLEN_PAGED: lambda: portattn_impl(w, inp, "varlen", True),
        PA_VARLEN_DENSE: lambda: portattn_impl(w, inp, "varlen", False),
        PA_FIXED_PAGED: lambda: portattn_impl(w, inp, "fixed_order", True),
        PA_FIXED_DENSE: lambda: portattn_impl(w, inp, "fixed_order", False),
        FA4_DET: lambda: fa4_impl(w, inp, True, False),
        FA4_DEFAULT: lambda: fa4_impl(w, inp, False, False),
        FA4_PAGED: lambda: fa4_impl(w, inp, True, True),
        TORCH_VARLEN: lambda: _torch_varlen(w, inp, False),
        TORCH_PAGED: lambda: _torch_varlen(w, inp, True),
        FLEX: lambda: _flex(w, inp),
    }
    out: dict[str, DecodeImpl | str] = {}
    for name, make in makers.items():
        if name == FLEX and not w.flex:
            out[name] = SKIPPED + "compiles per shape: timed on B>=64 gqa32/8 d128 only"
            continue
        impl, error = attempt(make)
        out[name] = impl if error is None else error
    for name in GRAPHED:
        impl = out[name]
        if isinstance(impl, str):
            out[name + GRAPH] = impl
        elif not inp.q.is_cuda:
            out[name + GRAPH] = SKIPPED + "CUDA graphs need CUDA tensors"
        else:
            graph_impl, error = attempt(graphed, impl)
            out[name + GRAPH] = graph_impl if error is None else error
    return out


# --- running ----------------------------------------------------------------------------------

Timer = Callable[[Callable[[], object]], tuple[float, float | None, float | None]]


def gpu_timer(step: Callable[[], object]) -> tuple[float, float | None, float | None]:
    """:func:`benchmarks.timing.gpu_timer` with shorter budgets (``WARMUP_MS``, ``REP_MS``:
    calls here take 0.01-2 ms, so 150 ms is 75+ repeats): median ms, peak and resident GiB."""
    return timing.gpu_timer(step, warmup_ms=WARMUP_MS, rep_ms=REP_MS)


def _row(w: DecodeWorkload, impl: str, pass_: int | None, **fields: Any) -> dict[str, Any]:
    row = {"workload": w.name, "impl": impl, "pass": pass_, "ms": None, "tbps": None}
    row.update(peak_gib=None, max_err=None, first_call_s=None, error=None)
    row.update(fields)
    return row


def _first_call(impl: DecodeImpl, ref: torch.Tensor, seqs: list[int], q_len: int):
    """Seconds of the first call (compiles included) and its max |error| on ``seqs``."""
    t0 = time.perf_counter()
    out = impl.fn()
    if ref.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    rows = impl.rows(out)
    picked = torch.cat([rows[b * q_len : (b + 1) * q_len] for b in seqs]).float()
    return seconds, float((picked - ref).abs().max())


def run_workload(
    w: DecodeWorkload,
    impls: dict[str, DecodeImpl | str],
    inp: DecodeInputs,
    timer: Timer = gpu_timer,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """First calls (checked against the reference), then two passes in alternating order."""
    rows: list[dict[str, Any]] = []
    seqs = check_seqs(w.batch)
    ref = reference_rows(w, inp, seqs)
    first: dict[str, tuple[float, float]] = {}

    def failed(name: str, error: str, pass_: int | None = None, **fields: Any) -> None:
        rows.append(_row(w, name, pass_, error=error, **fields))
        if not error.startswith(SKIPPED):
            log(f"{w.name:28s} {name:28s} FAILED: {error[:300]}")

    for name, impl in impls.items():
        if isinstance(impl, str):
            result, error = None, impl
        else:
            result, error = attempt(_first_call, impl, ref, seqs, w.q_len)
        if error is not None:
            failed(name, error)
        else:
            first[name] = result
    names = list(first)
    for pass_ in (0, 1):
        for name in names if pass_ == 0 else names[::-1]:
            seconds, err = first[name]
            result, error = attempt(timer, impls[name].fn)
            if error is not None:
                failed(name, error, pass_, max_err=err)
                continue
            ms, peak, _ = result
            tbps = w.kv_bytes() / ms / 1e9
            fields = dict(ms=ms, tbps=tbps, peak_gib=peak, max_err=err, first_call_s=seconds)
            rows.append(_row(w, name, pass_, **fields))
            log(f"{w.name:28s} {name:28s} {ms:8.4f} ms {tbps:6.2f} TB/s err {err:.1e}")
    return rows


def copy_bandwidth(timer: Timer = gpu_timer, gib: float = COPY_GIB, warmup_s: float = 0.0):
    """(read + write bytes) / time of ``dst.copy_(src)``, bf16, ``gib`` GiB each, in TB/s, after
    ``warmup_s`` seconds of copies (the GPU warm-up)."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
    ms = timer(lambda: dst.copy_(src))[0]
    return 2 * n * 2 / ms / 1e9  # the buffers are freed on return


def run_decode(workloads: list[DecodeWorkload] | None = None, log=print) -> dict[str, Any]:
    """The decode benchmark on the current CUDA device; returns the data the reports take."""
    workloads = default_workloads() if workloads is None else workloads
    data = metadata()
    data.update(benchmark="decode", page_size=PAGE_SIZE, copy_gib=COPY_GIB, rows=[])
    data.update(do_bench=dict(warmup_ms=WARMUP_MS, rep_ms=REP_MS, return_mode="median"))
    data.update(workloads=[w.describe() for w in workloads])
    copy = [copy_bandwidth(warmup_s=WARMUP_S)]
    torch.cuda.empty_cache()
    log(f"copy BW (read+write): {copy[0]:.2f} TB/s")
    for w in workloads:
        inp = make_inputs(w)
        data["rows"] += run_workload(w, build_impls(w, inp), inp, log=log)
        del inp
        torch.cuda.empty_cache()
    copy.append(copy_bandwidth())
    log(f"copy BW (read+write), again: {copy[1]:.2f} TB/s")
    data["copy_bw_rw_tbps_passes"] = copy
    data["copy_bw_rw_tbps"] = max(copy)
    return data


# --- reports ----------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """workload -> impl -> the row of its best (lowest) ms, else its first failed row."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        cell = out.setdefault(row["workload"], {})
        have = cell.get(row["impl"])
        ms = row.get("ms")
        if have is None or (ms is not None and (have.get("ms") is None or ms < have["ms"])):
            cell[row["impl"]] = row
    return out


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec) + suffix


def _order(data: dict[str, Any], table: dict[str, Any]) -> list[str]:
    names = [w["name"] for w in data.get("workloads", [])] + list(table)
    return [n for n in dict.fromkeys(names) if n in table]


def short_table(data: dict[str, Any]) -> str:
    """One line per workload: TB/s of the main implementations."""
    table = summarize(data.get("rows", []))
    ran = {impl for cell in table.values() for impl, r in cell.items() if r.get("ms")}
    cols = [c for c in SHORT_COLUMNS if c in ran]
    out = ["| workload | " + " | ".join(f"{c} TB/s" for c in cols) + " |"]
    out.append("| --- |" + " ---: |" * len(cols))
    for name in _order(data, table):
        cell = table[name]
        vals = [_fmt(cell.get(c, {}).get("tbps"), ".2f") for c in cols]
        out.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def markdown(data: dict[str, Any]) -> str:
    """The report: how it was measured, the short table, the full table, what did not run."""
    table = summarize(data.get("rows", []))
    copy = data.get("copy_bw_rw_tbps")
    meta = [(k, data.get(k)) for k in ("device", "torch", "triton", "git_commit", "date")]
    out = [f"- {k}: {v}" for k, v in meta if v is not None]
    if data.get("command"):
        out.append(f"- command: `{data['command']}`")
    if data.get("git_dirty"):
        out.append("- the working tree had uncommitted changes")
    out.append(f"- copy BW (read+write): {_fmt(copy, '.2f', ' TB/s')}")
    out += [
        "",
        "TB/s: K/V bytes read (Σ kv_len · Hkv · D · 2 tensors · 2 bytes) per second; / copy BW: "
        "over the (read+write) bandwidth of a 1 GiB `copy_`, same run; vs FA4 det: its time / "
        "this time. Best of two `do_bench` medians (L2 flushed, alternating order); max err: "
        f"vs float32 on a few sequences. Pages of {data.get('page_size', PAGE_SIZE)} keys.",
        "",
        short_table(data),
        "",
        "| workload | impl | ms | TB/s | / copy BW | vs FA4 det | max err |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    failed: dict[str, list[str]] = {}
    for name in _order(data, table):
        cell = table[name]
        fa4 = cell.get(FA4_DET, {}).get("ms")
        for impl in report._ordered(cell, IMPLS):
            row = cell[impl]
            if row.get("ms") is None:
                reason = " ".join(str(row.get("error")).split())[:300]
                failed.setdefault(f"{impl}: {reason}", []).append(name)
                continue
            ratio = row["tbps"] / copy if copy else None
            vs = fa4 / row["ms"] if fa4 else None
            cols = [_fmt(row["ms"], ".4f"), _fmt(row["tbps"], ".2f"), _fmt(ratio, ".2f")]
            cols += [_fmt(vs, ".2f", "x"), _fmt(row.get("max_err"), ".1e")]
            out.append(f"| {name} | {impl} | " + " | ".join(cols) + " |")
    if failed:
        out += ["", "Not run (reason, then the workloads):", ""]
        for reason, names in failed.items():
            where = "every workload" if len(names) == len(table) else ", ".join(names)
            out.append(f"- {reason} — {where}")
    return "\n".join(out) + "\n"


# --- command line (``python benchmarks/bench.py --decode``: bench.main dispatches here) ---------


def main(args: argparse.Namespace) -> int:
    """Exit status: 0 done, 2 usage error or no GPU."""
    if getattr(args, "docs", False):
        for attr, ext in (("json", "json"), ("markdown", "md")):
            if getattr(args, attr, None) is None:
                setattr(args, attr, f"{docs_stem(DOCS_STEM)}.{ext}")
    if getattr(args, "png", None):
        print("bench --decode writes no chart; --png is ignored", file=sys.stderr)
    if getattr(args, "action", "run") == "plot":
        if not args.json or not args.markdown or not Path(args.json).is_file():
            print("plot --decode needs --json FILE and --markdown PATH", file=sys.stderr)
            return 2
        Path(args.markdown).write_text(markdown(report.load_json(args.json)), encoding="utf-8")
        print(f"wrote {args.markdown}")
        return 0
    workloads = select_workloads(args.quick, getattr(args, "workloads", None))
    if not workloads:
        names = "\n  ".join(w.name for w in select_workloads(args.quick))
        print(f"no decode workload matches {args.workloads}; they are:\n  {names}", file=sys.stderr)
        return 2
    if args.list:
        for w in workloads:
            lens = f"kv {min(w.kv_lens)}..{max(w.kv_lens)}"
            gb = w.kv_bytes() / 1e9
            print(f"{w.name:28s} B={w.batch:3d} Sq={w.q_len:2d} {lens:14s} K/V {gb:.3f} GB")
        return 0
    if not torch.cuda.is_available():
        msg = f"times kernels on {bench.NEEDS_GPU} and none is here (`--decode --list` needs none)"
        print(f"error: python benchmarks/bench.py --decode {msg}", file=sys.stderr)
        return 2
    data = run_decode(workloads)
    text = markdown(data)
    report.write_reports(data, text, args.json, args.markdown)
    print(short_table(data))
    return 0
