"""``kernels/append.py``: flash_attn_with_kvcache's append kernel writes the new rows' bytes into
their cache slots and nothing else, for paged and dense caches, tensor and int lengths, rows
crossing pages, strided new rows and a value head dim of its own; and the public call gives
the bytes of the aten index ops it replaces (``kvcache_append.APPEND_KERNEL`` off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import DEVICE, seeded_tensor

import portattn
from portattn import kvcache_append
from portattn.families import FAMILIES
from portattn.kernels.append import plan_append
from portattn.kernels.plan import run_launches

HKV, D, DV, PAGE = 3, 32, 16, 16
ROOT = Path(__file__).resolve().parents[1]


def random_bits(*shape: int, seed: int) -> torch.Tensor:
    """bfloat16 of random bit patterns, NaN payloads and infinities included: a copy must keep
    every bit (an arithmetic path would canonicalize a NaN)."""
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int16)
    return bits.view(torch.bfloat16).to(DEVICE)


def expected_caches(k_cache, v_cache, k, v, lens, table, rows):
    """The caches after the append, written element by element on the host."""
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b in range(k.shape[0]):
        for i in range(k.shape[1]):
            pos = (int(lens[b]) if isinstance(lens, torch.Tensor) else lens) + i
            if table is not None:
                where = (int(table[b, pos // PAGE]), pos % PAGE)
            else:
                where = (b if rows is None else int(rows[b]), pos)
            k_want[where] = k[b, i]
            v_want[where] = v[b, i]
    return k_want, v_want


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def every_other(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a strided view: every other element of a tensor twice its length."""
    wide = torch.full((2 * t.shape[0],), -7, dtype=t.dtype, device=t.device)
    wide[::2] = t
    return wide[::2]


@pytest.mark.parametrize("layout", ["paged", "dense", "dense_rows"])
@pytest.mark.parametrize("lengths", ["tensor", "int", "strided"])
@pytest.mark.parametrize("new", [1, 5])
def test_append_kernel_writes_the_new_rows_bytes(layout, lengths, new):
    """``strided``: cache_seqlens (and a dense cache's rows) every other element of a wider
    tensor, read through their strides."""
    batch = 3
    if layout == "paged":
        k_cache, v_cache = (
            random_bits(7, PAGE, HKV, D, seed=1),
            random_bits(7, PAGE, HKV, DV, seed=2),
        )
        table = torch.tensor([[4, 0], [1, 6], [2, 5]], dtype=torch.int32, device=DEVICE)
        rows = None
    else:
        k_cache, v_cache = random_bits(4, 40, HKV, D, seed=1), random_bits(4, 40, HKV, DV, seed=2)
        table = None
        rows = torch.tensor([3, 0, 2], dtype=torch.int32, device=DEVICE)
        rows = rows if layout == "dense_rows" else None
    # strided new rows: every other element of the last dim, heads and rows apart
    k = random_bits(batch, new, HKV, 2 * D, seed=3)[..., ::2]
    v = random_bits(batch, new + 1, HKV + 1, DV, seed=4)[:, :new, :HKV]
    lens = torch.tensor([13, 0, 27], dtype=torch.int32, device=DEVICE)  # 13 + 5 crosses a page
    if lengths == "int":
        lens = 14
    elif lengths == "strided":
        lens = every_other(lens)
        rows = None if rows is None else every_other(rows)
    k_want, v_want = expected_caches(k_cache, v_cache, k, v, lens, table, rows)
    launch = plan_append(k_cache, v_cache, k, v, lens, table, rows)
    run_launches((launch,), k.device)
    assert torch.equal(bits(k_cache), bits(k_want))
    assert torch.equal(bits(v_cache), bits(v_want))


def test_append_kernel_nothing_to_write():
    k_cache = random_bits(2, PAGE, HKV, D, seed=1)
    table = torch.zeros(0, 1, dtype=torch.int32, device=DEVICE)
    empty = random_bits(0, 1, HKV, D, seed=3)
    assert plan_append(k_cache, k_cache, empty, empty, 0, table, None) is None
    none_new = random_bits(2, 0, HKV, D, seed=3)
    assert plan_append(k_cache, k_cache, none_new, none_new, 0, None, None) is None


def decode_steps(paged: bool, steps: int, new: int, index_args=None, rows: bool = True) -> tuple:
    """Caches, then ``steps`` appending ``flash_attn_with_kvcache`` calls of ``new`` rows (a
    paged cache, or a dense one, with rows ``cache_batch_idx`` where ``rows``),
    ``cache_seqlens`` growing in place: (k_cache, v_cache, *outs). ``index_args(step, args)``:
    the index tensors a step passes (default: as they are)."""
    if paged:
        k_cache, v_cache = seeded_tensor(6, PAGE, HKV, D), seeded_tensor(6, PAGE, HKV, D, seed=2)
        extra = dict(block_table=torch.tensor([[5, 1], [0, 3]], dtype=torch.int32))
    else:
        k_cache, v_cache = seeded_tensor(3, 32, HKV, D), seeded_tensor(3, 32, HKV, D, seed=2)
        extra = dict(cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32)) if rows else {}
    extra = {k: t.to(DEVICE) for k, t in extra.items()}
    lens = torch.tensor([14, 3], dtype=torch.int32, device=DEVICE)
    outs = []
    with torch.no_grad():
        for step in range(steps):
            q = seeded_tensor(2, new, 2 * HKV, D, seed=10 + step)
            k, v = seeded_tensor(2, new, HKV, D, seed=20 + step), seeded_tensor(2, new, HKV, D)
            args = dict(extra, cache_seqlens=lens)
            if index_args is not None:
                args = index_args(step, args)
            outs.append(
                portattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, causal=True, **args)
            )
            lens += new
    return (k_cache, v_cache, *outs)


