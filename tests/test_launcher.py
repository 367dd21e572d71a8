"""portattn.kernels.launcher: planned launches through the kept compiled kernel of their
signature (issue 37 item 3). CPU: the signature and the launcher's arguments, with a stand-in
JIT function, and the argument order against the real kernels' signatures; the GPU tests
(test_gpu and the rest) run every launch through it."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from triton import knobs
from triton.runtime.jit import KernelParam

from portattn.kernels import launcher
from portattn.kernels.descriptors import HostDescriptor, with_descriptors
from portattn.kernels.plan import KernelLaunch
from portattn.tools import compile_launches
from portattn.tools.compile_launches import Entry


class Param:
    def __init__(self, name: str, constexpr: bool = False, default=inspect.Parameter.empty):
        self.name, self.is_constexpr, self.default = name, constexpr, default
        self.has_default = default is not inspect.Parameter.empty


class Compiled:
    """A compiled kernel's launcher, recording its calls."""

    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.calls: list[tuple] = []

    def run(self, *call):
        self.calls.append(call)

    def launch_metadata(self, grid, stream, *values):
        return None


class Jit:
    """A JIT function: ``kernel[grid](...)`` records the call and returns its compiled kernel."""

    device_caches: dict = {}
    params = [Param("x"), Param("n"), Param("scale"), Param("BLOCK", True), Param("EXTRA", True, 7)]

    def __init__(self):
        self.compiled = Compiled()
        self.jit_calls: list[tuple] = []

    def __getitem__(self, grid):
        def run(*args, **params):
            self.jit_calls.append((grid, args, params))
            return self.compiled

        return run


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr(launcher, "driver_device", lambda: 0)
    monkeypatch.setattr(launcher, "driver_stream", lambda device: 1234)
    launcher.forget_launches()
    yield
    launcher.forget_launches()


def test_second_launch_calls_the_kept_launcher(fake_device):
    jit, x = Jit(), torch.ones(64)
    planned = KernelLaunch("fwd", jit, (8, 2), (x, 32, 0.5), dict(BLOCK=64, num_warps=4))
    launcher.launch_kernel(planned)
    assert len(jit.jit_calls) == 1 and jit.compiled.calls == []
    launcher.launch_kernel(planned)
    assert len(jit.jit_calls) == 1
    # grid padded to 3, the stream, the kernel's handles, no metadata and no hook (Triton's
    # chains are empty), then every signature parameter in order (the default for EXTRA), no
    # launch option
    expected = (8, 2, 1, 1234, "function", "packed", None, None, None, x, 32, 0.5, 64, 7)
    assert len(jit.compiled.calls) == 1
    call = jit.compiled.calls[0]
    assert call[:9] == expected[:9] and call[9] is x and call[10:] == expected[10:]


@pytest.mark.parametrize(
    "change",
    [
        "misaligned tensor",
        "dtype",
        "int not divisible by 16",
        "int 1",
        "wide int",
        "constexpr",
        "launch option",
    ],
)
def test_signature_changes_take_triton_run(fake_device, change):
    """What Triton specialises on gives a new signature: the launch goes through ``run``."""
    jit, x = Jit(), torch.ones(64)
    args, params = (x, 32, 0.5), dict(BLOCK=64, num_warps=4)
    launcher.launch_kernel(KernelLaunch("fwd", jit, (1,), args, params))
    if change == "misaligned tensor":
        args = (x[1:], 32, 0.5)
    elif change == "dtype":
        args = (x.half(), 32, 0.5)
    elif change == "int not divisible by 16":
        args = (x, 33, 0.5)
    elif change == "int 1":
        args = (x, 1, 0.5)
    elif change == "wide int":
        args = (x, 2**33, 0.5)
    elif change == "constexpr":
        params = dict(BLOCK=128, num_warps=4)
    else:
        params = dict(BLOCK=64, num_warps=8)
    launcher.launch_kernel(KernelLaunch("fwd", jit, (1,), args, params))
    assert len(jit.jit_calls) == 2 and jit.compiled.calls == []


