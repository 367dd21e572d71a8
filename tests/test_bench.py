"""``python benchmarks/bench.py`` without a GPU: workloads, FLOP convention, the runner's loop with
fake implementations and timer, and the CLI (the reports: ``tests/test_bench_report.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import bench, peers, timing, workloads
from benchmarks.bench_report import CUDNN, FA4, FA4_DET, FIXED, FLASH, FLEX, TORCH_VARLEN, VARLEN
from benchmarks.peers import Impl
from benchmarks.workloads import Workload

# --- FLOPs ------------------------------------------------------------------------------------


def test_flops_convention():
    full = Workload("w", (100, 300), 4, 4, 64, causal=False)
    fwd = 4 * (100**2 + 300**2) * 64 * 4  # per sequence (not the pack squared), per head
    assert full.flops("fwd") == fwd
    assert full.flops("fwd+bwd") == 3.5 * fwd
    causal = Workload("w", (100, 300), 4, 4, 64, causal=True)
    assert causal.flops("fwd") == fwd / 2
    assert causal.flops("fwd+bwd") == 3.5 * fwd / 2
    gqa = Workload("w", (100, 300), 8, 2, 64, causal=False)  # query heads count, not kv heads
    assert gqa.flops("fwd") == 2 * fwd


# --- workloads --------------------------------------------------------------------------------


def test_default_workloads_cover_every_family():
    ws = workloads.default_workloads()
    names = [w.name for w in ws]
    assert len(names) == len(set(names)), "names must be unique: reports match rows by name"
    assert 10 <= len(ws) <= 12, "a full run must stay within ~6 minutes on an H200"
    for name in (
        "equal 2x8192 h16 d128 causal",
        "equal 2x8192 h16 d128 full",
        "skewed 32k h16 d128 full",
        "skewed 16k h16 d64 full",
        "skewed 32k gqa32/8 d128 causal",
    ):
        assert name in names

    def having(pred) -> list[Workload]:
        return [w for w in ws if pred(w)]

    for pred in (
        lambda w: w.equal and w.lengths == (8192, 8192) and w.head_dim == 128,
        lambda w: w.equal and w.lengths == (8192, 8192) and w.head_dim == 64,
        lambda w: w.equal and (w.n_heads_q, w.n_heads_k) == (32, 8),
        lambda w: not w.equal and sum(w.lengths) == 16384,
        lambda w: not w.equal and sum(w.lengths) == 32768,
        lambda w: not w.equal and (w.n_heads_q, w.n_heads_k, w.head_dim) == (32, 8, 128),
        lambda w: (w.n_heads_q, w.n_heads_k, w.head_dim) == (16, 16, 64),
    ):
        family = having(pred)
        assert family, "a required workload family is missing"
        # every family is timed both causal and full
        assert {w.causal for w in family} == {True, False}
    for w in ws:
        assert w.name.endswith("causal" if w.causal else "full")
        assert (w.n_heads_q, w.n_heads_k) in ((16, 16), (32, 8))
        assert w.head_dim in (64, 128)
        assert w.equal == w.name.startswith("equal")


def test_run_size_is_moderate():
    """Timings of a full run: 2 modes x implementations x 2 passes, about 0.4 s each (FlexAttention
    compiles come on top), so keep well under the ~6 minutes a run may take."""
    # portattn x 2, Flex and torch's varlen_attn; SDPA x 2 on equal packs (FA4 x 2 on top)
    timings = sum(2 * (6 if w.equal else 4) * 2 for w in workloads.default_workloads())
    assert timings * 0.4 < 120


def test_quick_and_filter():
    quick = [w.name for w in workloads.select_workloads(quick=True)]
    assert sorted(quick) == sorted(
        [
            "equal 2x8192 h16 d128 full",
            "equal 2x8192 h16 d128 causal",
            "skewed 32k h16 d128 full",
            "skewed 32k h16 d128 causal",
        ]
    )
    gqa = workloads.select_workloads(patterns=["GQA"])
    assert gqa and all("gqa32/8" in w.name for w in gqa)
    both = workloads.select_workloads(patterns=["d64", "gqa"])
    assert len(both) == len(gqa) + len(workloads.select_workloads(patterns=["d64"]))
    assert [w.name for w in workloads.select_workloads(quick=True, patterns=["causal"])] == [
        n for n in quick if n.endswith("causal")
    ]
    assert workloads.select_workloads(patterns=["no such workload"]) == []


def test_seeds_add_other_skewed_packs():
    """``--seeds 3``: the six skewed workloads again for seeds 1 and 2, other packs of the same
    token count; the default run is unchanged; the probes find them by name."""
    default = workloads.select_workloads()
    seeded = workloads.select_workloads(seeds=3)
    extra = seeded[len(default) :]
    assert seeded[: len(default)] == default and len(extra) == 12
    assert len({w.name for w in seeded}) == len(seeded)
    for w in extra:
        base_name = w.name.replace(" seed1", "").replace(" seed2", "")
        base = next(d for d in default if d.name == base_name)
        assert sum(w.lengths) == sum(base.lengths) and w.lengths != base.lengths
        assert (w.n_heads_q, w.n_heads_k, w.head_dim, w.causal) == (
            base.n_heads_q, base.n_heads_k, base.head_dim, base.causal
        )  # fmt: skip
    assert workloads.named_workloads(["skewed 16k seed2 h16 d64 causal"]) == [
        w for w in extra if w.name == "skewed 16k seed2 h16 d64 causal"
    ]


@pytest.mark.parametrize("total", [16384, 32768, 5000])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_skewed_lengths(total: int, seed: int):
    lengths = workloads.skewed_lengths(total, seed)
    assert sum(lengths) == total
    assert lengths == workloads.skewed_lengths(total, seed), "must be the same pack every run"
    # every length but the last is drawn from 64...4096; the last is what is left of the
    # total, so it may be shorter than 64 (never empty, never longer than 4096)
    assert all(64 <= n <= 4096 for n in lengths[:-1])
    assert 1 <= lengths[-1] <= 4096


def test_skewed_workloads_are_skewed():
    for w in workloads.default_workloads():
        if w.name.startswith("skewed"):
            assert w.lengths == workloads.skewed_lengths(sum(w.lengths))
            assert max(w.lengths) >= 8 * min(w.lengths)
            assert max(w.lengths) <= 4096


# --- implementations and the runner's loop ----------------------------------------------------


def test_overhead_workloads_stay_out_of_runs_and_repeat():
    """The GPU probes' packs of short sequences (ci/wait_barrier_probe.py, ci/ncu_peers.py take
    them by name): distinct names none of the bench's, the same seeded lengths every call."""
    extra = workloads.overhead_workloads()
    names = [w.name for w in extra]
    assert len(set(names)) == len(names)
    assert not set(names) & {w.name for w in workloads.default_workloads()}
    assert [w.lengths for w in extra] == [w.lengths for w in workloads.overhead_workloads()]
    rl = next(w for w in extra if w.name.startswith("rl "))
    assert len(rl.lengths) == 64 and min(rl.lengths) >= 32 and max(rl.lengths) <= 2048
    assert len(set(rl.lengths)) > 32  # random lengths, not one repeated