@pytest.mark.parametrize("paged", [True, False])
def test_public_append_gives_the_bytes_of_the_index_ops(monkeypatch, paged):
    """flash_attn_with_kvcache with the append kernel and with the aten index ops it replaced:
    the same caches and outputs, bit for bit, over a few decode steps."""
    results = []
    for kernel_on in (True, False):
        monkeypatch.setattr(kvcache_append, "APPEND_KERNEL", kernel_on)
        results.append(decode_steps(paged, steps=3, new=2, rows=False))
    for with_kernel, with_index_ops in zip(*results):
        assert torch.equal(bits(with_kernel), bits(with_index_ops))


@pytest.mark.parametrize("paged", [True, False])
def test_strided_index_tensors_give_the_contiguous_bytes(paged):
    """flash_attn_with_kvcache with ``cache_seqlens`` (and ``cache_batch_idx``) strided views,
    after calls of the same signature with contiguous ones (whose append launch is kept): the
    caches and outputs of the same calls with contiguous copies, bit for bit."""

    def strided_from_third(step, args):
        if step < 2:  # the first two calls keep the launch
            return args
        return {name: every_other(t) if t.dim() == 1 else t for name, t in args.items()}

    contiguous = decode_steps(paged, steps=4, new=1)
    strided = decode_steps(paged, steps=4, new=1, index_args=strided_from_third)
    for a, b in zip(contiguous, strided, strict=True):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.triton_version
def test_append_kernel_compiles_for_every_family():
    """The append kernel compiles for every family's target on this CPU (Triton's compiler in
    a child process, the compile check's pinned settings), spills nothing, and copies the
    head dim with vector loads where the rows are contiguous."""
    code = """
        import json, tempfile, torch
        from portattn.families import FAMILIES
        from portattn.kernels.append import plan_append
        from portattn.tools.compile_artifacts import resource_usage
        from portattn.tools.compile_inputs import pinned_knobs
        from portattn.tools.compile_launches import bind_launch
        from portattn.tools.compilecheck import compile_launch

        out = {}
        for paged, lengths in ((True, True), (False, False)):
            shape = (8, 64, 8, 128) if paged else (4, 512, 8, 128)
            cache = torch.zeros(shape, dtype=torch.bfloat16)
            new = torch.zeros(4, 1, 8, 128, dtype=torch.bfloat16)
            table = torch.zeros(4, 2, dtype=torch.int32) if paged else None
            lens = torch.zeros(4, dtype=torch.int32) if lengths else 5
            planned = plan_append(cache, cache.clone(), new, new.clone(), lens, table, None)
            launch = bind_launch("append", planned.kernel, planned.args, planned.params)
            for name, family in FAMILIES.items():
                with tempfile.TemporaryDirectory() as d, pinned_knobs(d):
                    art = compile_launch(launch, family)
                use = resource_usage(art, family)
                vector = ".v2." in art.asm or ".v4." in art.asm or "dwordx" in art.asm
                out[f"{name} paged={paged}"] = [use["spills"], use["scratch"], vector]
        print(json.dumps(out))
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(found) == 2 * len(FAMILIES)
    assert all(result == [0, 0, True] for result in found.values()), found


@pytest.mark.parametrize("lengths", ["tensor", "int"])
@pytest.mark.parametrize("paged", [True, False])
def test_index_op_append_as_traced(monkeypatch, lengths, paged):
    """The aten path (torch.compile's, ``APPEND_KERNEL`` off), its index tensors made anew as
    while a graph is captured or traced: the bytes of the append kernel."""
    caches = []
    for kernel_on in (True, False):
        monkeypatch.setattr(kvcache_append, "APPEND_KERNEL", kernel_on)
        if paged:
            k_cache, v_cache = (
                random_bits(6, PAGE, HKV, D, seed=1),
                random_bits(6, PAGE, HKV, DV, seed=2),
            )
            table = torch.tensor([[5, 1], [0, 3]], dtype=torch.int32, device=DEVICE)
            page_size = PAGE
        else:
            k_cache, v_cache = (
                random_bits(2, 32, HKV, D, seed=1),
                random_bits(2, 32, HKV, DV, seed=2),
            )
            table, page_size = None, 32
        k, v = random_bits(2, 3, HKV, D, seed=3), random_bits(2, 3, HKV, DV, seed=4)
        lens = (
            torch.tensor([14, 3], dtype=torch.int32, device=DEVICE) if lengths == "tensor" else 15
        )
        kvcache_append.append_rows(k_cache, v_cache, k, v, lens, table, page_size, None, True)
        caches.append((bits(k_cache), bits(v_cache)))
    assert all(torch.equal(a, b) for a, b in zip(*caches))
