"""Launch a planned kernel with less host work than ``kernel[grid](...)`` (issue 37 item 3).

Triton's ``JITFunction.run`` does, on every call: read its debug knobs, bind the arguments and
specialise each one (its binder), turn the specialisation and the options into a cache key
(``str`` of the options), find the compiled kernel, check the kernel's globals, build the
launch metadata, and call the compiled kernel's launcher. Here the compiled kernel that ``run``
returned the first time is kept per **launch signature**, and later calls with that signature
go straight to its launcher with the values ``run`` would pass (every signature parameter in
order: the positional arguments, then each keyword's value or the default).

A launch signature holds everything Triton's choice of compiled kernel depends on, made finer:
the JIT function, the current device, the debug knobs, the keywords' names, every value's type,
the values that are not tensors as they are (a new int is a new signature, which ``run`` serves
once), and the tensors' dtypes and whether each address is a multiple of 16 (Triton's
alignment specialisation). The first call of a signature goes through ``run``, which compiles
or finds the kernel, so a kept kernel is always one ``run`` picked for an equal signature. An
unhashable value, or the interpreter, takes ``run`` every time.

A launch bound from a kept template (``forward_replay.LaunchTemplate``: the same kernel, grid
and values but for its tensors, call after call) goes further once its signature's kernel is
kept: a :class:`DirectLaunch` in the template's cell holds the launcher's values with the
tensors left out, and each call puts in the tensors' addresses, checked for what the signature
held of them (dtype, 16-byte alignment), with the current device and knobs. Addresses go to the
launcher as ints: it then neither calls ``data_ptr`` nor asks the driver about each pointer
(the checks before launch have put every tensor on the device).

A launch whose kernel takes some tensors as ragged host descriptors (``KernelLaunch.descriptors``)
keeps them as tensors in its signature (with which ones and their tiles' rows); the descriptors
are made from the call's tensors right before the launcher is called, on every path. A direct
launch under Triton 3.6 passes, instead, the TMA maps its launcher's wrapper would encode from
them, kept by what they encode (``kept_maps``: a decode loop's cache is one map call after call).

The kernels are module-level objects, never freed: tables here know them by ``id``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from portattn.kernels.descriptors import HostDescriptor, host_descriptor, with_descriptors
from portattn.kernels.kept_maps import RawLaunch, raw_launch_of

if TYPE_CHECKING:
    from portattn.kernels.plan import KernelLaunch

# Off only for tests and measurements: every launch then goes through ``kernel[grid](...)``.
PREPARED_LAUNCHES = True
# Off only for tests and measurements: direct launches then make their descriptors per call
# and pass them through the compiled launcher's wrapper (kept_maps).
KEPT_MAPS = True

Picker = Callable[[tuple], tuple]


def _picker(positions: list[int]) -> Picker:
    """``values -> tuple(values[i] for i in positions)``, at C speed."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda values: (values[only],)
    return lambda values: ()


@dataclass(frozen=True)
class _Template:
    """One kernel's launches with one sequence of value types and keywords: where the
    tensors are (their dtypes and addresses go into the signature, the other values as they
    are) and how the launcher's values are gathered."""

    tensors_in_args: Picker
    others_in_args: Picker
    tensors_in_params: Picker
    others_in_params: Picker
    # the signature parameters after the positional ones: their positions among the keywords'
    # values (None: some take their default, ``tail_defaults``)
    tail: Picker | None
    tail_names: tuple[str, ...]
    tail_defaults: dict[str, Any]


def _make_template(jit: Any, arg_types: tuple, names: tuple, param_types: tuple) -> _Template:
    def split(types: tuple) -> tuple[Picker, Picker]:
        is_tensor = [issubclass(t, torch.Tensor) for t in types]
        tensors = [i for i, yes in enumerate(is_tensor) if yes]
        return _picker(tensors), _picker([i for i, yes in enumerate(is_tensor) if not yes])

    params = jit.params  # Triton's KernelParam list, in signature order
    tail = params[len(arg_types) :]
    tail_names = tuple(p.name for p in tail)
    defaults = {p.name: p.default for p in tail if p.has_default and p.name not in names}
    at = {name: i for i, name in enumerate(names)}
    picker = _picker([at[n] for n in tail_names]) if set(tail_names) <= set(at) else None
    return _Template(*split(arg_types), *split(param_types), picker, tail_names, defaults)


@dataclass(frozen=True)
class _Prepared:
    """A compiled kernel found by ``run`` for one signature, with what its launcher takes."""

    compiled: Any
    launcher: Any
    function: Any
    packed_metadata: Any


_TEMPLATES: dict[tuple, _Template] = {}
_KEPT: dict[tuple, _Prepared] = {}
_KEPT_MAX = 4096  # signatures; past it, start again (a run of many pack shapes)
# Bumped whenever _KEPT is emptied: a direct launch made before holds a kernel no longer kept.
_generation = [0]


def kept_launches() -> int:
    """How many signatures have a kept kernel."""
    return len(_KEPT)