def test_named_workloads_exact_names_in_order_unknown_raises():
    names = ["rl 64x(32..2048) h16 d128 full", "equal 2x8192 h16 d128 causal"]
    assert [w.name for w in workloads.named_workloads(names)] == names
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.named_workloads(["equal 2x8192"])  # a substring is not a name


def test_build_impls_peers_per_pack(monkeypatch):
    """SDPA only on equal packs; a setup failure becomes an error message, not an exception."""

    def fake(*args, **kwargs) -> Impl:
        return Impl(lambda q, k, v: q, lambda x: x)

    def broken(*args, **kwargs) -> Impl:
        raise RuntimeError("no flex here")

    monkeypatch.setattr(peers, "_portattn", fake)
    monkeypatch.setattr(peers, "_sdpa", fake)
    monkeypatch.setattr(peers, "_flex", broken)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    equal = peers.build_impls(Workload("e", (8, 8), 2, 2, 64, False), cu)
    assert list(equal) == [VARLEN, FIXED, CUDNN, FLASH, FLEX, TORCH_VARLEN]
    assert equal[FLEX] == "RuntimeError: no flex here"
    assert "needs CUDA tensors" in equal[TORCH_VARLEN]  # cu is on the CPU
    skewed = peers.build_impls(Workload("s", (4, 12), 2, 2, 64, False), cu)
    assert list(skewed) == [VARLEN, FIXED, FLEX, TORCH_VARLEN]


