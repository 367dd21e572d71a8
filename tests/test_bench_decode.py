"""``python benchmarks/bench.py --decode`` without a GPU: workloads, the byte count, the three
cache layouts and the float32 reference, the runner's loop with fake implementations and timer,
the reports and the command line."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import bench, bench_report
from benchmarks import bench_decode as bd
from benchmarks import decode_workloads as dw
from benchmarks.bench_decode import DecodeImpl
from benchmarks.decode_workloads import DecodeWorkload

# --- workloads --------------------------------------------------------------------------------


def test_default_workloads():
    ws = dw.default_workloads()
    names = [w.name for w in ws]
    assert len(names) == len(set(names)), "names must be unique: reports match rows by name"
    main = [w for w in ws if (w.n_heads_q, w.n_heads_k, w.head_dim) == (32, 8, 128)]
    for q_len in (1, 4, 16):  # decode and both appends at every batch size
        batches = {w.batch for w in main if w.q_len == q_len and max(w.kv_lens) <= 8192}
        assert batches == {1, 8, 64, 256}
    for heads in ((8, 1, 128), (32, 8, 64)):
        rows = [w for w in ws if (w.n_heads_q, w.n_heads_k, w.head_dim) == heads]
        assert {w.batch for w in rows if w.q_len == 1} == {64, 256}
    long = [w for w in ws if max(w.kv_lens) > 8192]
    assert [w.kv_lens for w in long] == [(32768,) * 8, (32768,)]
    assert all(w.q_len == 1 for w in long)
    for w in ws:
        assert w.q_len in (1, 4, 16) and w.head_dim in (64, 128)
        assert w.n_heads_q % w.n_heads_k == 0
        assert w.name.startswith("decode" if w.q_len == 1 else f"append{w.q_len} ")
        assert f"B{w.batch}" in w.name
        if w not in long:
            assert all(512 <= n <= 8192 for n in w.kv_lens)
            assert w.kv_lens == dw.kv_lengths(w.batch), "same B, same lengths, every workload"
    flex = [w.name for w in ws if w.flex]
    assert flex == [w.name for w in main if w.batch >= 64 and max(w.kv_lens) <= 8192]
    assert len(flex) == 6


def test_run_size_is_moderate():
    """About 0.4 s per do_bench: timed implementations (graph replays included) x 2 passes must
    stay near 4 minutes, inside one device call with the compiles."""
    timed = sum((len(bd.IMPLS) - (0 if w.flex else 1)) * 2 for w in dw.default_workloads())
    assert timed * 0.4 < 240


def test_quick_and_filter():
    assert [w.name for w in dw.select_workloads(quick=True)] == [
        "decode B64 gqa32/8 d128",
        "decode B256 gqa32/8 d128",
    ]
    d64 = dw.select_workloads(patterns=["D64"])
    assert d64 and all(w.head_dim == 64 for w in d64)
    assert dw.select_workloads(patterns=["nothing like this"]) == []


def test_kv_lengths_are_seeded():
    a = dw.kv_lengths(256, seed=3)
    torch.manual_seed(123)  # the global generator must not matter
    assert dw.kv_lengths(256, seed=3) == a
    assert dw.kv_lengths(256, seed=4) != a
    assert len(a) == 256 and all(isinstance(n, int) and 512 <= n <= 8192 for n in a)
    assert max(a) - min(a) > 4096, "uniform over 512...8192, not a narrow band"
    assert dw.kv_lengths(8, seed=0, lo=5, hi=5) == (5,) * 8


def test_kv_bytes():
    w = DecodeWorkload("w", (100, 300), 16, 32, 8, 128)
    assert w.kv_bytes() == (100 + 300) * 8 * 128 * 2 * 2
    # neither the query rows nor the query heads count: only the K/V read
    assert DecodeWorkload("w", (100, 300), 1, 8, 8, 128).kv_bytes() == w.kv_bytes()
    assert DecodeWorkload("w", (400,), 1, 32, 8, 64).kv_bytes() == w.kv_bytes() // 2
    assert w.describe()["kv_bytes"] == w.kv_bytes() and w.describe()["batch"] == 2


# --- layouts and reference --------------------------------------------------------------------


def test_paged_layout():
    lens = (70, 128, 1, 200)
    table, slots, n_pages = dw.paged_layout(lens, page_size=64, seed=5)
    assert n_pages == 2 + 2 + 1 + 4
    assert table.dtype == torch.int32 and table.shape == (4, 4)
    used = torch.cat([table[b, : math.ceil(n / 64)] for b, n in enumerate(lens)])
    assert sorted(used.tolist()) == list(range(n_pages)), "every page used exactly once"
    assert used.tolist() != list(range(n_pages)), "pages shuffled"
    assert slots.numel() == sum(lens) and slots.unique().numel() == sum(lens)
    assert int(slots.max()) < n_pages * 64
    again = dw.paged_layout(lens, page_size=64, seed=5)
    assert torch.equal(again[0], table) and torch.equal(again[1], slots)


def _paged_attention(w: DecodeWorkload, inp: dw.DecodeInputs) -> torch.Tensor:
    """Attention read from the paged cache through block_table (SDPA, bottom-right causal)."""
    out = []
    for b, n in enumerate(inp.seqlens.tolist()):
        idx = inp.block_table[b].long()
        k = inp.k_pages[idx].flatten(0, 1)[:n].transpose(0, 1)
        v = inp.v_pages[idx].flatten(0, 1)[:n].transpose(0, 1)
        q = inp.q[b].transpose(0, 1)
        mask = torch.arange(n)[None, :] <= torch.arange(w.q_len)[:, None] + n - w.q_len
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=True
        )
        out.append(o.transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("q_len", [1, 4])
def test_layouts_hold_the_same_keys_and_reference(q_len):
    w = DecodeWorkload("t", (70, 5, 130), q_len, 4, 2, 8)
    inp = dw.make_inputs(w, device="cpu", dtype=torch.float32, seed=1)
    assert inp.q.shape == (3, q_len, 4, 8) and inp.k.shape == (205, 2, 8)
    assert inp.cu_k.tolist() == [0, 70, 75, 205] and inp.seqlens.tolist() == [70, 5, 130]
    assert inp.cu_q.tolist() == [0, q_len, 2 * q_len, 3 * q_len]
    assert all(t.dtype == torch.int32 for t in (inp.cu_q, inp.cu_k, inp.seqlens))
    assert inp.k_dense.shape == (3, 192, 2, 8)
    for b, n in enumerate(w.kv_lens):
        packed = inp.k[inp.cu_k[b] : inp.cu_k[b + 1]]
        assert torch.equal(inp.k_dense[b, :n], packed)
        assert torch.equal(inp.v_dense[b, :n], inp.v[inp.cu_k[b] : inp.cu_k[b + 1]])
    assert (inp.k_dense[1, 5:] != 0).any(), "unused slots are random, not zeros"
    ref = dw.reference_rows(w, inp, [0, 1, 2])
    assert torch.allclose(ref, _paged_attention(w, inp), atol=1e-5)
    assert torch.equal(dw.reference_rows(w, inp, [2]), ref[2 * q_len :])


def test_check_seqs():
    assert dw.check_seqs(1) == [0]
    assert dw.check_seqs(2) == [0, 1]
    assert dw.check_seqs(256) == [0, 1, 128, 255]


# --- implementations and the runner's loop ----------------------------------------------------


def test_build_impls_without_cuda_reports_reasons():
    for w in (
        DecodeWorkload("t", (70, 5), 1, 4, 2, 8),
        DecodeWorkload("t", (9,), 4, 4, 2, 8, True),
    ):
        inp = dw.make_inputs(w, device="cpu", dtype=torch.bfloat16)
        impls = bd.build_impls(w, inp)
        assert tuple(impls) == bd.IMPLS
        for name in (bd.FA4_DET, bd.FA4_DEFAULT, bd.FA4_PAGED, bd.TORCH_VARLEN, bd.TORCH_PAGED):
            assert isinstance(impls[name], str)
            assert "CUDA" in impls[name] or "flash_attn" in impls[name], impls[name]
        flex = impls[bd.FLEX]
        assert isinstance(flex, str)
        assert flex.startswith(bd.SKIPPED) != w.flex, flex
        for name in (bd.PA_VARLEN_PAGED, bd.PA_FIXED_DENSE):  # the API may not exist yet
            impl = impls[name]
            assert isinstance(impl, DecodeImpl) or "flash_attn_with_kvcache" in impl


def _fake_impls(w, inp):
    full = dw.reference_rows(w, inp, list(range(w.batch)))

    def fails():
        raise ValueError("unsupported head dim")

    return {
        "good": DecodeImpl(lambda: full.clone(), lambda o: o),
        "wrong": DecodeImpl(lambda: full + 1.0, lambda o: o),
        "first call fails": DecodeImpl(fails, lambda o: o),
        "setup failed": "ImportError: no module",
        "skipped": bd.SKIPPED + "not here",
    }


def test_run_workload_alternates_and_records_failures():
    w = DecodeWorkload("tiny", (70, 5, 130), 4, 4, 2, 8)
    inp = dw.make_inputs(w, device="cpu", dtype=torch.float32)
    impls = _fake_impls(w, inp)
    order: list[object] = []
    fn_of = {id(impl.fn): name for name, impl in impls.items() if not isinstance(impl, str)}

    def timer(step):
        name = fn_of[id(step)]
        order.append(name)
        ms = {"good": 0.5, "wrong": 0.25}[name] * (1.0 if len(order) <= 2 else 0.8)
        return ms, 1.0, 0.5

    logs: list[str] = []
    rows = bd.run_workload(w, impls, inp, timer, log=logs.append)
    assert order == ["good", "wrong", "wrong", "good"]
    by = {(r["impl"], r["pass"]): r for r in rows}
    assert by[("good", 1)]["ms"] == pytest.approx(0.4)
    assert by[("good", 0)]["tbps"] == pytest.approx(w.kv_bytes() / 0.5 / 1e9)
    assert by[("good", 0)]["max_err"] < 1e-5
    assert by[("wrong", 0)]["max_err"] == pytest.approx(1.0, abs=1e-5)
    assert by[("first call fails", None)]["error"] == "ValueError: unsupported head dim"
    assert by[("setup failed", None)]["ms"] is None
    assert by[("skipped", None)]["error"].startswith(bd.SKIPPED)
    assert not any("skipped" in line for line in logs), "a skip is not logged as a failure"
    best = bd.summarize(rows)["tiny"]
    assert best["good"]["pass"] == 1 and best["wrong"]["ms"] == pytest.approx(0.2)


def test_timer_failure_is_a_row():
    w = DecodeWorkload("tiny", (7,), 1, 2, 2, 4)
    inp = dw.make_inputs(w, device="cpu", dtype=torch.float32)

    def timer(step):
        raise torch.cuda.OutOfMemoryError("out of memory")

    rows = bd.run_workload(w, {"good": _fake_impls(w, inp)["good"]}, inp, timer, log=print)
    assert [r["pass"] for r in rows] == [0, 1]
    assert all(r["ms"] is None and "out of memory" in r["error"] for r in rows)


# --- reports and command line -----------------------------------------------------------------


def _synthetic() -> dict:
    a, b = "decode B64 gqa32/8 d128", "decode B256 gqa32/8 d128"
    rows = []
    for pass_, jitter in ((0, 0.1), (1, 0.0)):
        for name, impl, ms in (
            (a, bd.FA4_DET, 1.0),
            (a, bd.PA_VARLEN_PAGED, 0.8),
            (b, bd.FA4_DET, 4.0),
        ):
            rows.append(
                bd._row(DecodeWorkload(name, (1,), 1, 1, 1, 1), impl, pass_, ms=ms + jitter)
            )
            rows[-1]["tbps"] = 2.0 / rows[-1]["ms"]
    rows.append(
        bd._row(DecodeWorkload(b, (1,), 1, 1, 1, 1), bd.PA_VARLEN_PAGED, None, error="E: x")
    )
    rows.append(bd._row(DecodeWorkload(a, (1,), 1, 1, 1, 1), bd.FLEX, None, error="skipped: y"))
    workloads = [{"name": a}, {"name": b}]
    return dict(device="NVIDIA H200", copy_bw_rw_tbps=4.0, workloads=workloads, rows=rows)


def test_markdown_and_short_table():
    data = _synthetic()
    text = bd.markdown(data)
    assert "copy BW (read+write): 4.00 TB/s" in text
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(f"| decode B64 gqa32/8 d128 | {bd.PA_VARLEN_PAGED} |")
    )
    # best pass 0.8 ms; 2.5 TB/s; / copy BW 0.62; FA4 det time 1.0 / 0.8 = 1.25x
    assert line.split(" | ")[2:6] == ["0.8000", "2.50", "0.62", "1.25x"]
    assert "- portattn varlen paged: E: x — decode B256 gqa32/8 d128" in text
    assert "FlexAttention: skipped: y" in text
    short = bd.short_table(data).splitlines()
    assert short[0].startswith("| workload | portattn varlen paged TB/s | FA4 det TB/s |")
    assert short[2] == "| decode B64 gqa32/8 d128 | 2.50 | 2.00 |"
    assert short[3] == "| decode B256 gqa32/8 d128 | — | 0.50 |"


def test_cli_parse_and_list(capsys):
    args = bench.build_parser().parse_args(["--decode", "--quick", "--list"])
    assert args.decode and args.quick and args.list
    assert bench.build_parser().parse_args([]).decode is False
    assert bench.main(["--decode", "--quick", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in out] == [w.name for w in dw.quick_workloads()]
    assert bench.main(["--decode", "--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(dw.default_workloads())
    assert bench.main(["--decode", "--workloads", "nothing like this"]) == 2


def test_cli_without_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--decode", "--quick"]) == 2
    # a ROCm GPU is a GPU too (torch.cuda answers for both): the message names both
    assert "a GPU (CUDA or ROCm)" in capsys.readouterr().err


def test_cli_plot_renders_markdown(tmp_path):
    path, md = tmp_path / "d.json", tmp_path / "d.md"
    bench_report.write_json(path, _synthetic())
    assert bench.main(["plot", "--decode", "--json", str(path), "--markdown", str(md)]) == 0
    assert md.read_text() == bd.markdown(bench_report.load_json(path))
    assert bench.main(["plot", "--decode", "--json", str(tmp_path / "none.json")]) == 2


# --- the peers' calls, against fakes with the real keyword names ------------------------------

# flash_attn.cute.flash_attn_varlen_func of flash-attn-4 4.0.0b36 (the wheel build.sh fetches)
FA4_PARAMS = ("q", "k", "v", "qv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
    "max_seqlen_k", "min_seqlen_k", "seqused_q", "seqused_k", "gather_kv_indices", "page_table",
    "softmax_scale", "causal", "window_size", "learnable_sink", "softcap", "num_splits",
    "pack_gqa", "deterministic")  # fmt: skip


def _small():
    w = DecodeWorkload("t", (70, 5, 130), 4, 4, 2, 8, True)
    inp = dw.make_inputs(w, device="cpu", dtype=torch.float32)
    return w, inp, dw.reference_rows(w, inp, [0, 1, 2])


def _check(impl: DecodeImpl, ref: torch.Tensor) -> None:
    assert torch.allclose(impl.rows(impl.fn()), ref, atol=1e-5)


def test_fa4_calls(monkeypatch):
    import sys
    import types

    w, inp, ref = _small()
    calls = []

    def fake(*args, **kw):
        named = dict(zip(FA4_PARAMS, args), **kw)
        assert set(named) <= set(FA4_PARAMS), set(named) - set(FA4_PARAMS)
        assert named["causal"] is True and named["max_seqlen_q"] == 4
        assert named["max_seqlen_k"] == 130
        calls.append(named)
        if named.get("page_table") is not None:
            assert named["k"] is inp.k_pages and named["seqused_k"] is inp.seqlens
            assert named["page_table"] is inp.block_table and "cu_seqlens_k" not in named
            return ref.view(3, 4, 4, 8), None
        assert named["q"].shape == (12, 4, 8) and named["k"] is inp.k
        assert named["cu_seqlens_q"] is inp.cu_q and named["cu_seqlens_k"] is inp.cu_k
        return ref.clone(), None

    module = types.ModuleType("flash_attn.cute")
    module.flash_attn_varlen_func = fake
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", module)
    monkeypatch.setattr(bd, "_need_cuda", lambda *a: None)
    impls = bd.build_impls(w, inp)
    for name in (bd.FA4_DET, bd.FA4_DEFAULT, bd.FA4_PAGED):
        _check(impls[name], ref)
    assert [c["deterministic"] for c in calls] == [True, False, True]


def test_torch_varlen_without_gqa_is_unsupported(monkeypatch):
    import torch.nn.attention.varlen as varlen

    def old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
            window_size=(-1, -1)):  # torch 2.11's signature  # fmt: skip
        raise AssertionError("must not be called")

    w, inp, _ = _small()
    monkeypatch.setattr(varlen, "varlen_attn", old)
    monkeypatch.setattr(bd, "_need_cuda", lambda *a: None)
    impls = bd.build_impls(w, inp)
    assert impls[bd.TORCH_VARLEN].endswith("varlen_attn: no enable_gqa")
    assert impls[bd.TORCH_PAGED].endswith("no enable_gqa, seqused_k, block_table")
    assert "unsupported: torch" in impls[bd.TORCH_VARLEN]


def test_torch_varlen_calls(monkeypatch):
    import inspect

    import torch.nn.attention.varlen as varlen

    w, inp, ref = _small()
    real = inspect.signature(varlen.varlen_attn)
    if not {"enable_gqa", "block_table", "seqused_k"} <= set(real.parameters):
        # An older torch (the H200's 2.11): both rows are reported unsupported, with the reason.
        monkeypatch.setattr(bd, "_need_cuda", lambda *a: None)
        impls = bd.build_impls(w, inp)
        for name in (bd.TORCH_VARLEN, bd.TORCH_PAGED):
            assert isinstance(impls[name], str) and "unsupported" in impls[name], impls[name]
        return
    seen = []

    def fake(*args, **kw):
        named = real.bind(*args, **kw).arguments  # the real signature: a wrong keyword raises
        assert named["window_size"] == (-1, 0) and named["enable_gqa"] is True
        assert named["max_q"] == 4 and named["cu_seq_q"] is inp.cu_q
        seen.append("block_table" in named)
        if "block_table" in named:
            assert named["key"] is inp.k_pages and named["seqused_k"] is inp.seqlens
        return ref.clone()

    fake.__signature__ = real  # what the builder inspects for enable_gqa / block_table
    monkeypatch.setattr(varlen, "varlen_attn", fake)
    monkeypatch.setattr(bd, "_need_cuda", lambda *a: None)
    impls = bd.build_impls(w, inp)
    _check(impls[bd.TORCH_VARLEN], ref)
    _check(impls[bd.TORCH_PAGED], ref)
    assert seen == [False, True]


def test_portattn_calls(monkeypatch):
    """The flash-attn 2 kvcache signature, checked by computing from the cache it is given."""
    import portattn

    w, inp, ref = _small()
    kernels = []

    def fake(q, k_cache, v_cache, *, cache_seqlens, block_table=None, causal=False, kernel):
        assert causal and cache_seqlens is inp.seqlens and q is inp.q
        # the cache as given, read back through a block table: dense [B, S_cache, Hkv, D] is
        # a pool of B pages of S_cache keys
        table = torch.arange(3, dtype=torch.int32)[:, None] if block_table is None else block_table
        pages = dw.DecodeInputs(**{**vars(inp), "k_pages": k_cache, "v_pages": v_cache})
        pages.block_table = table
        kernels.append((kernel, block_table is not None))
        out = _paged_attention(w, pages)
        return out.view(3, 4, 4, 8)

    monkeypatch.setattr(portattn, "flash_attn_with_kvcache", fake, raising=False)
    impls = bd.build_impls(w, inp)
    for name in (bd.PA_VARLEN_PAGED, bd.PA_VARLEN_DENSE, bd.PA_FIXED_PAGED, bd.PA_FIXED_DENSE):
        _check(impls[name], ref)
    assert kernels == [("varlen", True), ("varlen", False), ("fixed_order", True)] + [
        ("fixed_order", False)
    ]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_mask_on_cpu(monkeypatch):
    """FlexAttention's document + bottom-right causal mask, eager on the CPU."""
    w, inp, ref = _small()
    monkeypatch.setattr(bd, "_need_cuda", lambda *a: None)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    _check(bd._flex(w, inp), ref)
