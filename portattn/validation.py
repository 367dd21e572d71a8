"""Input checks for the public API. Every bad input raises before any kernel launch, naming the
argument and what was expected; nothing is silently corrected."""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass

import torch

from portattn.configs import (
    KERNELS,
    PAIR_HEAD_DIMS,
    SUPPORTED_HEAD_DIMS,
    VALUE_HEAD_DIM_PAIRS,
    interpreter_active,
)
from portattn.tensor_memo import derived, forget_derived, once_per_version
from portattn.validation_params import check_sink_values, check_softmax_scale, type_name

INT32_MAX = 2**31 - 1
# No kernel of the configuration table has a smaller block (rows or keys) than this (checked by
# tests/test_validation.py): axis 0 of a launch grid holds at most
# ``ceil(max_seqlen / SMALLEST_TILE) * batch`` programs.
SMALLEST_TILE = 16


class DTypeError(TypeError, ValueError):
    """A tensor has the wrong dtype. It is both a TypeError (a wrong type of element) and a
    ValueError (a bad argument value), so callers may catch either."""


class CacheIndexError(ValueError, RuntimeError):
    """An index tensor's value points outside its KV cache: a block table naming a page the
    cache does not have, a sequence with more keys (``cu_seqlens_k`` of a paged call,
    ``cache_seqlens``) than its cache holds. A ValueError (a bad argument value, portattn's
    convention) and a RuntimeError: what flash-attn raises there (from its CUDA checks), so a
    drop-in caller's ``except RuntimeError`` still catches it."""


@dataclass(frozen=True)
class VarlenShape:
    batch: int
    max_seqlen_q: int
    max_seqlen_k: int


def check_bool(name: str, value: object) -> bool:
    """A flag: a Python bool, or a numpy bool (converted to the Python bool it holds); any
    other type (ints included) is a TypeError."""
    if isinstance(value, bool):
        return value
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be a numpy bool
    if numpy is not None and isinstance(value, numpy.bool_):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type_name(value)}")