def test_torch_varlen_options_follow_its_signature():
    """torch's varlen_attn gets causal through window_size (-1, 0), else is_causal, and GQA
    through enable_gqa; a torch without what a workload needs is an error for that peer."""
    causal_gqa = Workload("g", (8, 8), 4, 2, 64, causal=True)
    full = Workload("f", (8, 8), 2, 2, 64, causal=False)
    new = ("window_size", "enable_gqa")
    assert peers.torch_varlen_options(causal_gqa, new) == dict(enable_gqa=True, window_size=(-1, 0))
    assert peers.torch_varlen_options(full, new) == {}
    old = Workload("c", (8, 8), 2, 2, 64, causal=True)
    assert peers.torch_varlen_options(old, ("is_causal",)) == dict(is_causal=True)
    with pytest.raises(NotImplementedError, match="no enable_gqa"):
        peers.torch_varlen_options(causal_gqa, ("window_size",))
    with pytest.raises(NotImplementedError, match="causal"):
        peers.torch_varlen_options(old, ())


def test_build_impls_fa4_where_it_imports_and_the_impls_filter(monkeypatch):
    """FlashAttention-4's two modes are peers only where it imports; ``--impls`` keeps the
    implementations whose name contains one of its substrings."""
    made = []

    def fake(w, cu, *args, **kwargs) -> Impl:
        made.append(kwargs.get("deterministic"))
        return Impl(lambda q, k, v: q, lambda x: x)

    for name in ("_portattn", "_sdpa", "_flex", "_fa4", "_torch_varlen"):
        monkeypatch.setattr(peers, name, fake)
    cu = torch.tensor([0, 4, 16], dtype=torch.int32)
    skewed = Workload("s", (4, 12), 2, 2, 64, False)
    monkeypatch.setattr(peers, "fa4_available", lambda: False)
    assert FA4_DET not in peers.build_impls(skewed, cu)
    monkeypatch.setattr(peers, "fa4_available", lambda: True)
    assert list(peers.build_impls(skewed, cu)) == [VARLEN, FIXED, FA4_DET, FA4, FLEX, TORCH_VARLEN]
    # deterministic=True, then FA4's default (then Flex and torch's varlen_attn)
    assert made[-4:-2] == [True, False]
    only = peers.build_impls(skewed, cu, only=["PORTATTN v", "fa4 det"])
    assert list(only) == [VARLEN, FA4_DET]


