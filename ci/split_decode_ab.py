"""The split decode on the GPU (design §3.1, issue 37 item 1): the device's table entries patched
to a key chunk ``C`` (``KernelConfig.key_chunk``; ``fwd_ws`` off, as the Gluon forward merges no
chunks yet), against the entries as they ship, and FA4 deterministic (paged) where importable.

1. Bits: for each workload and ``C``, the split decode equals the same entries' unsplit decode
   (``decode.SPLIT_BELOW_PROGRAMS`` 0); one 32k-key sequence's decode row equals its prefill row
   (the Triton forward, the chunks merged in registers), both kernels.
2. Decode: ``flash_attn_with_kvcache`` on paged-64 caches, bf16 GQA 32/8 d128, K/V TB/s of the
   CUDA-graph replay and of the eager call (median ms, L2 flushed).
3. Prefill: the training forward (``varlen_attention`` with grad, forward only timed) of 4 x 4096
   and one 16k sequence, causal, d128: shipped entries, ``fwd_ws`` off, ``C`` set (the Triton
   forward), and the Gluon forward with 64-key tiles with and without ``C``.

Usage (GPU): python ci/split_decode_ab.py [--chunks 2048[,1024]] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if not __package__:  # run as `python ci/split_decode_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw
from benchmarks.timing import cuda_graph, gpu_timer
from portattn import configs
from portattn.families import config_family
from portattn.kernels import decode, plan

WORKLOADS = {
    "B1 32k": (32768,),
    "B8 32k": (32768,) * 8,
    "B1": dw.kv_lengths(1),
    "B8": dw.kv_lengths(8),
    "B64": dw.kv_lengths(64),
}


def patch_entries(
    chunk: int | None, ws: bool = False, block_n: int | None = None, decode_stages: int = 0
) -> None:
    """The device family's entries with ``key_chunk`` = ``chunk`` and fwd_ws off (``ws``: as
    shipped; ``block_n``: the forward's key tile, with two pipeline stages where it changes;
    ``decode_stages``: the decode's pipeline stages, the split's launch options of perf-notes
    row 94, where not 0), or as they ship (None); every planned problem forgotten."""
    table = configs.config_table()
    family = config_family(torch.device("cuda"))
    if not hasattr(patch_entries, "shipped"):
        patch_entries.shipped = {key: cfg for key, cfg in table.items() if key[0] == family}
    for key, cfg in patch_entries.shipped.items():
        if chunk is None:
            table[key] = cfg
            continue
        fwd = cfg.fwd
        if block_n is not None and block_n != fwd.block_n:
            fwd = dataclasses.replace(fwd, block_n=block_n, num_stages=2)
        new = dataclasses.replace(cfg, fwd=fwd, fwd_ws=cfg.fwd_ws and ws, key_chunk=chunk)
        if decode_stages:
            tiles = dataclasses.replace(new.decode_tiles(), num_stages=decode_stages)
            new = dataclasses.replace(new, decode=tiles)
        table[key] = new
    plan.forget_problems()


def decode_call(inp: dw.DecodeInputs, kernel: str):
    return lambda: portattn.flash_attn_with_kvcache(
        inp.q, inp.k_pages, inp.v_pages, cache_seqlens=inp.seqlens, block_table=inp.block_table,
        causal=True, return_softmax_lse=True, kernel=kernel,
    )  # fmt: skip


def fa4_call(w: dw.DecodeWorkload, inp: dw.DecodeInputs):
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4
    except ImportError:
        return None
    kw = dict(max_seqlen_q=1, max_seqlen_k=max(w.kv_lens), causal=True, deterministic=True,
              page_table=inp.block_table, seqused_k=inp.seqlens)  # fmt: skip
    return lambda: fa4(inp.q, inp.k_pages, inp.v_pages, **kw)


def tbps(w: dw.DecodeWorkload, fn) -> tuple[float, float]:
    """(graph replay, eager) K/V TB/s of ``fn``."""
    graph, _ = cuda_graph(fn, warmup=2)
    ms_graph = bd.gpu_timer(graph.replay)[0]
    ms_eager = bd.gpu_timer(fn)[0]
    return w.kv_bytes() / ms_graph / 1e9, w.kv_bytes() / ms_eager / 1e9


def decode_rows(chunks: list[int], names: list[str]) -> list[str]:
    lines = ["| decode (paged 64, bf16 gqa32/8 d128) | variant | graph TB/s | eager TB/s | bits |",
             "| --- | --- | ---: | ---: | --- |"]  # fmt: skip
    for name in names:
        w = dw.DecodeWorkload(name, WORKLOADS[name], 1, 32, 8, 128)
        inp = dw.make_inputs(w)
        variants: list[tuple[str, int | None, int, int]] = [("shipped", None, 0, 0)]
        for c in chunks:  # split, and the same entries unsplit (the chunks in registers);
            # the split at one stage: spill-free at d128 (row 94), what an entry would ship
            variants += [(f"C{c} split", c, 1 << 30, 0), (f"C{c} unsplit", c, 0, 0),
                         (f"C{c} split 1 stage", c, 1 << 30, 1)]  # fmt: skip
        results, outputs = {}, {}
        for label, chunk, below, stages in variants:
            patch_entries(chunk, decode_stages=stages)
            decode.SPLIT_BELOW_PROGRAMS = below
            fn = decode_call(inp, "varlen")
            with torch.no_grad():
                outputs[label] = fn()
                results[label] = tbps(w, fn)
        for c in chunks:  # the split's bits are the unsplit decode's
            split, whole = outputs[f"C{c} split"], outputs[f"C{c} unsplit"]
            same = all(torch.equal(a, b) for a, b in zip(split, whole, strict=True))
            results[f"C{c} split"] += ("= unsplit" if same else "DIFFER",)
            one = outputs[f"C{c} split 1 stage"]
            same = all(torch.equal(a, b) for a, b in zip(one, whole, strict=True))
            results[f"C{c} split 1 stage"] += ("= unsplit" if same else "DIFFER",)
        fa4 = fa4_call(w, inp)
        if fa4 is not None:
            patch_entries(None)
            results["FA4 det paged"] = tbps(w, fa4)
        for label, (g, e, *bits) in results.items():
            lines.append(f"| {name} | {label} | {g:.2f} | {e:.2f} | {bits[0] if bits else '-'} |")
        print("\n".join(lines[-len(results) :]), flush=True)
    return lines


def prefill_equals_decode(chunk: int, kernel: str, ws: bool = False) -> str:
    """One 32k-key sequence: its last prefill row against its paged decode row, at ``chunk``
    (``ws``: each entry's forward as it ships, the Gluon one parking its accumulator; else the
    Triton forward, its chunks in registers)."""
    patch_entries(chunk, ws)
    decode.SPLIT_BELOW_PROGRAMS = 1 << 30
    n, gen = 32768, torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(n, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        full, lse = portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True, kernel=kernel,
                                              return_lse=True)  # fmt: skip
        table = torch.arange(n // 64, dtype=torch.int32, device="cuda")[None]
        k_pages, v_pages = k.view(-1, 64, 8, 128), v.view(-1, 64, 8, 128)
        out, lse_d = portattn.flash_attn_with_kvcache(
            q[-1:][None], k_pages, v_pages, cache_seqlens=torch.tensor([n], dtype=torch.int32,
            device="cuda"), block_table=table, causal=True, return_softmax_lse=True, kernel=kernel,
        )  # fmt: skip
    same = torch.equal(out[0, 0], full[-1]) and torch.equal(lse_d[0, :, 0], lse[-1])
    bits = "equal" if same else "DIFFER"
    return f"| 32k prefill row == decode row | C{chunk} {kernel} | {bits} |"


TRAINING_PACKS = (("4x4096", [4096] * 4), ("1x16384", [16384]))


def training_pack(lens: list[int], dim: int = 128) -> tuple[torch.Tensor, ...]:
    """q, k, v (bf16 h16, head dim ``dim``, requiring grad) and cu_seqlens of a pack of
    ``lens``."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(sum(lens), 16, dim, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for _ in range(3))  # fmt: skip
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")  # fmt: skip
    return q, k, v, cu