def check_sinks(
    sinks, n_heads_q: int, device: torch.device, check_values: bool = True
) -> torch.Tensor | None:
    """``sinks``: None, or a float tensor [Hq] on q's device (float16, bfloat16 or float32: a
    model's parameter), returned as float32 and contiguous for the kernels (an ordinary
    differentiable cast, so its gradient reaches the parameter in its own dtype).
    ``check_values``: also check its values (``check_sink_values``: -inf, or finite within
    2**16) from a host copy made once per tensor and version (:func:`host_values`: a model's
    sinks parameter is copied once per optimizer step, not once per call); off while
    ``torch.compile`` traces or a CUDA graph is captured, where no host copy can be made."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type_name(sinks)}")
    if sinks.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise DTypeError(f"sinks must be float32, float16 or bfloat16, got {sinks.dtype}")
    if sinks.shape != (n_heads_q,):
        raise ValueError(f"sinks must be [Hq] = [{n_heads_q}], got shape {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks must be on the device of q ({device}), got {sinks.device}")
    if check_values:
        check_sink_values(host_values(sinks))
    return sinks.to(torch.float32).contiguous()


def _check_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
    return x


def check_cu_seqlens_meta(name: str, cu, device: torch.device) -> None:
    """The checks of a cu_seqlens tensor that need no host values (type, dtype, rank, device)."""
    _check_tensor(name, cu)
    if cu.dtype != torch.int32:
        raise DTypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B + 1 >= 1 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {cu.device}")
    if cu.stride(0) != 1 and cu.numel() > 1:
        # The kernels read cu_seqlens as dense int32 memory; the value checks read through the
        # stride: a strided view would be checked as one tensor and read as another.
        raise ValueError(
            f"{name} must be contiguous (stride 1), got stride {cu.stride(0)}; pass "
            f"{name}.contiguous()"
        )


def host_values(t: torch.Tensor) -> list:
    """``t.tolist()``, copied to the host once per tensor and version (``tensor_memo.derived``,
    which also keeps the device tensors derived from index tensors): a tensor that PyTorch ops
    have not written since its last copy is not copied again, so a model's layers sharing one
    cu_seqlens tensor copy it once per step. Inference tensors have no version counter and are
    copied every time. A tensor written behind PyTorch's back (a custom kernel, ``.data``) keeps
    its old values here: call :func:`forget_host_values` after that."""
    return derived("host_values", (t,), (), lambda: t.tolist())  # one host sync on a miss


def forget_host_values() -> None:
    """Drop every cached host copy (:func:`host_values`) and every device tensor derived from
    an index tensor (``tensor_memo.derived``: ``flash_attn_with_kvcache``'s ``cu_seqlens_k``
    and append slots): the next calls copy and derive again. Call it after writing an index
    tensor behind PyTorch's back (a custom kernel, ``.data``, a CUDA-graph replay), which
    leaves its version counter as it was."""
    forget_derived()


def _check_cu_seqlens_values(name: str, cu: torch.Tensor, total: int | None) -> list[int]:
    """The checks of a cu_seqlens tensor's values (after :func:`check_cu_seqlens_meta`);
    ``total`` None: any last entry (a paged cache's key counts)."""
    values = host_values(cu)  # one host sync per tensor version: the checks need the values
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    for i in range(len(values) - 1):
        if values[i + 1] < values[i]:
            raise ValueError(
                f"{name} must be non-decreasing, got {name}[{i}]={values[i]} > "
                f"{name}[{i + 1}]={values[i + 1]}"
            )
    if total is not None and values[-1] != total:
        raise ValueError(f"{name}[-1] must equal the total token count {total}, got {values[-1]}")
    return values


def _check_max_seqlen_int(name: str, given, batch: int, expected: str = "an int"):
    """A given max_seqlen: an integer (int, numpy integers, torch.SymInt under torch.compile,
    never a bool), >= 0, and within what the kernels index: sequence rows and program ids are
    int32, and axis 0 of a launch grid holds ``ceil(max_seqlen / SMALLEST_TILE) * batch``
    programs, at most ``2**31 - 1``. Plain integers come back as int; a SymInt is returned
    unchecked (bounding it would guard the compiled graph on it)."""
    if isinstance(given, bool) or not isinstance(given, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{name} must be {expected}, got {type_name(given)}")
    if isinstance(given, torch.SymInt):
        return given
    given = int(given)
    if given < 0:
        raise ValueError(f"{name} must be >= 0, got {given}")
    if given > INT32_MAX:
        raise ValueError(
            f"{name} must be at most 2**31 - 1 (the kernels index sequence rows in int32), "
            f"got {given}"
        )
    programs = -(-given // SMALLEST_TILE) * batch
    if programs > INT32_MAX:
        raise ValueError(
            f"{name}={given} with {batch} sequences needs up to {programs} programs on axis 0 "
            f"of a launch grid (ceil({name} / {SMALLEST_TILE}) * batch), more than 2**31 - 1"
        )
    return given


def _check_max_seqlen(name: str, given, real: int, batch: int) -> int:
    """A max_seqlen against the longest sequence ``real`` (derived from it when None)."""
    if given is None:
        return _check_max_seqlen_int(name, real, batch)
    given = _check_max_seqlen_int(name, given, batch, "an int or None")
    if given < real:
        raise ValueError(f"{name}={given} is smaller than the longest sequence ({real})")
    return given


def check_common(
    q,
    k,
    v,
    causal,
    softmax_scale,
    return_lse,
    kernel,
    token_dims: int = 1,
    kv_token_dims: int | None = None,
) -> float:
    """Checks shared by the varlen (``token_dims`` 1) and dense (2) entry points: tensors,
    their ranks and dims (:func:`check_heads_and_dims`; ``kv_token_dims``: k/v's leading dims
    where they differ from q's, 2 for paged caches) first, dtypes, devices, the flags and
    the kernel; returns the softmax scale. ``causal`` and ``return_lse`` may be numpy bools:
    the caller passes ``bool(causal)`` on (:func:`check_bool`)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    check_heads_and_dims(q, k, v, token_dims, kv_token_dims)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise DTypeError(
            f"q must be torch.float16 or torch.bfloat16, got {q.dtype}: cast q, k and v "
            "(e.g. .to(torch.bfloat16)), or call under "
            "torch.autocast('cuda', dtype=torch.bfloat16), which portattn's entry points follow"
        )
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise DTypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")
    if q.device.type == "cpu" and not interpreter_active():
        raise ValueError(
            "q, k, v are CPU tensors: portattn runs on CUDA/ROCm GPUs, or on the CPU only under "
            "Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)"
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q must be on a CUDA/ROCm device, got {q.device}")
    check_bool("causal", causal)
    check_bool("return_lse", return_lse)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str, got {type_name(kernel)}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return check_softmax_scale(softmax_scale, q.shape[-1])


def check_heads_and_dims(q, k, v, token_dims: int, kv_token_dims: int | None = None) -> None:
    """q/k: [..., Hq or Hkv, D], v: [..., Hkv, Dv] with ``token_dims`` leading dims (k/v:
    ``kv_token_dims`` if given): k has q's head dim; v has it too, or its own
    (:func:`check_head_dims`)."""
    kv_dims = token_dims if kv_token_dims is None else kv_token_dims
    for name, x, want in (("q", q, token_dims + 2), ("k", k, kv_dims + 2), ("v", v, kv_dims + 2)):
        if x.dim() != want:
            paged = name != "q" and kv_dims != token_dims  # varlen_attention with a block_table
            why = " (with a block_table, k and v are paged caches [num_pages, page_size, Hkv, D])"
            raise ValueError(
                f"{name} must be {want}-D{why if paged else ''}, got shape {tuple(x.shape)}"
            )
        if x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ValueError(
                f"{name}.stride(-1) must be 1 (last dim contiguous), got {x.stride(-1)}"
            )
    check_head_dims(q.shape[-1], k.shape[-1], v.shape[-1])
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must have the same shape but for the head dim (tokens, heads), got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    n_heads_q, n_heads_k = q.shape[-2], k.shape[-2]
    if n_heads_k == 0 or n_heads_q == 0:
        raise ValueError(f"head counts must be >= 1, got Hq={n_heads_q}, Hkv={n_heads_k}")
    if n_heads_q % n_heads_k != 0:
        raise ValueError(f"Hq ({n_heads_q}) must be a multiple of Hkv ({n_heads_k})")
    if n_heads_q > 65535:
        raise ValueError(f"Hq must be at most 65535 (grid limit), got {n_heads_q}")


def check_head_dims(head_dim: int, head_dim_k: int, head_dim_v: int) -> None:
    """k has q's head dim D; v has D too, or a value head dim Dv of its own (the output then
    has Dv): D one of ``SUPPORTED_HEAD_DIMS`` (every multiple of 8 up to 256) and Dv == D,
    or D and Dv each one of ``PAIR_HEAD_DIMS``, or (D, Dv) one of ``VALUE_HEAD_DIM_PAIRS``
    (MLA's (192, 128))."""
    if head_dim_k != head_dim:
        raise ValueError(f"k head dim must equal q's ({head_dim}), got {head_dim_k}")
    if (head_dim, head_dim_v) in VALUE_HEAD_DIM_PAIRS:
        return
    if head_dim not in SUPPORTED_HEAD_DIMS:
        pairs = f"; with a value head dim of its own also {VALUE_HEAD_DIM_PAIRS} (D, Dv)"
        raise ValueError(
            f"head dim must be one of the multiples of 8 from 8 to 256{pairs}, got {head_dim}"
        )
    if head_dim_v == head_dim:
        return
    if head_dim not in PAIR_HEAD_DIMS or head_dim_v not in PAIR_HEAD_DIMS:
        raise ValueError(
            f"v head dim must equal q's ({head_dim}) or be one of {PAIR_HEAD_DIMS} with q's "
            f"one of them too (or (D, Dv) one of {VALUE_HEAD_DIM_PAIRS}), got {head_dim_v}"
        )


def _check_same_batch(n_q: int, n_k: int) -> None:
    if n_q != n_k:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same batch, got "
            f"{n_q - 1} and {n_k - 1} sequences"
        )


def _check_max_seqlen_given(name: str, given, batch: int):
    """A max_seqlen checked without the values of cu_seqlens: it must be given (an int, or a
    symbolic int while torch.compile traces), >= 0 and within the kernels' bounds
    (:func:`_check_max_seqlen_int`). Plain integers come back as int."""
    if given is None:
        raise ValueError(
            f"{name} must be given (an int) when varlen_attention runs under torch.compile or "
            "CUDA-graph capture: deriving it from cu_seqlens needs their host values (a graph "
            "break under torch.compile, a device-to-host copy that capture forbids)"
        )
    return _check_max_seqlen_int(name, given, batch)


def _check_varlen_shapes(q, cu_seqlens_q, cu_seqlens_k) -> None:
    """The varlen checks of both paths that read no values, after :func:`check_common` (which
    checks q/k/v, their ranks, heads and dims): the cu_seqlens tensors' type, dtype, rank,
    device and stride, one batch size for both."""
    check_cu_seqlens_meta("cu_seqlens_q", cu_seqlens_q, q.device)
    check_cu_seqlens_meta("cu_seqlens_k", cu_seqlens_k, q.device)
    _check_same_batch(cu_seqlens_q.shape[0], cu_seqlens_k.shape[0])


def check_varlen_without_values(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
) -> tuple:
    """The varlen checks that need no host value of ``cu_seqlens`` (after
    :func:`check_common`): shapes, dtypes, devices, strides, batch sizes, and both max_seqlen
    given. They are all the checks while ``torch.compile`` traces (the value checks would need
    a device-to-host copy, a graph break). In eager mode with both max_seqlen given, the
    value checks (:func:`check_varlen_values`) follow inside the forward op, right before its
    launch.
    Returns (max_seqlen_q, max_seqlen_k)."""
    _check_varlen_shapes(q, cu_seqlens_q, cu_seqlens_k)
    batch = cu_seqlens_q.shape[0] - 1
    return (
        _check_max_seqlen_given("max_seqlen_q", max_seqlen_q, batch),
        _check_max_seqlen_given("max_seqlen_k", max_seqlen_k, batch),
    )


@once_per_version("varlen_values")
def check_varlen_values(
    cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q, max_seqlen_k
) -> VarlenShape:
    """The checks of the values of ``cu_seqlens`` (one host copy per distinct tensor), after
    the shape checks (:func:`check_varlen_without_values` or :func:`check_varlen`): first
    entry 0, non-decreasing, last entry the token count, and each max_seqlen (None: derived)
    at least the longest sequence and within the kernels' bounds. Run once per version of the
    two tensors and these sizes (``tensor_memo.derived``, as :func:`host_values`): the layers
    of a model that share a pack check it at the first (a loop over its sequences)."""
    values_q = _check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, total_q)
    if cu_seqlens_k is cu_seqlens_q and total_k == total_q:
        values_k = values_q  # one tensor for both: its values are checked, no second host sync
    else:
        values_k = _check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, total_k)
    real_q = max((b - a for a, b in zip(values_q, values_q[1:])), default=0)
    real_k = max((b - a for a, b in zip(values_k, values_k[1:])), default=0)
    batch = len(values_q) - 1
    return VarlenShape(
        batch=batch,
        max_seqlen_q=_check_max_seqlen("max_seqlen_q", max_seqlen_q, real_q, batch),
        max_seqlen_k=_check_max_seqlen("max_seqlen_k", max_seqlen_k, real_k, batch),
    )


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> VarlenShape:
    """q: [total_q, Hq, D]; k, v: [total_k, Hkv, D]; cu_seqlens_*: int32 [B + 1]. After
    :func:`check_common` (q, k, v), every varlen check, the value checks included (they
    derive a max_seqlen that is None)."""
    _check_varlen_shapes(q, cu_seqlens_q, cu_seqlens_k)
    return check_varlen_values(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )


def check_block_table_meta(block_table, k, batch: int, device: torch.device) -> int:
    """A paged call's block table and cache layout, without host values: block_table int32
    [B, pages_per_seq] on q's device, rows contiguous; k/v [num_pages, page_size, Hkv, D] (the
    rank was checked) with a page size that is a power of two from 16 to 256. Returns the page
    size."""
    _check_tensor("block_table", block_table)
    if block_table.dtype != torch.int32:
        raise DTypeError(f"block_table must have dtype torch.int32, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(
            f"block_table must be [B, pages_per_seq] with B = {batch} (the batch of "
            f"cu_seqlens), got shape {tuple(block_table.shape)}"
        )
    if block_table.device != device:
        raise ValueError(f"block_table must be on {device} like q, got {block_table.device}")
    if block_table.stride(-1) != 1 and block_table.shape[-1] > 1:
        raise ValueError(f"block_table rows must be contiguous, got strides {block_table.stride()}")
    page_size = k.shape[1]
    if page_size not in PAGE_SIZES:
        raise ValueError(
            f"with a block_table, k and v are paged caches [num_pages, page_size, Hkv, D] "
            f"with page_size one of {PAGE_SIZES}, got k of shape {tuple(k.shape)}"
        )
    return page_size


PAGE_SIZES = (16, 32, 64, 128, 256)


