"""Kept TMA maps for the direct launches of kernels that take host descriptors (issue 37 item 3:
host time per eager call).

Triton 3.6's compiled launcher turns every host ``TensorDescriptor`` argument into a 128-byte
CUtensorMap on every launch: a Python wrapper (``wrap_handle_tensordesc``'s ``inner``) walks
all the arguments and calls ``make_tensordesc_arg`` (``fill_tma_descriptor``) for each
descriptor, after ``descriptors.host_descriptor`` has made the descriptor object. A decode loop
passes the same cache call after call: the same address, strides and heads, so the same map.
A direct launch (``launcher.DirectLaunch``) of such a kernel keeps each map here by what it
encodes (the tensor's address, dtype, token and head strides, heads and head dim, the
argument's tiles, and the kernel's swizzle, element type and box) and calls the compiled
module's own ``launch`` with the arguments expanded as ``inner`` expands them. A map holds an
address, not the tensor: a map kept for memory freed since encodes what a new tensor at that
address with those strides would get, so a hit is always the map the wrapper would make.

Only where the kept kernel's launcher has Triton 3.6's layout (the wrapper's closure names,
no global or profile scratch, every descriptor lowered to a TMA map): elsewhere
:func:`raw_launch_of` says None and the launch goes through the launcher as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from portattn.kernels.descriptors import HostDescriptor, host_descriptor

_WRAPPER_CELLS = {"launcher", "tensordesc_indices", "tensordesc_meta"}
_MAPS: dict[tuple, tuple] = {}  # (the map's key, see `expanded`) -> (map, *shape, *strides)
_MAPS_MAX = 1024  # past it, start again (a loop over ever new caches)


class RawLaunch(NamedTuple):
    """The compiled module's launch of a kept kernel and what its wrapper added: the
    cooperative and PDL flags, and per descriptor argument (by position) its TMA metadata
    and the part of it a map depends on."""

    launch: Any
    cooperative: bool
    pdl: bool
    metas: dict[int, dict]
    meta_keys: dict[int, tuple]

    def expanded(self, x: Any, spec: HostDescriptor) -> tuple:
        """What the wrapper passes for the tensor ``x`` as ``spec``'s descriptor: (map,
        *shape, *strides), kept by what the map encodes."""
        strides, shape = x.stride(), x.shape
        key = (self.meta_keys[spec.position], spec, x.data_ptr(), x.dtype, strides[-3:],
               shape[-2:])  # fmt: skip
        got = _MAPS.get(key)
        if got is None:
            from triton.backends.nvidia import driver

            made = driver.make_tensordesc_arg(host_descriptor(x, spec), self.metas[spec.position])
            if len(_MAPS) >= _MAPS_MAX:
                _MAPS.clear()
            got = _MAPS[key] = tuple(made)
        return got


def raw_launch_of(run: Any) -> RawLaunch | None:
    """The :class:`RawLaunch` of a compiled kernel's launcher ``run`` (``CompiledKernel.run``)
    where it has Triton 3.6's layout and takes descriptors (module docstring), else None."""
    wrapper = getattr(run, "launch", None)
    code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is None or cells is None or set(code.co_freevars) != _WRAPPER_CELLS:
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    flags = (getattr(run, "launch_cooperative_grid", None), getattr(run, "launch_pdl", None))
    if None in flags:  # not the layout this module knows
        return None
    found = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells), strict=True))
    metas = list(found["tensordesc_meta"])
    positions = sorted(found["tensordesc_indices"])
    if len(metas) != len(positions) or any(not isinstance(m, dict) for m in metas):
        return None  # a descriptor passed as pointer, shape and strides: not a map
    try:
        keys = [(m["swizzle"], m["elem_size"], m["elem_type"], tuple(m["block_size"]),
                 m["fp4_padded"]) for m in metas]  # fmt: skip
    except (KeyError, TypeError):
        return None
    return RawLaunch(found["launcher"], bool(flags[0]), bool(flags[1]),
                     dict(zip(positions, metas, strict=True)),
                     dict(zip(positions, keys, strict=True)))  # fmt: skip


def forget_maps() -> None:
    """Drop every kept map (tests)."""
    _MAPS.clear()


def kept_maps() -> int:
    """How many maps are kept."""
    return len(_MAPS)
