"""The implementations a benchmark run times on a workload (:func:`build_impls`): both portattn
kernels through the public API, FlashAttention-4 where it imports, SDPA's cuDNN and flash
backends (equal packs), FlexAttention with a document mask and torch's ``varlen_attn``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.bench_report import CUDNN, FA4, FA4_DET, FIXED, FLASH, FLEX, TORCH_VARLEN, VARLEN
from benchmarks.timing import attempt
from benchmarks.workloads import Workload


@dataclass(frozen=True)
class Impl:
    """An attention implementation on packed [T, H, D] inputs. ``fn(q, k, v)`` returns the
    output in the implementation's own layout; ``view`` maps a packed tensor to that layout
    (without copying), so the output gradient can be made once, packed, for every peer."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    view: Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _portattn(w: Workload, cu: torch.Tensor, kernel: str) -> Impl:
    import portattn

    longest = max(w.lengths)

    # The public API as users call it, eager checks included (they read cu_seqlens on the host
    # each call: a few microseconds against calls of milliseconds).
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return portattn.varlen_attention(
            q, k, v, cu, cu, longest, longest, causal=w.causal, kernel=kernel
        )

    return Impl(fn, _identity)


def _sdpa(w: Workload, backend_name: str) -> Impl:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = getattr(SDPBackend, backend_name)
    b, s = len(w.lengths), w.lengths[0]
    # GQA through enable_gqa=True, not by repeating kv heads: SDPA then reads the same 8 kv
    # heads as portattn and FlexAttention do; a backend that refuses it is recorded as failed.
    gqa = w.n_heads_q != w.n_heads_k

    def dense(x: torch.Tensor) -> torch.Tensor:  # [B*S, H, D] -> [B, H, S, D], a view
        return x.view(b, s, x.shape[1], x.shape[2]).transpose(1, 2)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):  # this backend only: an unsupported shape raises
            return sdpa(dense(q), dense(k), dense(v), is_causal=w.causal, enable_gqa=gqa)

    return Impl(fn, dense)


def _flex(w: Workload, cu: torch.Tensor) -> Impl:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh Dynamo cache per workload: each workload compiles (and reports) its own kernels,
    # and the per-function recompile limit (8) is never reached across workloads.
    torch._dynamo.reset()
    device = cu.device
    counts = torch.tensor(w.lengths, device=device)
    doc = torch.repeat_interleave(torch.arange(len(w.lengths), device=device), counts)

    if w.causal:  # within one sequence, kv_idx <= q_idx is the causal mask

        def mask_mod(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]

    total = doc.numel()
    # Built once, outside the timings (a training step would reuse it across layers).
    block_mask = create_block_mask(mask_mod, None, None, total, total, device=device)
    flex = torch.compile(flex_attention, dynamic=False)
    gqa = w.n_heads_q != w.n_heads_k

    def packed_to_bhsd(x: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [1, H, T, D], a view
        return x.transpose(0, 1).unsqueeze(0)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qs, ks, vs = packed_to_bhsd(q), packed_to_bhsd(k), packed_to_bhsd(v)
        return flex(qs, ks, vs, block_mask=block_mask, enable_gqa=gqa)

    return Impl(fn, packed_to_bhsd)


def _torch_varlen(w: Workload, cu: torch.Tensor) -> Impl:
    """torch's ``varlen_attn`` (its FlashAttention-2 kernels) on the packed tensors, where the
    installed torch has it with what the workload needs: a causal form (``window_size`` (-1, 0)
    or ``is_causal``) and, for GQA, ``enable_gqa`` (torch 2.11 has none: those rows record why)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    if not cu.is_cuda:
        raise RuntimeError(f"torch varlen_attn needs CUDA tensors (inputs are on {cu.device})")
    kw = torch_varlen_options(w, inspect.signature(varlen_attn).parameters)
    longest = max(w.lengths)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return varlen_attn(q, k, v, cu, cu, longest, longest, **kw)

    return Impl(fn, _identity)


def torch_varlen_options(w: Workload, params: Any) -> dict[str, Any]:
    """The keywords of torch's ``varlen_attn`` for ``w``, given its signature's ``params``;
    NotImplementedError where that torch lacks one the workload needs."""
    kw: dict[str, Any] = {}
    if w.n_heads_q != w.n_heads_k:
        if "enable_gqa" not in params:
            raise NotImplementedError(
                f"unsupported: torch {torch.__version__}'s varlen_attn: no enable_gqa"
            )
        kw["enable_gqa"] = True
    if w.causal and "window_size" in params:
        kw["window_size"] = (-1, 0)  # causal, bottom-right aligned (Sq == Sk here)
    elif w.causal and "is_causal" in params:
        kw["is_causal"] = True
    elif w.causal:
        raise NotImplementedError(f"unsupported: torch {torch.__version__}'s varlen_attn: causal")
    return kw


def fa4_available() -> bool:
    """Whether FlashAttention-4 (``flash_attn.cute``) imports: a peer only where it is
    installed (``source .fa4/install.sh`` on the H200; never a dependency of portattn)."""
    try:
        from flash_attn.cute import flash_attn_varlen_func  # noqa: F401
    except Exception:  # not installed, or no CUDA toolchain for its DSL
        return False
    return True


def _fa4(w: Workload, cu: torch.Tensor, deterministic: bool) -> Impl:
    from flash_attn.cute import flash_attn_varlen_func

    longest = max(w.lengths)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        result = flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=longest,
            max_seqlen_k=longest,
            causal=w.causal,
            deterministic=deterministic,
        )
        return result[0] if isinstance(result, tuple) else result  # (out, lse) in 4.0 betas

    return Impl(fn, _identity)


def build_impls(
    w: Workload, cu: torch.Tensor, only: list[str] | None = None
) -> dict[str, Impl | str]:
    """The implementations that apply to ``w`` (with ``only``: those whose name contains one
    of its substrings, case-insensitive); a setup failure maps to its error message."""
    makers: dict[str, Callable[[], Impl]] = {
        VARLEN: lambda: _portattn(w, cu, "varlen"),
        FIXED: lambda: _portattn(w, cu, "fixed_order"),
    }
    if fa4_available():
        makers[FA4_DET] = lambda: _fa4(w, cu, deterministic=True)
        makers[FA4] = lambda: _fa4(w, cu, deterministic=False)
    if w.equal:
        makers[CUDNN] = lambda: _sdpa(w, "CUDNN_ATTENTION")
        makers[FLASH] = lambda: _sdpa(w, "FLASH_ATTENTION")
    makers[FLEX] = lambda: _flex(w, cu)
    makers[TORCH_VARLEN] = lambda: _torch_varlen(w, cu)
    if only:
        wanted = [o.lower() for o in only]
        makers = {n: m for n, m in makers.items() if any(o in n.lower() for o in wanted)}
    out: dict[str, Impl | str] = {}
    for name, make in makers.items():
        impl, error = attempt(make)
        out[name] = impl if error is None else error
    return out


def fa4_version() -> str | None:
    """FlashAttention-4's installed version (``flash-attn-4``), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None