def forget_launches() -> None:
    """Drop every kept kernel: the next launch of each signature goes through ``run``."""
    _KEPT.clear()
    _generation[0] += 1


@dataclass(frozen=True)
class DirectLaunch:
    """A kept launch of a template's binds (module docstring): the launcher's values with a
    placeholder at each tensor, and what the kept signature held of the tensors and the
    launch's surroundings, checked call by call."""

    prepared: _Prepared
    grid: tuple[int, int, int]
    values: tuple  # every signature parameter's value, the tensors' positions hold None
    positions: tuple[int, ...]  # the tensors' positions among the launch's args (and values)
    pick: Picker  # args -> the tensors, in positions' order
    dtypes: tuple
    aligned: bool | tuple[bool, ...]  # as the signature holds it: True, or each address's
    device: int
    knobs: tuple  # run's options read from Triton's knobs
    generation: int
    descriptors: tuple[HostDescriptor, ...] = ()  # the launch's (KernelLaunch.descriptors)
    raw: RawLaunch | None = None  # with descriptors: their maps kept (kept_maps)

    def run(self, args: tuple, knobs: Any) -> bool:
        """Launch with ``args`` (a bind of the template: its tensors at ``positions``, its
        other values those kept); False, launching nothing, where the kept signature does not
        hold (:meth:`values_for`). ``knobs``: Triton's."""
        values = self.values_for(self.pick(args), knobs)
        if values is None:
            return False
        self.launch(values, knobs)
        return True

    def values_for(self, tensors: tuple, knobs: Any) -> list | None:
        """The launcher's values with ``tensors`` (in ``positions``' order) put in as their
        addresses, or None where the kept signature does not hold for them: another dtype or
        alignment, another current device or knobs, a launch hook, a forgotten kernel, an
        object that is no tensor."""
        if self.generation != _generation[0] or self.knobs != _knob_values(knobs):
            return None
        enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if not (_empty(enter) and _empty(exit_)):  # a hook wants the launch's metadata
            return None
        try:
            addresses = tuple(map(torch.Tensor.data_ptr, tensors))
            dtypes = tuple(map(_DTYPE, tensors))
        except TypeError:  # None or another object where the template had a tensor
            return None
        if dtypes != self.dtypes or alignment(addresses) != self.aligned:
            return None
        if driver_device() != self.device:
            return None
        values = list(self.values)
        for position, address in zip(self.positions, addresses, strict=True):
            values[position] = address
        if not self.descriptors:
            return values
        # those tensors go as their descriptors, not as addresses
        at = dict(zip(self.positions, tensors, strict=True))
        if self.raw is None:
            for spec in self.descriptors:
                values[spec.position] = host_descriptor(at[spec.position], spec)
            return values
        expanded, start = [], 0  # as the launcher's wrapper expands them, maps kept
        for spec in self.descriptors:  # in position order (ragged_arguments')
            expanded += values[start : spec.position]
            expanded += self.raw.expanded(at[spec.position], spec)
            start = spec.position + 1
        expanded += values[start:]
        return expanded

    def launch(self, values: list, knobs: Any) -> None:
        """Launch on the current stream with ``values`` (:meth:`values_for`'s)."""
        kept, grid, raw = self.prepared, self.grid, self.raw
        stream = driver_stream(self.device)
        if raw is not None:  # the compiled module's launch, as the launcher calls it
            raw.launch(grid[0], grid[1], grid[2], stream, kept.function, raw.cooperative, raw.pdl,
                       None, None, kept.packed_metadata, None, None, None, *values)  # fmt: skip
            return
        kept.launcher(grid[0], grid[1], grid[2], stream, kept.function, kept.packed_metadata,
                      None, None, None, *values)  # fmt: skip


def launch_all(launches: list[tuple[DirectLaunch, tuple]]) -> bool:
    """Launch each (direct launch, its tensors) in order when every one's kept signature
    holds (:meth:`DirectLaunch.values_for`); else launch nothing and return False."""
    from triton import knobs

    ready = []
    for direct, tensors in launches:
        values = direct.values_for(tensors, knobs)
        if values is None:
            return False
        ready.append((direct, values))
    for direct, values in ready:
        direct.launch(values, knobs)
    return True


def _knob_values(knobs: Any) -> tuple:
    """What ``run`` reads of Triton's knobs for its options (part of a launch signature)."""
    return (knobs.runtime.debug, knobs.compilation.instrumentation_mode)


def _direct_launch(launch: KernelLaunch, key: tuple, template: _Template) -> DirectLaunch:
    """The direct launch of ``launch``, whose signature ``key`` has a kept kernel."""
    args, params = launch.args, launch.params
    positions = tuple(i for i, value in enumerate(args) if isinstance(value, torch.Tensor))
    values = list(launcher_values(template, args, params, tuple(params.values())))
    for position in positions:
        values[position] = None
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    _, device, debug, instrumentation, _, _, dtypes, aligned = key
    prepared = _KEPT[key]
    descriptors = tuple(sorted(launch.descriptors))  # by position
    raw = raw_launch_of(prepared.launcher) if descriptors and KEPT_MAPS else None
    return DirectLaunch(prepared, grid, tuple(values), positions, _picker(list(positions)),
                        dtypes, aligned, device, (debug, instrumentation),
                        _generation[0], descriptors, raw)  # fmt: skip