def test_a_launch_hook_gets_its_metadata(fake_device):
    """With a hook in Triton's enter chain (``host_checks.checks_at_launch``), the launcher
    gets the chains and the metadata, as from ``run``."""
    jit, x = Jit(), torch.ones(64)
    planned = KernelLaunch("fwd", jit, (8,), (x, 32, 0.5), dict(BLOCK=64))
    launcher.launch_kernel(planned)
    chain = knobs.runtime.launch_enter_hook

    def hook(metadata):
        pass

    chain.add(hook)
    try:
        jit.compiled.launch_metadata = lambda grid, stream, *values: ("metadata", grid)
        launcher.launch_kernel(planned)
    finally:
        chain.remove(hook)
    call = jit.compiled.calls[0]
    assert call[6] == ("metadata", (8,)) and call[7] is chain
    assert call[8] is knobs.runtime.launch_exit_hook


def test_same_signature_other_values_keep_the_kernel(fake_device):
    """Another tensor of the same dtype and alignment: the kept kernel, with the new tensor;
    another int or float value is a new signature (finer than Triton's), served by ``run``."""
    jit = Jit()
    launcher.launch_kernel(
        KernelLaunch("fwd", jit, (1,), (torch.ones(64), 32, 0.5), dict(BLOCK=64))
    )
    y = torch.zeros(128)
    launcher.launch_kernel(KernelLaunch("fwd", jit, (1,), (y, 32, 0.5), dict(BLOCK=64)))
    assert len(jit.jit_calls) == 1
    assert jit.compiled.calls[0][9] is y and jit.compiled.calls[0][10:] == (32, 0.5, 64, 7)
    launcher.launch_kernel(KernelLaunch("fwd", jit, (1,), (y, 48, 0.5), dict(BLOCK=64)))
    launcher.launch_kernel(KernelLaunch("fwd", jit, (1,), (y, 32, 0.25), dict(BLOCK=64)))
    assert len(jit.jit_calls) == 3


def test_unknown_argument_type_and_switch_take_triton_run(fake_device, monkeypatch):
    jit = Jit()
    odd = KernelLaunch("fwd", jit, (1,), ([1, 2], 32, 0.5), dict(BLOCK=64))  # a list: no key
    for _ in range(2):
        launcher.launch_kernel(odd)
    assert len(jit.jit_calls) == 2 and jit.compiled.calls == []
    monkeypatch.setattr(launcher, "PREPARED_LAUNCHES", False)
    plain = KernelLaunch("fwd", jit, (1,), (torch.ones(64), 32, 0.5), dict(BLOCK=64))
    for _ in range(2):
        launcher.launch_kernel(plain)
    assert len(jit.jit_calls) == 4 and jit.compiled.calls == []


def bound_launches(jit, x, n=32, direct=None):
    """A template's bind: one cell shared by its launches (``forward_replay.LaunchTemplate``)."""
    return KernelLaunch("fwd", jit, (8, 2), (x, n, 0.5), dict(BLOCK=64, num_warps=4),
                        direct=direct)  # fmt: skip


def test_template_binds_launch_direct_with_addresses(fake_device):
    """From a template's third bind on (the first compiles, the second finds the kept kernel
    and makes the direct launch), the launcher gets the tensors' addresses as ints and the
    values ``run`` would pass otherwise."""
    jit, cell = Jit(), []
    x, y = torch.ones(64), torch.zeros(64)
    launcher.launch_kernel(bound_launches(jit, x, direct=cell))
    assert cell == [] and len(jit.jit_calls) == 1
    launcher.launch_kernel(bound_launches(jit, x, direct=cell))
    assert len(cell) == 1 and jit.compiled.calls[0][9] is x
    launcher.launch_kernel(bound_launches(jit, y, direct=cell))
    assert len(jit.jit_calls) == 1 and len(jit.compiled.calls) == 2
    call = jit.compiled.calls[1]
    assert call == (8, 2, 1, 1234, "function", "packed", None, None, None, y.data_ptr(), 32,
                    0.5, 64, 7)  # fmt: skip


