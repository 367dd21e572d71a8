"""``python benchmarks/bench.py``'s reports without a GPU: the best pass per cell, ratios,
the markdown table, JSON (this format and the earlier one), the chart, and the ``plot``
command that remakes them from a JSON file (``tests/test_bench.py``: workloads, runner, CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench, bench_report
from benchmarks.bench_report import CUDNN, FA4_DET, FIXED, FLASH, FLEX, TORCH_VARLEN, VARLEN

# --- reports ----------------------------------------------------------------------------------


def _row(workload, mode, impl, pass_, ms, error=None):
    flops = 1e12
    return {
        "workload": workload,
        "mode": mode,
        "impl": impl,
        "pass": pass_,
        "ms": ms,
        "tflops": None if ms is None else flops / ms / 1e9,
        "peak_gib": None if ms is None else 0.5,
        "resident_gib": None if ms is None else 0.25,
        "error": error,
    }


def _synthetic() -> dict:
    eq, sk = "equal 2x8192 h16 d128 full", "skewed 32k h16 d128 full"
    rows = []
    for mode, scale in (("fwd", 1.0), ("fwd+bwd", 3.0)):
        for pass_, jitter in ((0, 0.1), (1, 0.0)):  # pass 1 is the faster: it must be the one
            rows += [
                _row(eq, mode, VARLEN, pass_, 2.0 * scale + jitter),
                _row(eq, mode, FIXED, pass_, 3.0 * scale + jitter),
                _row(eq, mode, CUDNN, pass_, 1.5 * scale + jitter),
                _row(eq, mode, FLEX, pass_, 2.5 * scale + jitter),
                _row(sk, mode, VARLEN, pass_, 4.0 * scale + jitter),
                _row(sk, mode, FIXED, pass_, 5.0 * scale + jitter),
            ]
        rows.append(_row(eq, mode, FLASH, None, None, error="RuntimeError: No available kernel"))
        rows.append(_row(sk, mode, FLEX, None, None, error="OutOfMemoryError: out of memory"))
    return {
        "device": "NVIDIA H200",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "git_commit": "abc123",
        "date": "2026-01-01T00:00:00+00:00",
        "command": "python -m portattn bench --quick",
        "workloads": [{"name": eq}, {"name": sk}],
        "flex_compile_s": {eq: {"fwd": 12.34, "fwd+bwd": 30.0}},
        "rows": rows,
    }


def test_summary_takes_best_pass_and_ratios():
    table = bench_report.summarize(_synthetic()["rows"])
    cell = table[("equal 2x8192 h16 d128 full", "fwd")]
    assert cell[VARLEN]["ms"] == 2.0 and cell[VARLEN]["pass"] == 1
    assert cell[FLASH]["ms"] is None  # failed in every pass: its failed row stays
    ratios = bench_report.ratios(cell)
    assert ratios["varlen speedup vs Flex"] == pytest.approx(2.5 / 2.0)
    assert ratios["varlen / cuDNN throughput"] == pytest.approx(1.5 / 2.0)
    assert ratios["varlen / flash throughput"] is None  # missing peer: no ratio
    assert ratios["fixed_order / varlen time"] == pytest.approx(3.0 / 2.0)
    # throughput fraction == time ratio: varlen's TFLOP/s over cuDNN's
    assert cell[VARLEN]["tflops"] / cell[CUDNN]["tflops"] == pytest.approx(0.75)
    skewed = bench_report.ratios(table[("skewed 32k h16 d128 full", "fwd+bwd")])
    assert skewed["varlen / cuDNN throughput"] is None
    assert skewed["varlen speedup vs Flex"] is None
    assert skewed["fixed_order / varlen time"] == pytest.approx(15.0 / 12.0)


def test_markdown_table():
    text = bench_report.markdown(_synthetic())
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    header = table[0]
    for column in ("varlen TF/s", "fixed_order TF/s", "cuDNN TF/s", "flash TF/s", "Flex TF/s"):
        assert column in header
    for column, num, _ in bench_report.RATIOS:
        # no FA4 or torch varlen_attn rows: no ratio column of theirs
        assert (column in header) == (num not in (FA4_DET, TORCH_VARLEN))
    eq_fwd = next(line for line in table if line.startswith("| equal 2x8192 h16 d128 full | fwd |"))
    cells = [c.strip() for c in eq_fwd.strip("|").split("|")]
    # workload, mode, 5 x TF/s (1e12 FLOPs / ms), 4 ratios, varlen's spread (2.1 / 2.0 ms)
    assert cells == [
        "equal 2x8192 h16 d128 full",
        "fwd",
        "500",
        "333",
        "667",
        "error",
        "400",
        "1.25x",
        "0.75x",
        "—",
        "1.50x",
        "5.0%",
    ]
    sk = next(line for line in table if line.startswith("| skewed 32k h16 d128 full | fwd+bwd |"))
    cells = [c.strip() for c in sk.strip("|").split("|")]
    assert cells[4:7] == ["—", "—", "error"]  # SDPA not run on a skewed pack; Flex failed
    assert cells[-2:] == ["1.25x", "0.8%"]
    # one row per (workload, mode) in each of the two tables, in workload order
    keys = [tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in table]
    wanted = [
        ("equal 2x8192 h16 d128 full", "fwd"),
        ("equal 2x8192 h16 d128 full", "fwd+bwd"),
        ("skewed 32k h16 d128 full", "fwd"),
        ("skewed 32k h16 d128 full", "fwd+bwd"),
    ]
    assert [k for k in keys if k[1] in ("fwd", "fwd+bwd")] == wanted * 2
    # memory and compile seconds; the failures with their messages; the metadata
    assert "| 12.3 |" in text and "| 30.0 |" in text
    assert "SDPA flash: RuntimeError: No available kernel" in text
    assert "FlexAttention: OutOfMemoryError: out of memory" in text
    assert (
        "NVIDIA H200" in text and "abc123" in text and "`python -m portattn bench --quick`" in text
    )


def test_json_round_trip(tmp_path):
    data = _synthetic()
    path = tmp_path / "bench.json"
    bench_report.write_json(path, data)
    assert bench_report.load_json(path) == data
    assert json.loads(path.read_text())["rows"][0]["workload"] == data["rows"][0]["workload"]


def test_json_of_the_earlier_format(tmp_path):
    """docs/bench-h200.json of the first version: ``pass_``, no ``error``, no metadata."""
    old = {"device": "NVIDIA H200", "rows": [{**_row("w", "fwd", VARLEN, 0, 2.0), "pass_": 0}]}
    del old["rows"][0]["pass"], old["rows"][0]["error"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    data = bench_report.load_json(path)
    assert data["rows"][0]["pass"] == 0 and data["rows"][0]["error"] is None
    assert "| w | fwd | 500 |" in bench_report.markdown(data)


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    bench_report.plot(_synthetic(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    """No dependency brings matplotlib: the error says which extra does, and the extra exists."""
    import re
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib.x -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[bench\]'"):
        bench_report.plot(_synthetic(), tmp_path / "bench.png")
    assert not (tmp_path / "bench.png").exists()
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    assert re.search(r'^bench = \[.*"matplotlib', pyproject.read_text(), re.MULTILINE)


# --- the plot command --------------------------------------------------------------------


def test_cli_plot_from_json(tmp_path, monkeypatch, capsys):
    path, md = tmp_path / "b.json", tmp_path / "b.md"
    bench_report.write_json(path, _synthetic())
    assert bench.main(["plot", "--json", str(path), "--markdown", str(md)]) == 0
    assert md.read_text() == bench_report.markdown(_synthetic())

    def no_matplotlib(data, png):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(bench_report, "plot", no_matplotlib)
    png = tmp_path / "b.png"
    assert bench.main(["plot", "--json", str(path), "--png", str(png)]) == 3
    err = capsys.readouterr().err
    assert "matplotlib" in err and f"--json {path} --png {png}" in err
    assert bench.main(["plot", "--png", str(png)]) == 2  # no --json to read
    missing = str(tmp_path / "missing.json")
    assert bench.main(["plot", "--json", missing, "--png", str(png)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_docs_flag_defaults(tmp_path, monkeypatch):
    """--docs points every output at docs/bench-<card>.* (relative to the working directory):
    without a GPU, plot re-renders the H200's (on a GPU machine too: no GPU is seen here)."""
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    (tmp_path / "docs").mkdir()
    bench_report.write_json(tmp_path / "docs" / "bench-h200.json", _synthetic())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench_report, "plot", lambda data, png: open(png, "wb").close())
    assert bench.main(["plot", "--docs"]) == 0
    assert (tmp_path / "docs" / "bench-h200.md").read_text().startswith("- device: NVIDIA H200")
    assert (tmp_path / "docs" / "bench-h200.png").exists()


@pytest.mark.parametrize(
    ("device", "card"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("AMD Instinct MI300X", "mi300x"),
        ("Some Future Card", "gpu"),
    ],
)
def test_docs_stem_names_the_card(monkeypatch, device, card):
    """--docs on a GPU writes that card's files: an H100 run never overwrites the H200 tables."""
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: device)
    assert bench.docs_stem("docs/bench-decode") == f"docs/bench-decode-{card}"