def prefill_rows(chunks: list[int]) -> list[str]:
    lines = ["| training forward (causal, bf16 h16 d128) | variant | ms | TF/s |",
             "| --- | --- | ---: | ---: |"]  # fmt: skip
    for name, lens in TRAINING_PACKS:
        q, k, v, cu = training_pack(lens)
        flops = sum(4 * n * n * 16 * 128 / 2 for n in lens)
        variants = [("shipped", None, False, None), ("fwd_ws off", 0, False, None)]
        variants += [(f"C{c}", c, False, None) for c in chunks]
        # the Gluon forward with the chunks in registers: spill-free at d128 with 64-key tiles
        variants += [(f"C{c} ws n64", c, True, 64) for c in chunks]
        variants += [("ws n64", 0, True, 64)]
        for label, chunk, ws, block_n in variants * 2:  # alternating passes; the best kept
            patch_entries(chunk, ws, block_n)

            def step(q=q, k=k, v=v, cu=cu, n=max(lens)):
                return portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True)

            ms = gpu_timer(step)[0]
            best = prefill_rows.best.get((name, label))
            prefill_rows.best[(name, label)] = ms if best is None else min(best, ms)
        for label, *_ in variants:
            ms = prefill_rows.best[(name, label)]
            lines.append(f"| {name} | {label} | {ms:.3f} | {flops / ms / 1e9:.0f} |")
        print("\n".join(lines[-len(variants) :]), flush=True)
    return lines


prefill_rows.best = {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="2048", help="comma-separated, e.g. 2048,1024")
    parser.add_argument("--quick", action="store_true", help="B1 32k and B8 only")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    names = ["B1 32k", "B8"] if args.quick else list(WORKLOADS)
    lines = [prefill_equals_decode(chunks[0], kernel) for kernel in ("varlen", "fixed_order")]
    print("\n".join(lines), flush=True)
    lines += decode_rows(chunks, names)
    lines += prefill_rows(chunks)
    patch_entries(None)
    print("\n## summary\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
