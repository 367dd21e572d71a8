"""The paged key loop's page lookup (``addressing.page_block`` and ``tile_pages``): the block
table read a block of key tiles at a time into registers (16, 4 or 1 tiles: the
``KernelConfig.page_block`` values), then each tile's per-key pages and slots taken from them,
against ``block_table[j // page_size]`` and ``j % page_size`` for every key ``j``, at tiles
that span several pages, one page, or part of one, and at a sequence's end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from helpers import DEVICE

from portattn.kernels.addressing import page_block, tile_pages

ROOT = Path(__file__).resolve().parents[1]


@triton.jit
def _tile_pages_kernel(table, out, slots, n_start, seqlen_k, BLOCK_N: tl.constexpr,
                       PAGE_SIZE: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
    b_start = n_start - n_start % (TILES * BLOCK_N)
    b_pages = page_block(table, b_start, seqlen_k, BLOCK_N, PAGE_SIZE, TILES)
    o_k = n_start + tl.arange(0, BLOCK_N)
    o_page, o_slot = tile_pages(b_pages, (n_start - b_start) // BLOCK_N, o_k, BLOCK_N, PAGE_SIZE,
                                TILES)  # fmt: skip
    tl.store(out + tl.arange(0, BLOCK_N), o_page)
    tl.store(slots + tl.arange(0, BLOCK_N), o_slot)


@pytest.mark.parametrize("tiles", [16, 4, 1])
@pytest.mark.parametrize(
    ("block_n", "page_size"), [(64, 16), (128, 64), (16, 16), (16, 64), (128, 256), (64, 32)]
)
def test_tile_pages_are_the_block_tables(block_n, page_size, tiles):
    gen = torch.Generator().manual_seed(block_n + page_size)
    pages = 40
    table = torch.randperm(1000, generator=gen)[:pages].to(torch.int32).to(DEVICE)
    seqlen_k = pages * page_size - 5  # the last page partly used
    for n_start in range(0, seqlen_k, block_n):
        out = torch.full((block_n,), -1, dtype=torch.int64, device=DEVICE)
        slots = torch.full_like(out, -1)
        _tile_pages_kernel[(1,)](table, out, slots, n_start, seqlen_k, block_n, page_size, tiles)
        keys = torch.arange(n_start, n_start + block_n, device=DEVICE)
        assert torch.equal(slots, keys % page_size), f"tile at key {n_start}: slots"
        # an entry is read where its first key (of the tile, or of the page within it) is
        # inside the sequence; keys past the end in a read entry get its page (masked later)
        first = n_start if page_size >= block_n else keys - keys % page_size
        read = torch.as_tensor(first, device=DEVICE) < seqlen_k
        want = torch.where(read, table[(keys // page_size).clamp(max=pages - 1)].long(), 0)
        assert torch.equal(out, want), f"tile at key {n_start}"


def _dense_cache_decode(s_cache: int, family: str = "sm90"):
    """The planned decode launches of one query row per sequence against a dense cache of
    ``s_cache`` rows [2, s_cache, 1, 32] (a "page" of S_cache rows a sequence: the block table
    is the column of the batch's rows), with ``family``'s varlen d32 entry; CPU tensors,
    nothing launched."""
    from portattn.configs import entry_config
    from portattn.kernels.forward import plan_forward
    from portattn.kernels.plan import plan_problem
    from portattn.options import AttentionOptions

    cfg = entry_config(family, "varlen", 32, torch.bfloat16)
    q = torch.zeros(2, 2, 32, dtype=torch.bfloat16)
    k_cache = torch.zeros(2, s_cache, 1, 32, dtype=torch.bfloat16)
    table = torch.arange(2, dtype=torch.int32)[:, None]
    cu_q = torch.arange(3, dtype=torch.int32)
    cu_k = torch.arange(3, dtype=torch.int32) * s_cache
    options = AttentionOptions(causal=True, softmax_scale=32**-0.5, kernel="varlen")
    problem = plan_problem(q, k_cache, cu_q, 1, s_cache, options, cfg, block_table=table)
    plan = plan_forward(problem, q, k_cache, k_cache, cu_q, cu_k, store_o32=False,
                        block_table=table)  # fmt: skip
    return cfg, plan.launches


@pytest.mark.parametrize("s_cache", [9, 100, 64, 1000])
def test_dense_cache_reads_the_block_table_per_tile_unless_a_power_of_two(s_cache):
    """A dense cache's "page" is its S_cache rows, any length: ``page_block`` (a Triton range
    of BLOCK_N // PAGE_SIZE pages) holds only for pages of a power of two rows; other lengths
    read the table per tile (PAGE_BLOCK 0), as sm90's GPU run of flash-attn's window test
    (S_cache 9) failed to compile without this."""
    cfg, launches = _dense_cache_decode(s_cache)
    assert cfg.page_block > 0  # sm90 has a page block: the case this guards
    want = cfg.page_block if s_cache & (s_cache - 1) == 0 else 0
    assert [launch.params["PAGE_BLOCK"] for launch in launches] == [want] * len(launches)
    assert all(launch.params["PAGE_SIZE"] == s_cache for launch in launches)


def test_dense_cache_of_odd_rows_compiles_for_sm90():
    """The decode of a dense cache of 9 rows compiles for sm90 (the GPU's target, compiled on
    this CPU): its tiles read the block table one at a time."""
    code = """
        import tempfile
        import sys
        sys.path.insert(0, "tests")
        from test_page_block import _dense_cache_decode
        from portattn.families import FAMILIES
        from portattn.tools.compile_inputs import pinned_knobs
        from portattn.tools.compile_launches import bind_launch
        from portattn.tools.compilecheck import compile_launch

        _, launches = _dense_cache_decode(9)
        for one in launches:
            launch = bind_launch(one.stage, one.kernel, one.args, one.params, one.descriptors)
            with tempfile.TemporaryDirectory() as d, pinned_knobs(d):
                compile_launch(launch, FAMILIES["sm90"])
        print("compiled", len(launches))
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("compiled ")
