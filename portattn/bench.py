"""``python -m portattn bench``: portattn's kernels against SDPA and FlexAttention, one run.

Workloads are packed varlen batches in bfloat16: an equal-length pack (so dense SDPA is a natural
peer) and a skewed pack. Useful FLOPs follow the flash-attention convention: forward
``4 * Sq * Sk * D`` per head and sequence (halved for causal), forward+backward 3.5x that.
Medians of ``triton.testing.do_bench``; implementations alternate within a workload.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Workload:
    name: str
    lengths: tuple[int, ...]
    n_heads_q: int
    n_heads_k: int
    head_dim: int
    causal: bool

    def flops(self, mode: str) -> float:
        per = sum(4.0 * n * n * self.head_dim * self.n_heads_q for n in self.lengths)
        per = per / 2 if self.causal else per
        return per * (3.5 if mode == "fwd+bwd" else 1.0)


def skewed_lengths(total: int, seed: int = 0) -> tuple[int, ...]:
    """Lengths between 64 and 4096 summing to ``total`` (fixed seed: same pack every run)."""
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < total:
        out.append(min(rng.choice([64, 128, 300, 512, 1000, 2048, 3000, 4096]), total - sum(out)))
    return tuple(out)


def default_workloads() -> list[Workload]:
    out = []
    for causal in (False, True):
        out.append(
            Workload(
                f"equal 2x8192 h16 d128 {'causal' if causal else 'full'}",
                (8192, 8192),
                16,
                16,
                128,
                causal,
            )
        )
        out.append(
            Workload(
                f"skewed 32k h16 d128 {'causal' if causal else 'full'}",
                skewed_lengths(32768),
                16,
                16,
                128,
                causal,
            )
        )
    return out


def _inputs(w: Workload, device: str = "cuda"):
    total = sum(w.lengths)
    gen = torch.Generator(device=device).manual_seed(0)

    def mk(n_heads: int) -> torch.Tensor:
        return torch.randn(
            total, n_heads, w.head_dim, device=device, generator=gen, dtype=torch.bfloat16
        )

    q, k, v = mk(w.n_heads_q), mk(w.n_heads_k), mk(w.n_heads_k)
    cu = torch.tensor(
        [0, *torch.tensor(w.lengths).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    return q, k, v, cu


def _implementations(w: Workload, q, k, v, cu):
    import portattn

    impls = {}
    for kernel in ("varlen", "fixed_order"):
        impls[f"portattn {kernel}"] = lambda kernel=kernel, **t: portattn.varlen_attention(
            t["q"],
            t["k"],
            t["v"],
            cu,
            cu,
            max(w.lengths),
            max(w.lengths),
            causal=w.causal,
            kernel=kernel,
        )
    equal = len(set(w.lengths)) == 1
    if equal:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        b, s = len(w.lengths), w.lengths[0]

        def dense(x):  # [total, H, D] -> [B, H, S, D]
            return x.view(b, s, x.shape[1], x.shape[2]).transpose(1, 2)

        for name, backend in (
            ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
            ("SDPA flash", SDPBackend.FLASH_ATTENTION),
        ):

            def run(backend=backend, **t):
                with sdpa_kernel(backend):
                    return sdpa(dense(t["q"]), dense(t["k"]), dense(t["v"]), is_causal=w.causal)

            impls[name] = run
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(
            torch.arange(len(w.lengths), device=q.device), torch.tensor(w.lengths, device=q.device)
        )
        pos = torch.arange(doc.numel(), device=q.device) - cu[:-1].long()[doc]

        def mask_mod(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return same & (pos[kv_idx] <= pos[q_idx]) if w.causal else same

        total = doc.numel()
        block_mask = create_block_mask(mask_mod, None, None, total, total, device=q.device)
        flex = torch.compile(flex_attention, dynamic=False)
        impls["FlexAttention"] = lambda **t: flex(
            t["q"].transpose(0, 1)[None],
            t["k"].transpose(0, 1)[None],
            t["v"].transpose(0, 1)[None],
            block_mask=block_mask,
        )
    except Exception as exc:  # report, do not hide: the table shows the peer as missing
        print(f"FlexAttention unavailable: {exc!r}")
    return impls


def _time(fn, mode: str, q, k, v) -> tuple[float, float]:
    """Median ms and peak memory (GiB) of one call (forward, or forward + backward)."""
    import triton

    if mode == "fwd":
        t = dict(q=q, k=k, v=v)
        call = lambda: fn(**t)  # noqa: E731
    else:
        t = {n: x.detach().requires_grad_() for n, x in dict(q=q, k=k, v=v).items()}
        out = fn(**t)
        do = torch.randn_like(out)

        def call():
            o = fn(**t)
            torch.autograd.grad(o, (t["q"], t["k"], t["v"]), do)

    call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
    return ms, torch.cuda.max_memory_allocated() / 2**30


def run_bench(workloads: list[Workload] | None = None, modes=("fwd", "fwd+bwd")) -> list[dict]:
    rows = []
    for w in workloads or default_workloads():
        q, k, v, cu = _inputs(w)
        impls = _implementations(w, q, k, v, cu)
        for mode in modes:
            names = list(impls)
            for rep in range(2):  # alternate order between the two passes
                for name in names if rep == 0 else names[::-1]:
                    ms, mem = _time(impls[name], mode, q, k, v)
                    rows.append(
                        dict(
                            workload=w.name,
                            mode=mode,
                            impl=name,
                            pass_=rep,
                            ms=ms,
                            tflops=w.flops(mode) / ms / 1e9,
                            peak_gib=mem,
                        )
                    )
                    print(
                        f"{w.name:34s} {mode:8s} {name:22s} {ms:8.3f} ms "
                        f"{rows[-1]['tflops']:7.1f} TF/s",
                        flush=True,
                    )
    return rows


def summarize(rows: list[dict]) -> str:
    """Markdown table: best of the two passes per (workload, mode, impl), ratios to varlen."""
    best: dict[tuple[str, str, str], dict] = {}
    for r in rows:
        key = (r["workload"], r["mode"], r["impl"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    lines = [
        "| workload | mode | impl | ms | TFLOP/s | varlen speedup vs impl |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for (wname, mode, impl), r in best.items():
        base = best.get((wname, mode, "portattn varlen"))
        ratio = r["ms"] / base["ms"] if base else float("nan")
        lines.append(
            f"| {wname} | {mode} | {impl} | {r['ms']:.3f} | {r['tflops']:.1f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main(args) -> int:
    if not torch.cuda.is_available():
        print("bench needs a GPU")
        return 2
    rows = run_bench()
    table = summarize(rows)
    print(table)
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(
                dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows),
                f,
                indent=1,
                sort_keys=True,
            )
    return 0