def launch_kernel(launch: KernelLaunch) -> None:
    """``launch.kernel[launch.grid](*launch.args, **launch.params)``, through the kept
    compiled kernel of its signature when there is one."""
    from triton import knobs

    jit, args, params = launch.kernel, launch.args, launch.params
    if not PREPARED_LAUNCHES or not hasattr(jit, "device_caches"):  # the interpreter's
        jit[launch.grid](*with_descriptors(args, launch.descriptors), **params)
        return
    cell = launch.direct  # the template's, for a launch bound from one
    if cell and cell[0].run(args, knobs):
        return
    device, stream = device_and_stream()
    values = tuple(params.values())
    try:
        key, template = launch_signature(jit, device, args, params, values, knobs,
                                         launch.descriptors)
        kept = _KEPT.get(key)
    except TypeError:  # an unhashable value
        key = kept = None
    kernel_args = with_descriptors(args, launch.descriptors)  # what the kernel takes
    if kept is None:
        compiled = jit[launch.grid](*kernel_args, **params)
        if key is not None and compiled is not None and hasattr(compiled, "packed_metadata"):
            if len(_KEPT) >= _KEPT_MAX:
                forget_launches()
            _KEPT[key] = _Prepared(compiled, compiled.run, compiled.function,
                                   compiled.packed_metadata)
        return
    if cell is not None and not any(isinstance(v, torch.Tensor) for v in values):
        cell[:] = [_direct_launch(launch, key, template)]  # the template's next binds
    everything = launcher_values(template, kernel_args, params, values)
    grid = launch.grid
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _empty(enter) and _empty(exit_):  # run would build metadata nobody reads, call nothing
        enter = exit_ = metadata = None
    else:
        metadata = kept.compiled.launch_metadata(grid, stream, *everything)
    kept.launcher(grid[0], grid_1, grid_2, stream, kept.function, kept.packed_metadata,
                  metadata, enter, exit_, *everything)


def _empty(hook: Any) -> bool:
    """No launch hook: None, or Triton's hook chain (>= 3.4, always set) with no hook in it."""
    return hook is None or getattr(hook, "calls", None) == []


def launcher_values(template: _Template, args: tuple, params: dict, values: tuple) -> tuple:
    """What ``run`` passes the launcher after its handles: every signature parameter in order
    (Triton's binder: the positional arguments, then each keyword's value or the default)."""
    if template.tail is not None:
        return args + template.tail(values)
    defaults = template.tail_defaults
    return args + tuple(params[n] if n in params else defaults[n] for n in template.tail_names)


def device_and_stream() -> tuple[int, int]:
    """Triton's current device and its current stream, as ``run`` reads them."""
    device = driver_device()
    return device, driver_stream(device)


def driver_device() -> int:
    from triton.runtime.driver import driver

    return driver.active.get_current_device()


def driver_stream(device: int) -> int:
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(device)


def launch_signature(
    jit: Any,
    device: int,
    args: tuple,
    params: dict,
    values: tuple,
    knobs: Any,
    descriptors: tuple[HostDescriptor, ...] = (),
) -> tuple[tuple, _Template]:
    """The launch signature (module docstring) of ``kernel[grid](*args, **params)``, whose
    keywords' values are ``values``, with its template; ``descriptors``: the tensors of
    ``args`` that go as ragged descriptors (``KernelLaunch.descriptors``)."""
    arg_types = tuple(map(type, args))
    param_types = tuple(map(type, values))
    shape = (id(jit), arg_types, tuple(params), param_types, descriptors)
    template = _TEMPLATES.get(shape)
    if template is None:
        template = _TEMPLATES[shape] = _make_template(jit, arg_types, shape[2], param_types)
    tensors = template.tensors_in_args(args) + template.tensors_in_params(values)
    addresses = tuple(map(torch.Tensor.data_ptr, tensors))
    key = (
        shape,
        device,
        knobs.runtime.debug,  # run's options
        knobs.compilation.instrumentation_mode,
        template.others_in_args(args),
        template.others_in_params(values),
        tuple(map(_DTYPE, tensors)),
        alignment(addresses),
    )
    return key, template


_DTYPE = operator.attrgetter("dtype")


def alignment(addresses: tuple[int, ...]) -> bool | tuple[bool, ...]:
    """Triton's alignment specialisation of pointer arguments, as a signature holds it: True
    when every address is a multiple of 16, else whether each one is."""
    if not functools.reduce(operator.or_, addresses, 0) % 16:
        return True
    return tuple(a % 16 == 0 for a in addresses)
