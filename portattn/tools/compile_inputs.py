"""What the compile check compiles, and how: the guarded entries (those golden/ records), the
Triton settings pinned while compiling, and a recorded launch specialised as Triton's JIT does it
(:func:`compile_source`). The fingerprints in golden/ are made this way on the CPU CI and on the
GPUs alike; the checkout's compile keys (``ci/golden_dev/keys.py``) hash the same inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from portattn.tools.compile_launches import Entry, Launch, select_entries, unset_env

# Triton knobs pinned while compiling, whatever the environment says (TRITON_*, PTXAS_OPTIONS,
# AMDGCN_* ...): every setting that changes the machine code at its Triton default, line info
# off, the bundled ptxas and libdevice, no instrumentation, fresh compiles, and the ptxas report
# printed (registers and spills are read from it). The golden files' fingerprints are made
# under these settings on the CPU CI and on the GPUs alike, so they agree bit for bit.
PINNED_KNOBS: dict[str, dict[str, Any]] = {
    "compilation": {
        "always_compile": True,
        "disable_line_info": True,
        "dump_ir_extract_di_local_variables": False,
        "override": False,
        "allow_non_constexpr_globals": False,
        "use_ir_loc": None,
        "enable_asan": False,
        "instrumentation_mode": "",
    },
    "runtime": {"override_arch": None, "add_stages_inspection_hook": None},
    "nvidia": {
        "dump_ptxas_log": True,
        "disable_ptxas_opt": False,
        "ptxas": None,  # None: the ptxas bundled with Triton (not $TRITON_PTXAS_PATH)
        # Triton 3.9 assembles every NVIDIA arch with this one (3.6-3.8: arch >= 100 only).
        "ptxas_blackwell": None,  # None: the bundled one (not $TRITON_PTXAS_BLACKWELL_PATH)
        "ptxas_options": None,
        "mock_ptx_version": None,
        "libdevice_path": None,
    },
    "amd": {
        "use_buffer_ops": True,
        "use_buffer_atomics": True,
        "buffer_ops_analyze_small_tensor_range": False,
        "use_async_copy": False,
        "use_block_pingpong": None,
        "use_in_thread_transpose": None,
        "scalarize_packed_fops": False,
    },
    "language": {"default_fp_fusion": True, "fp32_default": None},
}
# Compile options pinned per backend: CUDAOptions reads $PTXAS_OPTIONS into its default when
# Triton is imported, so the knob above cannot reset it; an empty string means no extra options.
PINNED_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"ptx_options": ""}, "hip": {}}

# Entries guarded beside the table's own (every family, both kernels, bf16): borrowed head dims
# (80: the d96 row, Phi-2's; 40 and 200: odd multiples of 8 on the d64 and d256 rows, 200 with
# sm90's own forward tiles) and the value-head-dim pair (192, 128: MLA, the d256 row).
GUARDED_BORROWED_HEAD_DIMS = (80, 40, 200)
GUARDED_PAIRS = ((192, 128),)
GUARDED_DTYPES = ("bf16",)


def guarded_entries(family: str) -> list[Entry]:
    """Every entry of ``family`` whose machine code golden/ records: the table's, then the
    borrowed head dims and value-head-dim pairs above."""
    entries = select_entries([family])
    entries += select_entries([family], head_dims=GUARDED_BORROWED_HEAD_DIMS, dtypes=GUARDED_DTYPES)
    for head_dim, head_dim_v in GUARDED_PAIRS:
        entries += select_entries([family], None, [head_dim], GUARDED_DTYPES, head_dim_v)
    return entries


# ----------------------------------------------------------------------------- compile inputs


def code_env_vars() -> list[str]:
    """The environment variables set now that Triton's compiler reads and that change the code
    it makes (Triton's own list: those in its cache key), e.g. ``DISABLE_MMA_V3``,
    ``DISABLE_LLVM_OPT``, ``TRITON_DEFAULT_FP_FUSION``."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
    except ImportError:  # pragma: no cover - every supported Triton has it
        return []
    return sorted(get_cache_invalidating_env_vars())


@contextlib.contextmanager
def pinned_knobs(cache_dir: str) -> Iterator[None]:
    """Triton settings that change the code are pinned to their defaults (whatever the
    environment says: the variables of :func:`code_env_vars` are unset meanwhile, the knobs of
    :data:`PINNED_KNOBS` set), line info is off, and every compile is fresh, into
    ``cache_dir``. The environment is restored afterwards."""
    from triton import knobs

    pinned = dict(PINNED_KNOBS, cache={"dir": cache_dir})
    with contextlib.ExitStack() as stack:
        stack.enter_context(unset_env(code_env_vars()))
        for group_name, settings in pinned.items():
            group = getattr(knobs, group_name)
            stack.enter_context(group.scope())
            for name, value in settings.items():
                setattr(group, name, value)
        yield


def specialize(launch: Launch, backend: Any) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for ``ASTSource``, as Triton's JIT builds them."""
    from triton._C.libtriton import native_specialize_impl

    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int], list] = {}
    for i, kp in enumerate(launch.fn.params):
        value = launch.args[kp.name]
        if kp.is_constexpr:
            signature[kp.name], constexprs[kp.name] = "constexpr", value
            continue
        flags = (kp.is_const, not kp.do_not_specialize, not kp.do_not_specialize_on_alignment)
        ty, spec = native_specialize_impl(backend, value, *flags)
        if isinstance(kp.annotation_type, str) and kp.annotation_type:
            ty = kp.annotation_type
            if ty == "u1" or ty[:2] in ("fp", "bf") or kp.do_not_specialize:
                spec = None
        signature[kp.name] = ty
        if ty == "constexpr":
            constexprs[kp.name] = spec
        elif isinstance(spec, str):
            attrs[(i,)] = backend.parse_attr(spec)
    return signature, constexprs, attrs


def option_fields(backend: Any) -> set[str]:
    """The compile options ``backend`` takes."""
    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions

    options = HIPOptions if backend.target.backend == "hip" else CUDAOptions
    return {f.name for f in fields(options)}


def compile_source(launch: Launch, backend: Any) -> tuple[Any, dict[str, Any]]:
    """The ``ASTSource`` (``GluonASTSource`` for a Gluon kernel) and the compile options of one
    recorded launch, exactly as the compile check hands them to ``triton.compile``."""
    from triton.compiler import ASTSource

    unknown = set(launch.options) - option_fields(backend)
    if unknown:
        target = backend.target.backend
        raise ValueError(f"launch options {sorted(unknown)} are not {target} options")
    signature, constexprs, attrs = specialize(launch, backend)
    if launch.fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    options = dict(launch.options, debug=False, **PINNED_OPTIONS[backend.target.backend])
    return ASTSource(launch.fn, signature, constexprs, attrs), options
