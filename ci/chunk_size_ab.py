"""Which key chunk ``C`` could an sm90 entry ship (design §3.1, issue 37 item 1)? Its cost to the
training forward as it would run (the shipped Gluon forward, its running accumulator parked
between merges: ``forward_ws._chunked_keys``; d64 the Triton forward, chunks in registers)
against what it buys the decode (the split decode).

Session 33 measured C 1024..4096 on 4 x 4096 and 1 x 16384 only (perf-notes row 96: C 4096
costs one 16k-key sequence +7%, a pack of sequences no longer than C nothing: it runs the
unchunked code). Here larger C too, on longer sequences, with the decode it gives:

1. Bits (``split_decode_ab.prefill_equals_decode``): one 32k-key sequence's last prefill row
   (the Gluon forward with C) against its paged decode row (the split), both kernels, each C.
2. Training forward (causal, bf16, h16, forward only, ms; two alternating passes, the better
   kept): no C against each C, packs 4 x 4096, 2 x 8192, 1 x 16384, 1 x 32768 at d128 (varlen,
   fixed_order) and 1 x 16384 at d64 (varlen).
3. Decode (``split_decode_ab.decode_rows``: ``flash_attn_with_kvcache``, paged 64, bf16 GQA
   32/8 d128, K/V TB/s of the CUDA-graph replay and of the eager call): shipped, each C split
   and unsplit (their bits equal), FA4 det paged where installed, at B1 x 32k, B8 x 32k, B1,
   B8, B64. An entry with C would split every decode past C (perf-notes row 115: the
   unsplit chunked decode spills at d128).

Usage (GPU): python ci/chunk_size_ab.py [--chunks 4096,8192,16384] [--quick]
(the decode rows first, then the forward's, then the bits: a run cut short keeps the first)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python ci/chunk_size_ab.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import portattn
from benchmarks.timing import gpu_timer
from ci.split_decode_ab import (
    WORKLOADS,
    decode_rows,
    patch_entries,
    prefill_equals_decode,
    training_pack,
)

PACKS_D128 = (("4x4096", [4096] * 4), ("2x8192", [8192] * 2), ("1x16384", [16384]),
              ("1x32768", [32768]))  # fmt: skip
PACKS_D64 = (("1x16384", [16384]),)


def with_chunk(chunk: int | None) -> None:
    """The device's entries as they ship (``chunk`` None) or with key chunk ``chunk`` and the
    forward each entry ships (``fwd_ws`` kept: the Gluon forward parks its accumulator)."""
    patch_entries(chunk, ws=True)


def forward_rows(chunks: list[int], quick: bool) -> list[str]:
    lines = ["| training forward (causal, bf16 h16) | C | ms | vs no C |",
             "| --- | --- | ---: | ---: |"]  # fmt: skip
    runs = [(128, name, lens, kernel) for name, lens in PACKS_D128
            for kernel in ("varlen", "fixed_order")]  # fmt: skip
    runs += [(64, name, lens, "varlen") for name, lens in PACKS_D64]
    if quick:
        runs = [r for r in runs if r[1] in ("1x16384", "1x32768") and r[3] == "varlen"]
    for dim, name, lens, kernel in runs:
        q, k, v, cu = training_pack(lens, dim)
        best: dict[int, float] = {}
        for chunk in ([0, *chunks]) * 2:  # alternating passes, the better kept
            with_chunk(chunk or None)

            def step(q=q, k=k, v=v, cu=cu, n=max(lens), kernel=kernel):
                return portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True,
                                                 kernel=kernel)  # fmt: skip

            ms = gpu_timer(step)[0]
            best[chunk] = min(best.get(chunk, ms), ms)
        for chunk in [0, *chunks]:
            lines.append(f"| {name} d{dim} {kernel} | {chunk or 'none'} | {best[chunk]:.3f} | "
                         f"{best[chunk] / best[0]:.3f} |")  # fmt: skip
        print("\n".join(lines[-len(chunks) - 1 :]), flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="4096,8192,16384", help="comma-separated sizes")
    parser.add_argument(
        "--quick", action="store_true", help="varlen only: 1x16384, 1x32768, B1 and B8 x 32k"
    )
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    kernels = ("varlen",) if args.quick else ("varlen", "fixed_order")
    names = ["B1 32k", "B8 32k"] if args.quick else list(WORKLOADS)
    lines = decode_rows(chunks, names)
    lines += forward_rows(chunks, args.quick)
    for c in chunks:  # last: each C compiles a 32k prefill of its own
        lines.append(prefill_equals_decode(c, kernels[0], ws=True))
        print(lines[-1], flush=True)
    if not args.quick:
        lines += [prefill_equals_decode(c, "fixed_order", ws=True) for c in chunks]
    with_chunk(None)
    print("\n## summary\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