def test_descriptor_arguments_go_as_descriptors_on_every_path(fake_device):
    """A launch naming a tensor as a ragged descriptor (``KernelLaunch.descriptors``): Triton's
    run, the kept launcher and the direct launch all get a descriptor of the call's own tensor
    there (made at the launch), while the signature keys on the tensor (its dtype and
    alignment), so the kept and direct paths apply."""
    from portattn.forward_replay import LaunchTemplate, tensor_indexes

    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    jit = Jit()
    x, y = torch.ones(64, 2, 64, dtype=torch.bfloat16), torch.zeros(64, 2, 64, dtype=torch.bfloat16)
    planned = KernelLaunch("fwd", jit, (8, 2), (x, 32, 0.5), dict(BLOCK=64, num_warps=4),
                           descriptors=(HostDescriptor(0, 64),))  # fmt: skip
    template = LaunchTemplate.record(planned, tensor_indexes((x,)))  # a forward replay's
    for t in (x, x, y):
        launcher.launch_kernel(template.bind((t,)))
    first = jit.jit_calls[0][1][0]  # through run
    kept, direct = (call[9] for call in jit.compiled.calls)  # the kept kernel, then direct
    assert len(jit.jit_calls) == 1 and len(template.direct) == 1
    assert all(d.base is t for d, t in zip((first, kept, direct), (x, x, y), strict=True))
    assert all(list(d.block_shape) == [1, 1, 64, 1, 64] for d in (first, kept, direct))
    # without the descriptors the same tensors are another signature
    launcher.launch_kernel(KernelLaunch("fwd", jit, (8, 2), (x, 32, 0.5),
                                        dict(BLOCK=64, num_warps=4)))  # fmt: skip
    assert len(jit.jit_calls) == 2 and jit.jit_calls[1][1][0] is x


@pytest.mark.parametrize(
    "change", ["misaligned", "dtype", "none", "forgotten", "device", "hook", "debug knob"]
)
def test_direct_launch_falls_back_where_the_signature_does_not_hold(
    fake_device, monkeypatch, change
):
    """What the kept signature held and a bind may change: the launch goes the checked way
    (through ``run`` for a new signature, else the kept kernel with the tensor itself)."""
    jit, cell, x = Jit(), [], torch.ones(64)
    for _ in range(2):
        launcher.launch_kernel(bound_launches(jit, x, direct=cell))
    assert len(cell) == 1
    arg, runs, hook = x, 2, None
    if change == "misaligned":
        arg = x[1:]
    elif change == "dtype":
        arg = x.half()
    elif change == "none":
        arg = None
    elif change == "forgotten":
        launcher.forget_launches()
    elif change == "device":
        monkeypatch.setattr(launcher, "driver_device", lambda: 1)
    elif change == "debug knob":
        monkeypatch.setattr(knobs.runtime, "debug", True)
    else:
        hook = knobs.runtime.launch_enter_hook
        jit.compiled.launch_metadata = lambda grid, stream, *values: "metadata"
        hook.add(print)
        runs = 1
    try:
        launcher.launch_kernel(bound_launches(jit, arg, direct=cell))
    finally:
        if hook is not None:
            hook.remove(print)
    if runs == 2:  # a new signature: run
        assert len(jit.jit_calls) == 2 and len(jit.compiled.calls) == 1
    else:  # the kept kernel, with the hook's metadata and the tensor
        call = jit.compiled.calls[-1]
        assert len(jit.jit_calls) == 1 and call[6] == "metadata" and call[9] is x


def test_launch_directly_launches_all_or_none(fake_device):
    """``forward_replay.launch_directly``: a template's launches go direct, each with its own
    tensors of the call, when every one's kept signature holds; when one does not (here the
    second's tensor is misaligned), none is launched and the caller takes the checked way."""
    from portattn.forward_replay import LaunchTemplate, launch_directly, tensor_indexes

    first, second = Jit(), Jit()
    x, y = torch.ones(64), torch.ones(64)
    templates = []
    for jit, tensor in ((first, x), (second, y)):
        planned = KernelLaunch("fwd", jit, (4,), (tensor, 32, 0.5), dict(BLOCK=64))
        templates.append(LaunchTemplate.record(planned, tensor_indexes((x, y))))
    assert not launch_directly(tuple(templates), (x, y))  # no direct launch yet
    for _ in range(2):  # run, then the kept kernel: the direct launches are made
        for template in templates:
            launcher.launch_kernel(template.bind((x, y)))
    assert all(len(t.direct) == 1 for t in templates)
    a, b = torch.zeros(64), torch.zeros(64)
    assert launch_directly(tuple(templates), (a, b))
    assert first.compiled.calls[-1][9] == a.data_ptr()
    assert second.compiled.calls[-1][9] == b.data_ptr()
    calls = (len(first.compiled.calls), len(second.compiled.calls))
    assert not launch_directly(tuple(templates), (a, torch.zeros(65)[1:]))
    assert (len(first.compiled.calls), len(second.compiled.calls)) == calls