def check_key_counts(name: str, counts: list[int], capacity: int) -> None:
    """Each sequence's key count fits the cache capacity it has (pages times page size)."""
    for b, n in enumerate(counts):
        if n > capacity:
            raise CacheIndexError(
                f"sequence {b} has {n} keys ({name}), more than its cache holds ({capacity})"
            )


def check_pages(
    block_table: torch.Tensor, counts: list[int], page_size: int, num_pages: int
) -> None:
    """The pages a sequence uses (``ceil(count / page_size)`` first entries of its block-table
    row) are pages of the cache; entries past them are never read and may hold anything."""
    rows = host_values(block_table)
    for b, n in enumerate(counts):
        used = rows[b][: -(-n // page_size)]
        bad = [p for p in used if not 0 <= p < num_pages]
        if bad:
            raise CacheIndexError(
                f"block_table[{b}] names page {bad[0]}, outside the cache's {num_pages} pages"
            )


@once_per_version("paged_values")
def check_paged_values(
    cu_seqlens_q,
    cu_seqlens_k,
    block_table,
    total_q: int,
    num_pages: int,
    page_size: int,
    max_seqlen_q,
    max_seqlen_k,
) -> VarlenShape:
    """The value checks of a paged varlen call: cu_seqlens_q as always; cu_seqlens_k counts
    each sequence's keys (0 first, non-decreasing), each count within its block-table row's
    capacity, the pages it uses inside the cache; max_seqlen as always. Once per version of
    the three tensors and these sizes (as :func:`check_varlen_values`)."""
    values_q = _check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, total_q)
    values_k = _check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, None)
    counts = [b - a for a, b in zip(values_k, values_k[1:])]
    check_key_counts("cu_seqlens_k", counts, block_table.shape[1] * page_size)
    check_pages(block_table, counts, page_size, num_pages)
    real_q = max((b - a for a, b in zip(values_q, values_q[1:])), default=0)
    batch = len(values_q) - 1
    return VarlenShape(
        batch=batch,
        max_seqlen_q=_check_max_seqlen("max_seqlen_q", max_seqlen_q, real_q, batch),
        max_seqlen_k=_check_max_seqlen("max_seqlen_k", max_seqlen_k, max(counts, default=0), batch),
    )
