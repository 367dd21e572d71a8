"""A key a row does not see never changes that row, whatever it holds (issue 35, item 4):
NaN/inf in the key, value or output gradient of a causally masked or out-of-window key leaves
the other rows' bits as a clean run's, forward and backward, both kernels, the varlen and the
decode (kvcache) paths. CPU here under the interpreter; the ``gpu`` tests repeat them on the
device at sizes that reach every kernel's masked tiles."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import unseen_checks as checks
from helpers import KERNELS
from unseen_checks import Setup

from portattn import configs

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("target,bad", [("v", NAN), ("v", INF), ("k", NAN), ("k", -INF)])
def test_unseen_key_causal(kernel, target, bad):
    checks.check_unseen_key(kernel, Setup(77, 77), 40, target, bad)


@pytest.mark.parametrize("kernel", KERNELS)
def test_unseen_key_one_kv_head(kernel):
    """A NaN value in kv head 3 of 4 (query heads 15-19, across the forward repair's blocks of
    16 heads): that group's rows that do not see it and every row of the other heads keep a
    clean run's bits; the tiles of the heads that see it are the only ones repaired."""
    checks.check_unseen_key(kernel, Setup(77, 77, heads=(20, 4)), 40, "v", NAN, kv_head=3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_unseen_key_window(kernel):  # rows past the window's left edge do not see key 5
    checks.check_unseen_key(kernel, Setup(70, 70, window=(9, 0)), 5, "v", NAN)


@pytest.mark.parametrize("kernel", KERNELS)
def test_unseen_key_chunk_rows(kernel):  # Sq < Sk: bottom-right aligned
    checks.check_unseen_key(kernel, Setup(33, 90, (2, 2), dtype=torch.bfloat16), 80, "v", NAN)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("key", [30, 5])
def test_unseen_key_rows_without_keys(kernel, key):
    """Sq > Sk: rows 0-56 see no key, rows 57-86 see some keys but not key 30, the rest see
    it: tiles holding several kinds of row are repaired (the repair pass tests one row per
    64-row slab, ``repair_check_rows``) and rows that see no key keep a clean run's zeros."""
    checks.check_unseen_key(kernel, Setup(90, 33), key, "v", NAN)


@pytest.fixture
def one_repair_product(monkeypatch):
    """Every interpreter entry with ``repair_products=1`` (sm100's and sm120's entries where a
    second accumulator does not fit) for the test's duration."""
    table = configs.config_table()
    for key, cfg in list(table.items()):
        if key[0] == configs.INTERPRETER:
            monkeypatch.setitem(table, key, dataclasses.replace(cfg, repair_products=1))


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_repair_product(kernel, one_repair_product):
    """With one product per masked tile the rows that do not see a NaN/inf key, value or
    output-gradient row keep a clean run's bits as with two; the rows that see a NaN value
    are NaN (with one product: in every column)."""
    checks.check_unseen_key(kernel, Setup(77, 77), 40, "v", NAN)
    checks.check_unseen_key(kernel, Setup(77, 77), 40, "k", INF)
    checks.check_unseen_key(kernel, Setup(70, 70, window=(9, 0)), 5, "v", INF)
    checks.check_unseen_grad_row(kernel, Setup(77, 77), 30, NAN)
    checks.check_unseen_append(kernel, 16, NAN)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bad", [NAN, INF])
def test_unseen_grad_row(kernel, bad):
    checks.check_unseen_grad_row(kernel, Setup(77, 77), 30, bad)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size", [16, 64])
def test_unseen_append(kernel, page_size):
    checks.check_unseen_append(kernel, page_size, NAN)


def test_unseen_append_softcap_window():
    checks.check_unseen_append("varlen", 16, INF, window=(20, 0), softcap=5.0)


GPU_GRID = [  # the table entries that train (bf16 d128 / d64) and fp16's d128
    (kernel, dtype, head_dim)
    for kernel in KERNELS
    for dtype, head_dim in ((torch.bfloat16, 128), (torch.bfloat16, 64), (torch.float16, 128))
]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype,head_dim", GPU_GRID)
@pytest.mark.parametrize("window", [(-1, -1), (100, 0)])
def test_unseen_gpu(kernel, dtype, head_dim, window):
    square = Setup(1000, 1000, (8, 2), head_dim, dtype, window=window)
    for target, bad in (("v", NAN), ("v", INF), ("k", NAN)):
        checks.check_unseen_key(kernel, square, 517, target, bad)
    chunk = dataclasses.replace(square, seqlen_q=300)  # Sq < Sk: bottom-right aligned
    checks.check_unseen_key(kernel, chunk, 900, "v", NAN)
    tall = dataclasses.replace(square, seqlen_k=300)  # Sq > Sk: rows with no key first
    checks.check_unseen_key(kernel, tall, 250, "v", NAN)
    checks.check_unseen_grad_row(kernel, square, 300, NAN)
    gqa = dataclasses.replace(square, heads=(20, 4))  # one kv head's group, across 16 heads
    checks.check_unseen_key(kernel, gqa, 517, "v", NAN, kv_head=3)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_unseen_append_gpu(kernel, page_size):
    for dtype in (torch.bfloat16, torch.float16):
        checks.check_unseen_append(kernel, page_size, NAN, (32, 8), 128, dtype)
        checks.check_unseen_append(
            kernel, page_size, INF, (8, 1), 64, dtype, window=(20, 0), softcap=5.0
        )