def test_run_workload_alternates_and_records_failures(monkeypatch):
    w = Workload("tiny", (3, 5), 2, 2, 4, causal=False)
    q, k, v = (torch.randn(8, 2, 4) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)

    def add(q, k, v):  # differentiable in q, k and v
        return q + k * v

    def first_call_fails(q, k, v):
        raise ValueError("unsupported head dim")

    impls = {
        VARLEN: Impl(add, lambda x: x),
        "broken at setup": "RuntimeError: could not build",
        "broken at first call": Impl(first_call_fails, lambda x: x),
        FLEX: Impl(add, lambda x: x),
    }
    names = {id(impls[VARLEN]): VARLEN, id(impls[FLEX]): FLEX}
    step_names: dict[int, str] = {}  # id of each step -> its implementation
    real_make_step = bench.make_step

    def named_make_step(impl, mode, *args):
        step = real_make_step(impl, mode, *args)
        step_names[id(step)] = names.get(id(impl), "?")
        return step

    monkeypatch.setattr(bench, "make_step", named_make_step)
    order: list[str] = []
    ms_of = {VARLEN: 2.0, FLEX: 4.0}

    def timer(step):
        step()  # the step must run: the forward, or the forward and the backward
        name = step_names[id(step)]
        order.append(name)
        return ms_of[name], 1.5, 1.0

    logs: list[str] = []
    heated: list[list[str]] = []
    monkeypatch.setattr(
        bench, "heat", lambda steps, s: heated.append([step_names[id(x)] for x in steps])
    )
    rows, compile_s = bench.run_workload(w, impls, (q, k, v, cu), timer, log=logs.append)

    # per mode: every implementation heated, then two passes, the second in reverse order
    assert heated == [[VARLEN, FLEX]] * 2
    assert order == [VARLEN, FLEX, FLEX, VARLEN] * 2
    assert [r["position"] for r in rows if r["ms"] is not None][:4] == [0, 1, 0, 1]
    assert set(compile_s) == {"fwd", "fwd+bwd"} and all(s >= 0 for s in compile_s.values())
    timed = [r for r in rows if r["ms"] is not None]
    assert len(timed) == 8
    for r in timed:
        assert r["ms"] == ms_of[r["impl"]]
        assert r["tflops"] == pytest.approx(w.flops(r["mode"]) / r["ms"] / 1e9)
        assert r["error"] is None and r["pass"] in (0, 1)
        assert (r["peak_gib"], r["resident_gib"]) == (1.5, 1.0)
    failed = [r for r in rows if r["ms"] is None]
    assert sorted((r["impl"], r["mode"]) for r in failed) == sorted(
        (name, mode)
        for name in ("broken at setup", "broken at first call")
        for mode in ("fwd", "fwd+bwd")
    )
    messages = {r["impl"]: r["error"] for r in failed}
    assert messages["broken at setup"] == "RuntimeError: could not build"
    assert messages["broken at first call"] == "ValueError: unsupported head dim"
    assert any("FAILED" in line for line in logs)


@pytest.mark.parametrize(
    "passes, orders",
    [
        (1, ["abcd"]),
        (2, ["abcd", "dcba"]),
        (3, ["abcd", "dcba", "cdab"]),
        (4, ["abcd", "dcba", "cdab", "badc"]),
    ],
)
def test_pass_order_puts_each_implementation_early_and_late(passes, orders):
    names = list("abcd")
    got = ["".join(timing.pass_order(names, p, passes)) for p in range(passes)]
    assert got == orders
    if passes == 4:  # each name first once and last once over the four passes
        assert sorted(o[0] for o in got) == names and sorted(o[-1] for o in got) == names


def test_heat_calls_every_step_until_its_time_is_up(monkeypatch):
    # The round robin alone: on a GPU machine each round also waits for the GPU, and the first
    # wait (the process's CUDA start) outlasted the 0.05 s (session 47's H100 run).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls: list[str] = []

    def failing():
        calls.append("f")
        raise RuntimeError("out of memory")  # a failing step neither stops the heat nor raises

    timing.heat([lambda: calls.append("a"), failing], 0.05)
    assert calls[:2] == ["a", "f"] and len(calls) > 2 and len(calls) % 2 == 0
    calls.clear()
    timing.heat([lambda: calls.append("a")], 0.0)
    assert calls == []


def test_passes_must_be_positive(capsys):
    assert bench.main(["--passes", "0", "--list"]) == 2
    assert "--passes must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--decode", "--passes", "3", "--list"])


def test_run_hands_over_the_rows_after_each_workload(monkeypatch):
    """A run cut short by a time limit keeps its JSON: ``after_workload`` sees each workload's
    rows as soon as they are measured."""
    packs = [Workload(name, (4,), 1, 1, 4, causal=True) for name in ("first", "second")]
    monkeypatch.setattr(bench, "make_inputs", lambda w: (None, None, None, None))
    monkeypatch.setattr(bench, "build_impls", lambda w, cu, only: {})
    monkeypatch.setattr(
        bench, "run_workload", lambda w, impls, inputs, **kw: ([{"workload": w.name}], {})
    )
    seen: list[list[str]] = []
    data = bench.run(packs, after_workload=lambda d: seen.append(
        [r["workload"] for r in d["rows"]]
    ))  # fmt: skip
    assert seen == [["first"], ["first", "second"]]
    assert [r["workload"] for r in data["rows"]] == ["first", "second"]