_AS_JIT: dict = {}  # kept alive: the launcher knows a kernel by its id


def as_jit(fn) -> SimpleNamespace:
    """The parameters a ``JITFunction`` of ``fn`` has (its ``__init__``'s own construction):
    under the interpreter the kernels are interpreted functions."""
    if fn not in _AS_JIT:
        sig = inspect.signature(fn).parameters.values()
        params = [KernelParam(i, p, False, False) for i, p in enumerate(sig)]
        _AS_JIT[fn] = SimpleNamespace(fn=fn, params=params)
    return _AS_JIT[fn]


@pytest.mark.parametrize(
    "entry",
    [
        Entry("sm90", "varlen", 128, "bf16"),
        Entry("sm90", "fixed_order", 64, "fp16"),
        Entry("cdna3", "varlen", 96, "bf16"),
    ],
)
def test_real_launches_bind_as_triton(entry, monkeypatch):
    """Every launch the planners make (forward, repair passes, backward, decode): the launcher
    gets the values of Python's binding of the kernel's signature (what Triton's binder
    computes) in order, and every argument has a signature key (the kept path applies)."""
    planned: list[tuple] = []

    def capture(stage, fn, args, params, descriptors=()):
        planned.append((fn, args, params, descriptors))
        return SimpleNamespace(stage=stage)

    monkeypatch.setattr(compile_launches, "bind_launch", capture)
    compile_launches.record_launches(entry)
    assert len(planned) >= 5
    for fn, args, params, descriptors in planned:
        jit = fn if hasattr(fn, "params") else as_jit(fn.fn)
        values = tuple(params.values())
        key, template = launcher.launch_signature(jit, 0, args, params, values, knobs,
                                                  descriptors)  # fmt: skip
        hash(key)  # every value has a key: the kept path applies
        kernel_args = with_descriptors(args, descriptors)  # what launch_kernel passes
        everything = launcher.launcher_values(template, kernel_args, params, values)
        kernel_params = {k: v for k, v in params.items() if k in template.tail_names}
        bound = inspect.signature(jit.fn).bind(*kernel_args, **kernel_params)
        bound.apply_defaults()
        assert list(bound.arguments) == [p.name for p in jit.params]
        assert all(a is b for a, b in zip(everything, bound.arguments.values(), strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["varlen", "fixed_order"])
@pytest.mark.parametrize("paged", [False, True])
def test_kept_launches_give_the_bits_of_run(kernel, paged, monkeypatch):
    """On the GPU: the forward (with its repair pass) and backward, and a paged decode, launched
    through kept kernels give ``kernel[grid](...)``'s bits, outputs and gradients."""
    import portattn

    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = [1, 17, 113, 1000]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu, n = cu.cuda(), sum(lengths)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    q, k, v, do = rand(n, 8, 128), rand(n, 2, 128), rand(n, 2, 128), rand(n, 8, 128)

    def training():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = portattn.varlen_attention(*leaves, cu, cu, 1000, 1000, causal=True, kernel=kernel)
        return (out, *torch.autograd.grad(out, leaves, do))

    k_cache, v_cache = rand(64, 64, 2, 128), rand(64, 64, 2, 128)
    table = torch.randperm(64, device="cuda", generator=g).to(torch.int32).view(4, 16)
    seqlens = torch.tensor([5, 64, 300, 1000], dtype=torch.int32, device="cuda")

    def decode():
        return portattn.flash_attn_with_kvcache(
            q[:4, None],
            k_cache,
            v_cache,
            cache_seqlens=seqlens,
            block_table=table,
            causal=True,
            kernel=kernel,
            return_softmax_lse=True,
        )

    run = decode if paged else training
    monkeypatch.setattr(launcher, "PREPARED_LAUNCHES", False)
    expected = run()
    monkeypatch.setattr(launcher, "PREPARED_LAUNCHES", True)
    launcher.forget_launches()
    first = run()  # through run: the kernels are kept
    assert launcher.kept_launches() > 0
    again = run()  # through the kept kernels
    for result in (first, again):
        for want, got in zip(expected, result, strict=True):
            assert torch.equal(want, got)
