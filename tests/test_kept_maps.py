"""portattn.kernels.kept_maps: a direct launch of a kernel that takes host descriptors passes
the TMA maps Triton 3.6's launcher wrapper would make, kept per what they encode (issue 37
item 3). CPU: the installed Triton's own wrapper around a recording launch, with its map
maker counted; the GPU tests of the decode (tests/test_decode_ws.py, tests/test_kvcache*.py)
launch through it."""

from __future__ import annotations

import pytest
import torch
import triton

from portattn.kernels import kept_maps, launcher
from portattn.kernels.descriptors import HostDescriptor, host_descriptor
from portattn.kernels.plan import KernelLaunch

pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402

from tests.test_launcher import Jit  # noqa: E402
from tests.test_launcher import fake_device as fake_device  # noqa: E402  (a fixture)

TRITON_36 = triton.__version__.startswith("3.6.")
SIGNATURE = {"x": "tensordesc<bf16[1,1,64,1,64]>", "n": "i32", "scale": "fp32",
             "BLOCK": "constexpr", "EXTRA": "constexpr"}  # fmt: skip
META = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [1, 1, 64, 1, 64],
        "fp4_padded": False}  # fmt: skip


class WrappedLaunch:
    """A compiled kernel's launcher as Triton 3.6's ``CudaLauncher``: its ``launch`` is the
    installed Triton's descriptor wrapper around a launch that records its arguments."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.launch = nvidia_driver.wrap_handle_tensordesc(self.record, SIGNATURE, [META])
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid = self.launch_pdl = False

    def record(self, *args):
        self.calls.append(args)

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, False, False, None, None, *args)


@pytest.fixture
def maps_made(monkeypatch):
    """The installed wrapper's map maker, counting its calls and returning the map's inputs."""
    made = []

    def make(desc, meta, *rest):
        made.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape), meta["swizzle"]),
                *desc.shape, *desc.strides]  # fmt: skip

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", make)
    kept_maps.forget_maps()
    yield made
    kept_maps.forget_maps()


def launches(jit: Jit, tensors):
    """A kept template's binds of ``tensors`` in turn; returns the template
    (``forward_replay.LaunchTemplate``)."""
    from portattn.forward_replay import LaunchTemplate, tensor_indexes

    planned = KernelLaunch("fwd", jit, (8, 2), (tensors[0], 32, 0.5), dict(BLOCK=64),
                           descriptors=(HostDescriptor(0, 64),))  # fmt: skip
    template = LaunchTemplate.record(planned, tensor_indexes((tensors[0],)))
    for t in tensors:
        launcher.launch_kernel(template.bind((t,)))
    return template


@pytest.mark.triton_version
def test_raw_launch_only_for_the_36_wrapper():
    """The wrapper's layout is Triton 3.6's (its closure): other versions keep the wrapper."""
    raw = kept_maps.raw_launch_of(WrappedLaunch())
    assert (raw is not None) == TRITON_36
    if raw is not None:
        assert raw.metas == {0: META} and not raw.cooperative and not raw.pdl
    scratch = WrappedLaunch()
    scratch.global_scratch_size = 128  # a kernel with global scratch: the wrapper's way
    assert kept_maps.raw_launch_of(scratch) is None
    flagless = WrappedLaunch()
    del flagless.launch_pdl  # a launcher without 3.6's launch flags: the wrapper's way
    assert kept_maps.raw_launch_of(flagless) is None
    assert kept_maps.raw_launch_of(lambda *args: None) is None


@pytest.mark.skipif(not TRITON_36, reason="the maps are kept for Triton 3.6's launcher only")
@pytest.mark.parametrize("keep", [True, False])
def test_direct_launch_passes_the_wrappers_maps(fake_device, maps_made, monkeypatch, keep):
    """Direct launches (a template's third bind on) pass what the wrapper passes for the
    call's own tensor, with the map made once per address, strides and tiles while kept."""
    monkeypatch.setattr(launcher, "KEPT_MAPS", keep)
    jit = Jit()
    jit.compiled.run = WrappedLaunch()
    x, y, z = (torch.full((64, 2, 64), float(i), dtype=torch.bfloat16) for i in range(3))
    template = launches(jit, (x, x, y, y, z, y))
    assert len(jit.jit_calls) == 1 and (template.direct[0].raw is not None) == keep
    calls = jit.compiled.run.calls  # the kept kernel's (x), then the direct ones
    assert [c[13][1] for c in calls] == [t.data_ptr() for t in (x, y, y, z, y)]
    # what the wrapper passes for y, through the same launcher
    expect = WrappedLaunch()
    expect(8, 2, 1, 1234, "function", "packed", None, None, None,
           host_descriptor(y, HostDescriptor(0, 64)), 32, 0.5, 64, 7)  # fmt: skip
    assert calls[1] == calls[2] == calls[4] == expect.calls[0]
    # made: x at the kept kernel's launch; then y, z once each where kept, else every launch
    want = [x, y, z] if keep else [x, y, y, z, y]
    assert maps_made[:-1] == [t.data_ptr() for t in want]  # the last one: `expect`'s


@pytest.mark.skipif(not TRITON_36, reason="the maps are kept for Triton 3.6's launcher only")
def test_kept_maps_follow_strides_and_tiles(fake_device, maps_made):
    """A view with other strides at the same address, or another tile, is another map."""
    jit = Jit()
    jit.compiled.run = WrappedLaunch()
    base = torch.ones(64, 4, 64, dtype=torch.bfloat16)
    launches(jit, (base[:, :2], base[:, :2], base[:, :2], base[:, ::2]))
    assert len(maps_made) == 3  # kept kernel's launch, direct of [:, :2], direct of [:, ::2]
    assert kept_maps.kept_maps() == 2
    raw = kept_maps.raw_launch_of(WrappedLaunch())
    raw.expanded(base[:, :2], HostDescriptor(0, 32))  # another tile: another map
    assert kept_maps.kept_maps() == 3
