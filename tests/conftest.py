"""Test harness. Without a GPU, the kernels run under Triton's interpreter: TRITON_INTERPRET is
set here, before anything imports triton (the package never sets it)."""

import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import portattn.kernels.buffers as buffers  # noqa: E402


def _no_repatching_in_device_calls() -> None:
    """Triton's interpreter patches all of ``triton.language`` (``inspect.getmembers`` of
    ``tl``, ``tl.tensor``, ``tl.math``, ...) at each kernel launch, and again at *every call* of
    a ``@triton.jit`` helper from the kernel, although the launch's patch stays in place until
    the launch ends and the helper's patch is the same (the one interpreter builder). That was
    38 % of the CPU time of ``test_invariance.py::test_pack_position`` (cProfile: 27 of 72 s
    under ``_patch_builtin``). Here a helper call that finds its ``triton.language`` modules
    already patched patches nothing; a launch still patches and restores as before. The bits
    cannot change (the helper runs the same interpreted functions), and
    tests/test_interpreter_bits.py, recorded without this, checks it."""
    import threading

    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang, call = interpreter._patch_lang, interpreter.InterpretedFunction.__call__
    state = threading.local()

    def patched(lang) -> bool:
        return not tl.core.is_builtin(lang.load)

    def device_patch_lang(fn):
        langs = [v for v in fn.__globals__.values() if v is tl or v is tl.core]
        if getattr(state, "device_calls", 0) and langs and all(map(patched, langs)):
            return interpreter._LangPatchScope()
        return patch_lang(fn)

    def device_call(self, *args, **kwargs):
        state.device_calls = getattr(state, "device_calls", 0) + 1
        try:
            return call(self, *args, **kwargs)
        finally:
            state.device_calls -= 1

    interpreter._patch_lang = device_patch_lang
    interpreter.InterpretedFunction.__call__ = device_call


if not HAS_GPU:
    _no_repatching_in_device_calls()


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


@pytest.fixture
def override_entry(monkeypatch):
    """Replace one table entry for the test's duration: (kernel, head_dim, dtype, **fields);
    the interpreter's entry on the CPU, the GPU family's on a GPU."""
    import dataclasses

    from helpers import gpu_family

    from portattn import configs

    table = configs.config_table()

    def apply(kernel: str, head_dim: int, dtype: torch.dtype, **fields):
        family = gpu_family() if HAS_GPU else configs.INTERPRETER
        key = (family, kernel, head_dim, dtype)
        monkeypatch.setitem(table, key, dataclasses.replace(table[key], **fields))

    return apply
