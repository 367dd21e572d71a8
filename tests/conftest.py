"""Test harness. Without a GPU, the kernels run under Triton's interpreter: TRITON_INTERPRET is
set here, before anything imports triton (the package never sets it)."""

import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import portattn.kernels.buffers as buffers  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA/ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every output buffer starts as NaN, so tests see any element the kernels did not write."""
    monkeypatch.setattr(buffers, "POISON", True)


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_GPU else "cpu"
