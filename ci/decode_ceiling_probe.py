"""How fast could a decode program read its keys? The Triton decode kernel against the Gluon
forward on the same K/V bytes (issue 37's short rows; perf-notes rows 112, 114, 120).

A decode program's per-key-tile time, not DRAM, limits B = 1 and 8 (row 112: ~2.3 us a
128-key tile at B1). The Gluon forward (``kernels/forward_ws.py``: TMA producer, Q K^T of the
next tile issued under this tile's softmax) does a whole 128-row tile per key tile. If it
reads the same keys faster than the decode with fewer rows, a Gluon decode built on it is the
lever; if not, the tile's own work is.

Rows (graph replay, bf16, K/V of ``bench_decode``'s B1 / B8 lengths, d128, non-causal, K/V
bytes read per second; all read the same K/V, 8 kv heads):

* ``decode gqa32/8 Sq1``: the shipped decode (4 real rows of its 64);
* ``decode h16/8 Sq32``: the same decode kernel with 64 real rows (a group of 2 heads, 32
  positions);
* ``forward h16/8 Sq64``: the forward (the sm90 entry's Gluon kernel), 2 programs a kv head
  (their K/V reads side by side, the second from L2), each a 128-row tile of 64 real rows: its
  second consumer group skips the keys, so this is one 64-row warp group's per-tile time;
* ``forward h8 Sq128``: the forward, one tile of 128 real rows a kv head (both groups);
* ``FA4 det`` on the first and last of these shapes, where FA4 is importable.

Usage (GPU): python ci/decode_ceiling_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as `python ci/decode_ceiling_probe.py`: the checkout's root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import portattn
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw

HKV, D = 8, 128
SHAPES = (("decode gqa32/8 Sq1", 32, 1), ("decode h16/8 Sq32", 16, 32),
          ("forward h16/8 Sq64", 16, 64), ("forward h8 Sq128", 8, 128))  # fmt: skip


def fa4_call():
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as err:  # noqa: BLE001 - a peer only
        print(f"FA4 not importable: {err}")
        return None
    return flash_attn_varlen_func


def calls(q, k, v, cu_q, cu_k, sq: int, max_k: int, fa4) -> dict:
    """impl -> a zero-argument call on these tensors (non-causal)."""
    out = {
        "portattn varlen": lambda: portattn.varlen_attention(
            q, k, v, cu_q, cu_k, sq, max_k, causal=False
        )
    }
    if fa4 is not None:
        out["FA4 det"] = lambda: fa4(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=max_k,
            causal=False, deterministic=True,
        )[0]  # fmt: skip
    return out


def main() -> int:
    fa4 = fa4_call()
    print("| batch | shape | impl | graph TB/s | us per key tile a program |")
    print("| --- | --- | --- | ---: | ---: |")
    for batch in (1, 8):
        lens = dw.kv_lengths(batch)
        gen = torch.Generator(device="cuda").manual_seed(0)
        kv = [torch.randn(sum(lens), HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
              for _ in range(2)]  # fmt: skip
        cu_k = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda").int()
        kv_bytes = 2 * kv[0].numel() * kv[0].element_size()
        tiles = sum((n + 127) // 128 for n in lens) / batch  # key tiles per program, mean
        for name, hq, sq in SHAPES:
            q = torch.randn(batch * sq, hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            cu_q = torch.arange(0, batch * sq + 1, sq, device="cuda", dtype=torch.int32)
            peer = fa4 if name in (SHAPES[0][0], SHAPES[-1][0]) else None
            with torch.no_grad():
                for impl, fn in calls(q, *kv, cu_q, cu_k, sq, max(lens), peer).items():
                    replay = bd.graphed(bd.DecodeImpl(fn, lambda o: o)).fn
                    ms = min(bd.gpu_timer(replay)[0] for _ in range(2))
                    print(f"| B{batch} | {name} | {impl} | {kv_bytes / ms / 1e9:.2f} | "
                          f"{ms * 1e3 / tiles:.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