def test_timer_failure_is_recorded():
    w = Workload("tiny", (4,), 1, 1, 4, causal=True)
    q, k, v = (torch.randn(4, 1, 4) for _ in range(3))

    def timer(step):
        raise torch.cuda.OutOfMemoryError("out of memory")

    impls = {VARLEN: Impl(lambda q, k, v: q * k * v, lambda x: x)}
    rows, _ = bench.run_workload(w, impls, (q, k, v, None), timer, log=lambda s: None, heat_s=0.0)
    assert len(rows) == 4 and all(r["ms"] is None for r in rows)
    assert all("OutOfMemoryError: out of memory" in r["error"] for r in rows)
    assert sorted(r["pass"] for r in rows) == [0, 0, 1, 1]


def test_attempt_keeps_warnings_in_the_message():
    import warnings

    def sdpa_like():
        warnings.warn("Flash attention requires q, k, v to have the same head dim", stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    result, error = timing.attempt(sdpa_like)
    assert result is None
    assert error.startswith("RuntimeError: No available kernel")
    assert "same head dim" in error
    assert timing.attempt(lambda x: x + 1, 1) == (2, None)


# --- command line -----------------------------------------------------------------------------


def test_cli_without_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def must_not_run(*args, **kwargs):
        raise AssertionError("bench must not start without a GPU")

    monkeypatch.setattr(bench, "run", must_not_run)
    assert bench.main([]) == 2
    err = capsys.readouterr().err
    assert "GPU" in err and "error" in err
    assert "a GPU (CUDA or ROCm)" in err  # not "CUDA GPU": torch.cuda answers for ROCm too


def test_cli_list_and_unknown_workload(capsys):
    assert bench.main(["--quick", "--list"]) == 0
    out = capsys.readouterr().out
    assert "skewed 32k h16 d128 causal" in out and "d64" not in out
    assert bench.main(["--workloads", "nothing like this"]) == 2
    assert "equal 2x8192 h16 d128 full" in capsys.readouterr().err


def test_variant_bench_installs_its_entry(capsys):
    """``ci/variant_bench.py``: the variant's sm90 entry is in the table when bench.py runs
    (here ``--list``), tiles and flags parsed; the table is restored after."""
    from ci import tune_sm90, variant_bench
    from portattn import configs

    assert variant_bench.parse_variant("varlen:64:fwd=192/128/12/3,fwd_ws=1") == (
        "varlen",
        64,
        {"fwd": (192, 128, 12, 3), "fwd_ws": True},
    )
    key = ("sm90", "varlen", 64, torch.bfloat16)
    try:
        assert (
            variant_bench.main(
                [
                    "--variant",
                    "varlen:64:fwd=192/64/12/3,fwd_ws=1",
                    "--",
                    "--list",
                    "--workloads",
                    "d64",
                ]
            )
            == 0
        )
        assert configs.config_table()[key].fwd == configs.Tiles(192, 64, 12, 3)
        assert "skewed 16k h16 d64 causal" in capsys.readouterr().out
    finally:
        tune_sm90.install("varlen", 64, tune_sm90.TABLE[key])
    assert configs.config_table()[key] == tune_sm90.TABLE[key]


def test_metadata_tolerates_missing_git(monkeypatch):
    import subprocess

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    meta = bench.metadata()
    assert meta["git_commit"] is None and meta["git_dirty"] is None
    assert meta["torch"] == torch.__version__ and meta["date"]
    assert meta["do_bench"]["return_mode"] == "median"


# --- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke():
    """The real timer and implementations on a small pack (FlexAttention left out: it compiles
    for tens of seconds)."""
    w = Workload("smoke", (256, 256), 2, 2, 64, causal=True)
    inputs = workloads.make_inputs(w)
    impls = {n: i for n, i in peers.build_impls(w, inputs[3]).items() if n != FLEX}
    rows, _ = bench.run_workload(w, impls, inputs, log=lambda s: None)
    timed = {(r["impl"], r["mode"]) for r in rows if r["ms"] is not None}
    assert {(VARLEN, m) for m in ("fwd", "fwd+bwd")} <= timed
    assert all(math.isfinite(r["tflops"]) and r["peak_gib"] > 0 for r in rows if r["ms"])
